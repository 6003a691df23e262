"""verify in CI: a golden case carrying `verify:` has its numbers checked by `shardscope check`, and the pytest
plugin's `verify_step` fails a test whose program diverges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import load_manifest, verified_against
from shardscope.golden.verifying import verify_command
from shardscope.pytest_plugin import GoldenChecker

runner = CliRunner()
PROGRAMS = Path(__file__).parent / "data" / "verify"


def manifest(root: Path, *cases: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cases.yaml").write_text("cases:\n" + "".join(f"  - {case}\n" for case in cases))
    return root


@pytest.mark.slow
def test_check_verifies_the_cases_that_ask_and_fails_on_a_divergence(tmp_path):
    golden = manifest(
        tmp_path / "golden",
        f"{{step: '{PROGRAMS / 'moe_psum.py'}:make_step', name: moe, verify: one-device}}",
        f"{{step: '{PROGRAMS / 'moe_psum.py'}:make_step_without_psum', name: moe-without-psum, verify: one-device}}",
        "{model: llama-tiny, preset: default, verify: one-device}",
        "{model: llama-tiny, preset: ep-tp}",
    )
    created = runner.invoke(app, ["update", "--golden", str(golden), "--jobs", "1"])
    assert created.exit_code == 0, created.output
    result = runner.invoke(app, ["check", "--golden", str(golden), "--jobs", "1", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    rows = {row["case"]: row for row in data["cases"]}
    # Every plan is its golden; the numbers are a row of their own per verified case.
    assert {rows[c]["status"] for c in rows if " verify " not in c} == {"same"}
    assert rows["moe/cpu-8/step verify one-device"]["status"] == "verified"
    assert rows["llama-tiny/cpu-8/default verify one-device"]["status"] == "verified"
    broken = rows["moe-without-psum/cpu-8/step verify one-device"]
    assert broken["status"] == "diverged" and broken["verify"]["same"] is False
    assert "first outputs/loss" in broken["message"]
    assert "shardscope verify --step" in broken["message"] and "make_step_without_psum" in broken["message"]
    assert "llama-tiny/cpu-8/ep-tp verify" not in " ".join(rows)  # it does not ask
    assert data["failed"] is True and "numerics: 2 verified, 1 diverged" in data["summary"]
    text = runner.invoke(app, ["check", "--golden", str(golden), "--jobs", "1"])
    assert text.exit_code == 1 and "diverged" in text.stdout


def test_a_case_verified_against_another_case(tmp_path):
    golden = manifest(
        tmp_path / "golden",
        "{model: llama-tiny, preset: default}",
        "{model: llama-tiny, preset: pure-fsdp, verify: default}",
    )
    assert runner.invoke(app, ["update", "--golden", str(golden), "--jobs", "1"]).exit_code == 0
    result = runner.invoke(app, ["check", "--golden", str(golden), "--jobs", "1", "--json"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["cases"] if " verify " in r["case"])
    assert row["case"] == "llama-tiny/cpu-8/pure-fsdp verify default" and row["status"] == "verified"
    assert row["verify"]["against"].startswith("default on ")


@pytest.mark.parametrize(
    ("cases", "fragment"),
    [
        (("{model: llama-tiny, preset: default, verify: one_device}",), "did you mean 'one-device'"),
        (("{model: llama-tiny, preset: default, verify: default}",), "against itself"),
        (
            (
                "{model: llama-tiny, preset: default}",
                "{model: mixtral-tiny, preset: ep-tp, verify: llama-tiny/cpu-8/default}",
            ),
            "not a case of mixtral-tiny",
        ),
        (
            ("{model: llama-tiny, preset: default}", "{step: 'x.py:make_step', name: mine, verify: default}"),
            "verifies against one-device only",
        ),
    ],
)
def test_a_verify_that_names_nothing_it_can_compare_with(tmp_path, cases, fragment):
    golden = manifest(tmp_path / "golden", *cases)
    with pytest.raises(ShardscopeError, match=fragment):
        load_manifest(golden)


QWEN = "model: 'maxtext:qwen3-0.6b'"


def test_a_maxtext_case_verifies_against_one_device_or_another_case_of_its_model(tmp_path):
    """MaxText's own program may carry `verify:`: one device, or another case of the same model and topology
    whose command line sets every key this one sets (it is laid over this one's, as `--against` is)."""
    golden = manifest(
        tmp_path / "golden",
        f"{{{QWEN}, name: fsdp, maxtext: 'ici_fsdp_parallelism=8 ici_tensor_parallelism=1', verify: one-device}}",
        f"{{{QWEN}, name: tp, maxtext: 'ici_fsdp_parallelism=4 ici_tensor_parallelism=2', verify: fsdp}}",
    )
    fsdp, tp = load_manifest(golden)
    assert (fsdp.is_maxtext, fsdp.verify, tp.verify) == (True, "one-device", "fsdp")
    assert verified_against(fsdp, (fsdp, tp)) is None
    assert verified_against(tp, (fsdp, tp)) is fsdp
    assert verify_command(tp, fsdp) == (
        "shardscope verify maxtext:qwen3-0.6b --topology cpu-8 --maxtext 'ici_fsdp_parallelism=4 "
        "ici_tensor_parallelism=2' --against 'ici_fsdp_parallelism=8 ici_tensor_parallelism=1'"
    )


@pytest.mark.parametrize(
    ("cases", "fragment"),
    [
        (  # a reference model configured by MaxText's keys runs from its preset only
            ("{model: llama-tiny, maxtext: 'ici_fsdp_parallelism=8', name: mt, verify: one-device}",),
            "not MaxText's",
        ),
        (
            ("{model: llama-tiny, preset: default}", f"{{{QWEN}, verify: llama-tiny/cpu-8/default}}"),
            "not a case of maxtext:qwen3-0.6b",
        ),
        (
            (f"{{{QWEN}}}", "{model: llama-tiny, preset: default, verify: maxtext:qwen3-0.6b/cpu-8/default}"),
            "not a case of llama-tiny",
        ),
        (
            (f"{{{QWEN}}}", "{model: 'maxtext:llama2-7b', verify: maxtext:qwen3-0.6b/cpu-8/default}"),
            "not a case of maxtext:llama2-7b",
        ),
        (
            (f"{{{QWEN}, topology: cpu-4}}", f"{{{QWEN}, name: other, verify: maxtext:qwen3-0.6b/cpu-4/default}}"),
            "on cpu-8",
        ),
        (
            (
                f"{{{QWEN}, name: fsdp, maxtext: 'ici_fsdp_parallelism=8'}}",
                f"{{{QWEN}, name: tp, maxtext: 'ici_tensor_parallelism=8', verify: fsdp}}",
            ),
            "sets no ici_tensor_parallelism",
        ),
        ((f"{{{QWEN}, verify: default}}",), "against itself"),
        ((f"{{{QWEN}, verify: one_device}}",), "did you mean 'one-device'"),
    ],
)
def test_a_maxtext_verify_that_names_nothing_it_can_compare_with(tmp_path, cases, fragment):
    golden = manifest(tmp_path / "golden", *cases)
    with pytest.raises(ShardscopeError, match=fragment):
        load_manifest(golden)
    result = runner.invoke(app, ["check", "--golden", str(golden)])
    assert result.exit_code == 2 and fragment in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_the_plugin_verifies_a_program_of_ones_own():
    checker = GoldenChecker(update=False)
    report = checker.verify_step(f"{PROGRAMS / 'grad_allreduce.py'}:make_step")
    assert report.same and report.against == "one device"
    with pytest.raises(pytest.fail.Exception, match="outputs/grads/w1"):
        checker.verify_step(f"{PROGRAMS / 'grad_allreduce.py'}:make_step_without_grad_allreduce")
