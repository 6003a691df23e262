"""`verify maxtext:MODEL`: MaxText's own train step (the installed `maxtext`, or an edited copy of it) run for real
under two shardings, and compared. Needs Python 3.12 with `shardscope[maxtext]`, as tests/test_maxtext_program.py.

The model is a Qwen3 MoE (MaxText's qwen3-30b-a3b) at a size the host runs in seconds: two layers, four experts,
widths of 32, sixteen tokens, a vocabulary of 256, in float32 (see docs/how-to/verify.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import yaml
from typer.testing import CliRunner

if sys.version_info < (3, 12):
    pytest.skip("maxtext: models need Python 3.12 or newer (MaxText's floor)", allow_module_level=True)

import maxtext  # on 3.12 the route's tests need MaxText: installed by `scripts/test.sh`

from shardscope.case.maxtext_model import resolve_maxtext_model
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import get_topology
from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.verify.maxtext import ONE_DEVICE_KEYS, against_case, one_device_case

# The quick lane (`-m "not slow"`) leaves these out: MaxText's own programs compiled and run.
pytestmark = pytest.mark.slow

jax.devices()  # the session's pool of 8 fake CPU devices (conftest), before anything sizes it otherwise

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "how-to" / "verify.md"
MODEL = "maxtext:qwen3-30b-a3b"
# The guide's reduced Qwen3 MoE on fsdp=4 × tensor=2, which splits the MoE's output over the tensor axis.
SHARDED = "ici_fsdp_parallelism=4 ici_tensor_parallelism=2"

runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, list(args))


def guide_commands() -> list[str]:
    """The `verify maxtext:` commands of the verify guide, as a user copies them."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("shardscope verify maxtext:")]


def small_command_line() -> str:
    """The guide's MaxText command line (its first command's `--maxtext`)."""
    words = shlex.split(guide_commands()[0])
    return words[words.index("--maxtext") + 1]


def test_the_guide_verifies_against_one_device_and_against_another_sharding():
    """The guide's commands, as written: MaxText's step on fsdp=4 × tensor=2 trains as it does on one device and
    as on fsdp=8; every loss, gradient, parameter and AdamW moment of both steps is compared."""
    commands = guide_commands()
    assert len(commands) == 2 and SHARDED in commands[0]
    reports = []
    for command in commands:
        result = cli(*shlex.split(command)[1:], "--json")
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
    one_device, other = reports
    assert (one_device["side"], one_device["against"]) == ("fsdp=4,tensor=2", "one device")
    assert (other["side"], other["against"]) == ("fsdp=4,tensor=2", "fsdp=8")
    for report in reports:
        assert report["same"] and report["steps"] == 2 and report["divergences"] == []
        assert [loss["step"] for loss in report["losses"]] == [1, 2]
        for loss in report["losses"]:
            assert loss["loss"] == pytest.approx(loss["reference"], rel=1e-5)
        assert report["losses"][1]["loss"] < report["losses"][0]["loss"], "the step trains: its loss falls"
        # Each of the two steps compares the loss, and per weight its gradient, value and two moments.
        assert report["checked"] > 2 * (1 + 4 * 15)
        assert report["closest"]["ratio"] < 1


