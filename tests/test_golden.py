"""The golden matrix as tests, plus the golden store's guarantees (atomic writes, schema checks)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardscope.errors import PlanError, ShardscopeError
from shardscope.golden.cases import GoldenCase, load_manifest
from shardscope.golden.store import golden_path, load_golden, orphan_goldens
from shardscope.plan import plan_to_json

# The quick lane (`-m "not slow"`) leaves these out: every golden case compiled, the TPU ones too.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"
CASES = load_manifest(GOLDEN)


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_golden_case(case: GoldenCase, plan_for_golden_case, shardscope_golden):
    plan = plan_for_golden_case(case)
    shardscope_golden.check_plan(plan, golden_path(GOLDEN, case))
    # Causes explain, they are no part of a diff's verdict; the goldens hold them, so they must be the
    # plan's too (but for model line numbers, which any edit of the model shifts).
    if not shardscope_golden.update:

        def causes(rows):
            return [dataclasses.replace(r.cause, line=None) if r.cause else None for r in rows]

        golden = load_golden(golden_path(GOLDEN, case))
        assert causes(plan.collectives) == causes(golden.collectives)
        # Nor is the work profile, but it prices the golden's estimate, which a diff against the golden
        # shows: a golden keeps the profile this code reads from its compile, so that a change to how a
        # step is priced regenerates the goldens, and says so, instead of showing up as a phantom change in
        # every review's time.
        assert plan.work == golden.work


def test_no_orphaned_goldens():
    assert orphan_goldens(GOLDEN, CASES) == ()


def test_matrix_covers_every_tiny_model_and_builtin_preset():
    from shardscope.case.presets import builtin_preset_names

    covered = {(c.model, c.preset) for c in CASES if c.topology == "cpu-8"}
    for model in ("deepseek-tiny", "mixtral-tiny"):
        for preset in builtin_preset_names():
            assert (model, preset) in covered


def test_newer_schema_and_corrupt_goldens_are_clear_errors(tmp_path):
    plan = load_golden(golden_path(GOLDEN, CASES[0]))
    newer = tmp_path / "newer.json"
    newer.write_text(plan_to_json(plan).replace('"shardscope.plan/1"', '"shardscope.plan/2"'))
    with pytest.raises(PlanError, match="newer than this shardscope reads"):
        load_golden(newer)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(plan_to_json(plan)[:5000])
    with pytest.raises(PlanError, match="corrupt plan"):
        load_golden(corrupt)
    with pytest.raises(PlanError, match=r"golden file .* does not exist"):
        load_golden(tmp_path / "absent.json")


def test_manifest_errors(tmp_path):
    (tmp_path / "cases.yaml").write_text("cases:\n  - {model: deepseek-tiny, preset: default, mseh: x}\n")
    with pytest.raises(ShardscopeError, match="did you mean 'mesh'"):
        load_manifest(tmp_path)
    with pytest.raises(ShardscopeError, match=r"no cases\.yaml"):
        load_manifest(tmp_path / "nowhere")


KILL_SCRIPT = """
import sys
from pathlib import Path
from shardscope.golden.store import load_golden, write_golden
import shardscope.atomic as atomic

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
plan = load_golden(src)
real_fdopen = atomic.os.fdopen

