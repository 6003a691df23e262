"""`maxtext:MODEL` beyond dump: `compare` of variants of MaxText's command line, and the pytest plugin's
`check_case` guarding MaxText's own program as a golden. Needs Python 3.12 with `shardscope[maxtext]`, as
tests/test_maxtext_program.py does."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from typer.testing import CliRunner

if sys.version_info < (3, 12):
    pytest.skip("maxtext: models need Python 3.12 or newer (MaxText's floor)", allow_module_level=True)

import maxtext  # noqa: F401  (on 3.12 the route's tests need MaxText: installed by `scripts/test.sh`)

import shardscope
from shardscope.cli import app
from shardscope.diff.compare import compare_plans
from shardscope.pytest_plugin import GoldenChecker

pytestmark = pytest.mark.slow

# Two of Qwen3-0.6B's layers, short sequences: compiles in seconds on the fake CPU devices.
SMALL = "override_model_config=true base_num_decoder_layers=2 per_device_batch_size=1 max_target_length=128"
TENSOR = "ici_fsdp_parallelism=4 ici_tensor_parallelism=2"
runner = CliRunner()


def test_compare_lays_variants_of_maxtexts_command_line_side_by_side_as_each_plans_alone():
    """Each --preset is keys added to --maxtext (`default`: --maxtext as given); the comparison is the one of
    the two command lines planned one by one, and only the tensor-parallel variant moves bytes over `tensor`."""
    result = runner.invoke(
        app, ["compare", "maxtext:qwen3-0.6b", "--maxtext", SMALL, "-p", "default", "-p", TENSOR, "--json", "-j", "1"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    alone = [shardscope.plan_case("maxtext:qwen3-0.6b", maxtext=f"{SMALL} {extra}".strip()) for extra in ("", TENSOR)]
    assert shown == compare_plans(alone, ["default", TENSOR]).to_json()
    tensor_row = next(r for r in shown["rows"] if (r["section"], r["label"]) == ("traffic per mesh axis", "tensor"))
    assert tensor_row["values"][0] == 0 and tensor_row["values"][1] > 0


def test_check_case_guards_maxtexts_program_and_fails_a_changed_command_line(tmp_path):
    golden = tmp_path / "qwen3.json"
    GoldenChecker(update=True).check_case("maxtext:qwen3-0.6b", golden, maxtext=SMALL)
    assert json.loads(golden.read_text())["case"]["model"] == "maxtext:qwen3-0.6b"
    GoldenChecker(update=False).check_case("maxtext:qwen3-0.6b", golden, maxtext=SMALL)
    with pytest.raises(pytest.fail.Exception, match="plan differs from golden"):
        GoldenChecker(update=False).check_case("maxtext:qwen3-0.6b", golden, maxtext=f"{SMALL} {TENSOR}")
    with pytest.raises(pytest.fail.Exception, match="configured by MaxText's command line alone"):
        GoldenChecker(update=False).check_case("maxtext:qwen3-0.6b", golden, preset="ep-as-cp")


def test_advise_compiles_every_ici_size_of_maxtexts_program_and_each_ranked_command_remakes_its_plan(tmp_path):
    """Four devices, tensor parallelism held at 1 by the command line: a dense model's search is the three ways
    to split them over data and fsdp (every candidate compiled, ranked by expected step); the `shardscope dump`
    the ranking prints for #1 makes a plan with that expected step."""
    line = f"{SMALL} ici_tensor_parallelism=1"
    result = runner.invoke(app, ["advise", "maxtext:qwen3-0.6b", "-t", "cpu-4", "--maxtext", line, "--json", "-j", "1"])
    assert result.exit_code == 0, result.output
    advice = json.loads(result.output[result.output.index("{") :])
    assert advice["maxtext"] == line and advice["counts"]["enumerated"] == 3 and not advice["failed"]
    rows = advice["ranking"] + advice["over_capacity"]
    assert sorted(r["mesh"] for r in rows) == [
        "data=1,fsdp=4,tensor=1",
        "data=2,fsdp=2,tensor=1",
        "data=4,fsdp=1,tensor=1",
    ]
    ranked = [r["step_expected_s"] for r in advice["ranking"]]
    assert ranked == sorted(ranked)
    best = advice["ranking"][0]
    # Run as users run it, in a process of its own: a cpu-4 program needs a process of 4 devices, and this
    # test process already has its pool.
    command = [*shlex.split(best["command"])[1:], "-o", str(tmp_path / "best.json")]
    made = subprocess.run(
        [sys.executable, "-m", "shardscope.cli", *command], capture_output=True, text=True, check=False
    )
    assert made.returncode == 0, made.stderr
    plan = json.loads((tmp_path / "best.json").read_text())
    assert plan["estimate"]["step"]["expected"] == pytest.approx(best["step_expected_s"], rel=1e-9)