def test_a_tensor_parallel_moe_that_does_not_sum_its_partial_outputs_is_caught(tmp_path):
    """MaxText's MoE on a tensor axis sums each device's partial expert outputs (`psum_scatter` over `tensor` in
    layers/moe.py). A copy of MaxText whose MoE takes its own slice instead compiles, runs and trains, and only
    tensor parallelism shows it: verify against one device exits 1 with the gradients that went wrong."""
    edited = tmp_path / "maxtext"
    shutil.copytree(
        Path(maxtext.__file__).parent,
        edited / "src" / "maxtext",
        ignore=shutil.ignore_patterns("assets", "__pycache__"),
    )
    moe = edited / "src" / "maxtext" / "layers" / "moe.py"
    summed = (
        "        intermediate_output = jax.lax.psum_scatter(\n"
        "            intermediate_output,\n"
        "            self._tensor_parallelism_name,\n"
        "            scatter_dimension=1,\n"
        "            tiled=True,\n"
        "        )\n"
    )
    sliced = (
        "        width = intermediate_output.shape[1] // self.get_tensor_parallelism_size()\n"
        "        intermediate_output = jax.lax.dynamic_slice_in_dim(\n"
        "            intermediate_output, jax.lax.axis_index(self._tensor_parallelism_name) * width, width, axis=1\n"
        "        )\n"
    )
    source = moe.read_text()
    assert source.count(summed) == 1
    moe.write_text(source.replace(summed, sliced))
    # One process imports one MaxText tree: the edited one runs in a process of its own.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "shardscope.cli", "verify", MODEL, "--maxtext-path", str(edited)]
    command += ["--maxtext", small_command_line(), "--json"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 1, f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert not report["same"] and report["against"] == "one device"
    first = report["losses"][0]
    assert abs(first["loss"] - first["reference"]) > 1e-4
    diverged = {d["check"]["tensor"]: d for d in report["divergences"]}
    assert diverged["loss"]["check"]["step"] == 1
    gradients = [d for d in report["divergences"] if d["check"]["kind"] == "gradient"]
    assert gradients and max(d["check"]["ratio"] for d in gradients) > 100
    # Every weight before the MoE's output learns from it, the MoE's own weights furthest off.
    worst = max(gradients, key=lambda d: d["check"]["ratio"])
    assert "/moe_block/" in worst["check"]["tensor"], worst["check"]
    sides = {p["side"] for d in gradients for p in d["placements"]}
    assert sides == {"fsdp=4,tensor=2", "one device"}


def test_one_device_is_the_same_command_line_with_every_ici_axis_1_and_the_same_global_batch():
    case = resolve_maxtext_model(MODEL, get_topology("cpu-8"), parse_maxtext_args(f"per_device_batch_size=2 {SHARDED}"))
    config = type("Config", (), {"per_device_batch_size": 2.0})()
    single = dict(one_device_case(case, config).args)
    assert single["per_device_batch_size"] == "16"
    assert single["ici_fsdp_parallelism"] == single["ici_tensor_parallelism"] == single["ici_expert_parallelism"] == "1"
    assert all(single[key] == value for key, value in ONE_DEVICE_KEYS)
    assert one_device_case(case, config).topology.num_devices == 1
    other = dict(against_case(case, "ici_fsdp_parallelism=8 ici_tensor_parallelism=1").args)
    assert (other["ici_fsdp_parallelism"], other["ici_tensor_parallelism"], other["per_device_batch_size"]) == (
        "8",
        "1",
        "2",
    )
    with pytest.raises(ShardscopeError, match="both sides run"):
        against_case(case, "model_name=llama2-7b")


# A dense Qwen3 (MaxText's qwen3-0.6b) at the guide's reduced size, for golden cases.
DENSE = (
    "override_model_config=true base_num_decoder_layers=2 base_emb_dim=32 base_mlp_dim=32 base_num_query_heads=4 "
    "base_num_kv_heads=2 head_dim=8 vocab_size=256 max_target_length=16 per_device_batch_size=1 dtype=float32 "
    "warmup_steps_fraction=0 learning_rate=1e-3"
)


def test_check_verifies_a_maxtext_golden_case_against_one_device_and_another_case(tmp_path):
    """A `maxtext:` golden case carrying `verify:` has its steps run by `check` (in a child process on the case's
    own 8 devices), against one device, or against another case's command line."""
    golden = tmp_path / "golden"
    golden.mkdir()
    cases = [
        {"model": "maxtext:qwen3-0.6b", "name": "tp", "maxtext": f"{DENSE} {SHARDED}", "verify": "one-device"},
        {
            "model": "maxtext:qwen3-0.6b",
            "name": "fsdp",
            "maxtext": f"{DENSE} ici_fsdp_parallelism=8 ici_tensor_parallelism=1",
            "verify": "tp",
        },
    ]
    (golden / "cases.yaml").write_text(yaml.safe_dump({"cases": cases}))
    created = cli("update", "--golden", str(golden), "--jobs", "1")
    assert created.exit_code == 0, created.output
    result = cli("check", "--golden", str(golden), "--jobs", "1", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["case"]: row for row in json.loads(result.stdout)["cases"]}
    assert rows["maxtext:qwen3-0.6b/cpu-8/tp"]["status"] == rows["maxtext:qwen3-0.6b/cpu-8/fsdp"]["status"] == "same"
    one_device = rows["maxtext:qwen3-0.6b/cpu-8/tp verify one-device"]
    assert one_device["status"] == "verified", one_device
    assert (one_device["verify"]["side"], one_device["verify"]["against"]) == ("fsdp=4,tensor=2", "one device")
    other = rows["maxtext:qwen3-0.6b/cpu-8/fsdp verify tp"]
    assert other["status"] == "verified", other
    assert (other["verify"]["side"], other["verify"]["against"]) == ("fsdp=8", "fsdp=4,tensor=2")
    assert other["verify"]["steps"] == 2 and other["verify"]["checked"] > 2 * 15


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--against", "ep-as-cp"],
            "--against ep-as-cp: a maxtext: model is verified against one-device or MaxText keys",
        ),
        (["--maxtext", "per_device_batch_size=abc"], "per_device_batch_size"),
        (["--preset", "ep-as-cp"], "--preset does not apply"),
        (["--topology", "v5p-8"], "verify runs real steps on fake CPU devices"),
        (["--maxtext", "SMALL", "--against", "per_device_batch_size=2"], "different batches"),
    ],
)
def test_wrong_maxtext_input_is_one_line_and_exit_2(args, expected):
    result = cli("verify", MODEL, *(small_command_line() if arg == "SMALL" else arg for arg in args))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output


def test_maxtext_not_importable_names_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "maxtext" else real(name, *a))
    result = cli("verify", MODEL)
    assert result.exit_code == 2 and "pip install 'shardscope[maxtext]'" in result.output