class SlowFile:
    # Writes in small chunks with pauses, so the parent can kill the process mid-write.
    def __init__(self, handle):
        self.handle = handle
    def write(self, text):
        for start in range(0, len(text), 4096):
            self.handle.write(text[start:start + 4096])
            self.handle.flush()
            print("chunk", flush=True)
    def __getattr__(self, name):
        return getattr(self.handle, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

atomic.os.fdopen = lambda *a, **k: SlowFile(real_fdopen(*a, **k))
write_golden(dst, plan)
"""


def test_killed_update_leaves_old_or_new_golden(tmp_path):
    old_case, new_case = CASES[0], CASES[1]
    target = tmp_path / "golden.json"
    shutil.copy(golden_path(GOLDEN, old_case), target)
    old_text = target.read_text()
    new_text = golden_path(GOLDEN, new_case).read_text()
    assert old_text != new_text
    script = tmp_path / "writer.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(golden_path(GOLDEN, new_case)), str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.stdout is not None
    # Kill it after the first few chunks are on disk, in the middle of the write.
    for _ in range(3):
        assert proc.stdout.readline().startswith("chunk")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert target.read_text() == old_text  # never half of the new one
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".golden.json.")]
    assert leftovers  # the partial temp file is what was killed, not the golden
    # And an uninterrupted write lands the new text whole.
    for leftover in leftovers:
        leftover.unlink()
    quiet_script = KILL_SCRIPT.replace('print("chunk", flush=True)', "pass")
    source = str(golden_path(GOLDEN, new_case))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", quiet_script, source, str(target)], check=True, env=env)
    assert target.read_text() == new_text


def test_changing_one_rule_fails_check_with_exactly_what_it_moved(tmp_path):
    from typer.testing import CliRunner

    from shardscope.case.presets import PRESET_DIR
    from shardscope.cli import app
    from shardscope.diff import diff_plans

    rules = tmp_path / "rules.yaml"
    shutil.copy(PRESET_DIR / "ep-as-cp.yaml", rules)
    (tmp_path / "cases.yaml").write_text("cases:\n  - {model: mixtral-tiny, preset: rules.yaml, name: rules}\n")
    runner = CliRunner()
    created = runner.invoke(app, ["update", "--golden", str(tmp_path), "-j", "1"])
    assert created.exit_code == 0, created.output
    assert runner.invoke(app, ["check", "--golden", str(tmp_path), "-j", "1"]).exit_code == 0

    old_rule = "['activation_length_attn', ['expert']],"
    assert old_rule in rules.read_text()
    rules.write_text(rules.read_text().replace(old_rule, "['activation_length_attn', []],"))
    report = tmp_path / "report.md"
    result = runner.invoke(app, ["check", "--golden", str(tmp_path), "-j", "1", "--markdown", str(report)])
    assert result.exit_code == 1, result.output
    assert "1 case: 1 changed" in result.stdout
    assert f"to accept the changes: shardscope update --golden {tmp_path} mixtral-tiny/cpu-8/rules" in result.stdout

    golden_file = tmp_path / "mixtral-tiny" / "cpu-8" / "rules.json"
    old = load_golden(golden_file)
    # Independently of the diff: the tensors this rule placed are those naming activation_length_attn.
    expected = {
        path
        for path, tensor in old.tensors
        if tensor.logical
        and "activation_length_attn" in tensor.logical
        and tensor.spec[tensor.logical.index("activation_length_attn")] == "expert"
    }
    assert expected
    from shardscope.case import resolve_case
    from shardscope.golden.pipeline import plan_case

    diff = diff_plans(old, plan_case(resolve_case("mixtral-tiny", str(rules))))
    changed = {c.subject for c in diff.changes if c.kind.startswith("tensor") or c.kind == "spec_changed"}
    assert changed == expected
    for change in diff.of_kind("spec_changed"):
        (dim,) = change.dims
        assert (dim.logical, dim.axes_dropped, dim.axes_added) == ("activation_length_attn", ("expert",), ())
    moved = diff.of_kind("collective_added", "collective_removed", "collective_changed")
    assert moved, "gathering the queries' sequence must show up as collectives"
    rows = [change.after or change.before for change in moved]
    # The attention's traffic over `expert` moves (the compiler also regroups other sums around it).
    assert any(row.axes == ("expert",) and "self_attention" in row.source for row in rows), rows
    assert "activations/decoder/layers/self\\_attention/query" in report.read_text()


def test_check_without_libtpu_checks_the_rest_and_names_skipped_tpu_cases(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import shardscope.golden.check
    from shardscope.cli import app

    for case in ("cpu-8/default.json", "tpu7x-8/ep-as-cp.json"):
        (tmp_path / "deepseek-tiny" / case).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(GOLDEN / "deepseek-tiny" / case, tmp_path / "deepseek-tiny" / case)
    (tmp_path / "cases.yaml").write_text(
        "cases:\n"
        "  - {model: deepseek-tiny, preset: default}\n"
        "  - {model: deepseek-tiny, preset: ep-as-cp, topology: tpu7x-8}\n"
    )
    monkeypatch.setattr(shardscope.golden.check, "libtpu_version", lambda: None)
    runner = CliRunner()
    report = tmp_path / "check.md"
    result = runner.invoke(app, ["check", "--golden", str(tmp_path), "-j", "1", "--markdown", str(report)])
    assert result.exit_code == 0, result.output
    assert "deepseek-tiny/tpu7x-8/ep-as-cp" in result.stdout
    assert "2 cases: 1 same, 1 skipped" in result.stdout
    assert "pip install 'shardscope[tpu]'" in result.stdout
    summary = report.read_text().splitlines()
    assert summary[0] == "## shardscope check: 2 cases: 1 same, 1 skipped"
    assert any(line.startswith("| deepseek-tiny/tpu7x-8/ep-as-cp | skipped |") for line in summary)
    # A CI that must check every case says so.
    strict = runner.invoke(app, ["check", "--golden", str(tmp_path), "-j", "1", "--require-all"])
    assert strict.exit_code == 1, strict.output
