"""The library's tables, `table`, `compare` and `import-maxtext`. Expected figures are computed here from the
plans' raw JSON (or MaxText's raw dump files), with plain loops, never from the function under test."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.diff import diff_plans
from shardscope.diff.compare import compare_plans
from shardscope.plan import load_plan
from shardscope.tables import traffic_by

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "deepseek-tiny" / "cpu-8"
DUMPS = ROOT / "tests" / "data" / "maxtext" / "sharding_info"
PRESETS = ("default", "ep-as-cp", "shard-exp-on-fsdp", "pure-fsdp", "ep-tp")
runner = CliRunner()


def raw_traffic(path: Path, key: str) -> dict[str, int]:
    """Traffic per `key` ("op", "pass", or "axes" as "a+b") summed from a plan file's collective rows."""
    totals: dict[str, int] = defaultdict(int)
    for row in json.loads(path.read_text())["collectives"]:
        if row["axes"] == [] or row["loop_trips"] is None:
            continue  # single-device groups move nothing; unknown trips are counted apart
        name = "+".join(row["axes"]) if key == "axes" and row["axes"] is not None else row[key]
        if key == "axes" and row["axes"] is None:
            continue
        totals[name] += row["bytes"] * row["count"] * row["loop_trips"]
    return dict(totals)


@pytest.mark.parametrize("key,grouping", [("op", "op"), ("pass", "pass"), ("axes", "axis")])
def test_traffic_by_is_the_group_by_of_the_rows(key, grouping):
    path = GOLDEN / "ep-as-cp.json"
    frame = traffic_by(load_plan(path), [grouping])
    got = dict(zip(frame[frame.columns[0]], frame["traffic"], strict=True))
    assert got == raw_traffic(path, key)
    assert list(frame["traffic"]) == sorted(frame["traffic"], reverse=True)
    assert frame["share"].sum() == pytest.approx(1.0)


def test_table_command_writes_the_same_table_as_csv(tmp_path):
    path = GOLDEN / "default.json"
    out = tmp_path / "t.csv"
    result = runner.invoke(app_(), ["table", str(path), "--by", "op", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    with out.open() as handle:
        rows = {r["op"]: int(r["traffic"]) for r in csv.DictReader(handle)}
    assert rows == raw_traffic(path, "op")


def app_():
    from shardscope.cli import app

    return app


def test_compare_marks_the_lowest_of_every_row():
    plans = [load_plan(GOLDEN / f"{p}.json") for p in PRESETS]
    comparison = compare_plans(plans, list(PRESETS))
    rows = {(r.section, r.label): r for r in comparison.rows}
    totals = [sum(raw_traffic(GOLDEN / f"{p}.json", "op").values()) for p in PRESETS]
    total = rows[("traffic", "total")]
    assert total.values == tuple(float(t) for t in totals)
    assert total.best == tuple(i for i, t in enumerate(totals) if t == min(totals))
    for op in {op for p in PRESETS for op in raw_traffic(GOLDEN / f"{p}.json", "op")}:
        expected = [float(raw_traffic(GOLDEN / f"{p}.json", "op").get(op, 0)) for p in PRESETS]
        assert rows[("traffic per op", op)].values == tuple(expected)
    temp = [json.loads((GOLDEN / f"{p}.json").read_text())["memory"]["temp_bytes"] for p in PRESETS]
    assert rows[("memory (compiler)", "temp")].values == tuple(float(t) for t in temp)


def test_compare_fits_80_columns_and_prices_when_asked(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    args = ["compare", "deepseek-tiny", "-p", "default", "-p", "ep-as-cp", "--hardware", "v5p", "--jobs", "1"]
    result = runner.invoke(app_(), args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.strip().startswith("communication") for line in lines)
    data = json.loads(runner.invoke(app_(), [*args, "--json"]).output)
    assert data["columns"] == ["default", "ep-as-cp"]
    communication = next(r for r in data["rows"] if r["section"] == "estimated time" and r["label"] == "communication")
    values = dict(zip(data["columns"], communication["values"], strict=True))
    assert communication["best"] == [name for name, value in values.items() if value == min(values.values())]
    assert values["default"] != values["ep-as-cp"]  # the two presets' communication differs, so one is marked


def dump_directories() -> list[Path]:
    return sorted(p.parent for p in DUMPS.rglob("named_shardings.json"))


def raw_path(key: str) -> str:
    """MaxText's leaf key → the plan path, spelled out independently: `.params/['params']/['a']/['b']` →
    `params/a/b`, `.opt_state/[0]/.mu/['params']/['a']` → `opt_state/0/mu/a`."""
    parts = [m for m in re.findall(r"\['([^']*)'\]|\[(\d+)\]|\.(\w+)", key)]
    names = [a or b or c for a, b, c in parts]
    out = []
    for index, name in enumerate(names):
        if name == "params" and index > 0 and names[index - 1] in ("params", "mu", "nu"):
            continue  # Flax's `params` collection level
        out.append(name)
    return "/".join(out)


def raw_spec(entry: dict, sizes: dict[str, int]) -> tuple:
    """A raw partition spec with axes of size 1 dropped (a tuple of one axis becomes the axis)."""
    spec = []
    for item in entry["partition_spec"]:
        axes = [item] if isinstance(item, str) else (item or [])
        kept = [a for a in axes if sizes.get(a, 1) > 1]
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return tuple(spec)


@pytest.mark.parametrize("directory", dump_directories(), ids=lambda p: "/".join(p.parts[-4:])[:80])
def test_import_maxtext_reads_every_dump(directory, tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app_(), ["import-maxtext", str(directory), "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    raw = json.loads((directory / "named_shardings.json").read_text())
    leaves = {raw_path(k): v for k, v in raw.items() if k != ".step"}
    state = {path: t for path, t in plan.tensors if t.kind in ("param", "opt_state")}
    assert set(state) == set(leaves)
    sizes = next(iter(raw.values()))["mesh"]["shape"]
    for path, entry in leaves.items():
        assert state[path].shape == tuple(entry["shape"])
        assert state[path].spec == raw_spec(entry, sizes), path
    activations = json.loads((directory / "input_shardings.json").read_text())
    constraints = {key for item in next(iter(activations.values()), []) for key in item}
    assert len([t for _, t in plan.tensors if t.kind == "activation"]) >= len({k.split(":")[0] for k in constraints})


def test_diff_of_two_maxtext_dumps_finds_exactly_the_leaves_that_moved(tmp_path):
    base = DUMPS / "deepseek2-16b" / "tpu7x-8" / "slice_1"
    before = base / "rule_ep-as-cp_ici_fsdp_parallelism=-1_ici_expert_parallelism=2"
    after = base / "rule_shard-exp-on-fsdp_ici_fsdp_parallelism=-1_ici_expert_parallelism=2"
    plans = []
    for name, directory in (("before", before), ("after", after)):
        out = tmp_path / f"{name}.json"
        assert runner.invoke(app_(), ["import-maxtext", str(directory), "-o", str(out)]).exit_code == 0
        plans.append(load_plan(out))
    old = json.loads((before / "named_shardings.json").read_text())
    new = json.loads((after / "named_shardings.json").read_text())
    sizes = next(iter(old.values()))["mesh"]["shape"]
    moved = {raw_path(k) for k in old if k != ".step" and raw_spec(old[k], sizes) != raw_spec(new[k], sizes)}
    assert moved  # shard-exp-on-fsdp moves the routed experts onto fsdp
    diff = diff_plans(*plans)
    changed = {c.subject for c in diff.changes if c.kind == "spec_changed" and not c.subject.startswith("activations/")}
    assert changed == moved
    result = runner.invoke(app_(), ["diff", str(tmp_path / "before.json"), str(tmp_path / "after.json")])
    assert result.exit_code == 1


def test_a_maxtext_directory_missing_a_file_is_one_line(tmp_path):
    directory = tmp_path / "m" / "v5p-16" / "slice_1" / "rule_default"
    directory.mkdir(parents=True)
    (directory / "named_shardings.json").write_text("{}")
    result = runner.invoke(app_(), ["import-maxtext", str(directory), "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "logical_shardings.json" in result.stderr


def test_every_path_argument_takes_a_str(tmp_path, monkeypatch):
    import shardscope
    from shardscope.case.presets import PRESET_DIR, load_preset_file
    from shardscope.report.html import render_html, write_html
    from shardscope.report.markdown import render_markdown, write_markdown

    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text((GOLDEN / "default.json").read_text())
    old = shardscope.load_plan("old.json")
    shardscope.save_plan(old, "again.json")
    assert (tmp_path / "again.json").read_text() == (GOLDEN / "default.json").read_text()
    diff = diff_plans(old, load_plan(str(GOLDEN / "ep-as-cp.json")))
    write_markdown(diff, "diff.md")
    assert (tmp_path / "diff.md").read_text() == render_markdown(diff)
    write_html(diff, "diff.html")
    assert (tmp_path / "diff.html").read_text() == render_html(diff)
    (tmp_path / "rules.yaml").write_text((PRESET_DIR / "ep-as-cp.yaml").read_text())
    assert load_preset_file("rules.yaml") == load_preset_file(tmp_path / "rules.yaml")
    assert load_preset_file("rules.yaml").name == "rules"


def test_a_preset_file_may_be_a_path(tmp_path, monkeypatch):
    import shardscope
    from shardscope.case.presets import PRESET_DIR

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules.yaml").write_text((PRESET_DIR / "ep-as-cp.yaml").read_text())
    by_path = shardscope.plan_case("mixtral-tiny", tmp_path / "rules.yaml", tensors_only=True)
    by_str = shardscope.plan_case("mixtral-tiny", "rules.yaml", tensors_only=True)
    assert by_path.tensors == by_str.tensors
    # One mesh left to search: it compiles in this process.
    advice = shardscope.rank_shardings(
        "mixtral-tiny", presets=[tmp_path / "rules.yaml"], mesh="data=1,stage=1,fsdp=8", jobs=1
    )
    assert [row.candidate.mesh_text for row in advice.ranking] == ["data=1,stage=1,fsdp=8,expert=1"]


UNGUARDED = """import shardscope

print("top-level line", flush=True)
advice = shardscope.rank_shardings("mixtral-tiny", presets=["ep-as-cp"], mesh="data=1,stage=1", jobs=2)
print("ranked", flush=True)
"""


def test_a_script_that_fans_out_at_its_top_level_is_told_to_guard_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    env = dict(os.environ, PYTHONPATH=str(ROOT), SHARDSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    assert "ranked" not in result.stdout
    lines = result.stderr.strip().splitlines()
    guard = '`if __name__ == "__main__":` (or use jobs=1)'
    # The caller: one error naming the script and the guard, not multiprocessing's RuntimeError or a broken pool.
    assert lines[-1] == (
        f"shardscope.errors.ShardscopeError: worker processes ended while starting; each runs {script} again as "
        f"it starts, so a shardscope call with several jobs at its top level must be under {guard}"
    )
    assert "RuntimeError" not in result.stderr and "BrokenProcessPool" not in result.stderr
    # Each worker that ran the script again: one line, no traceback.
    worker_lines = [line for line in lines if line.startswith("shardscope: ")]
    assert worker_lines, result.stderr
    assert set(worker_lines) == {
        f"shardscope: {script} starts shardscope's worker processes at its top level, and each of them runs it "
        f"again as it starts: put that call under {guard}"
    }
    # Python ran the script's top level again in each worker before it got to the call.
    assert result.stdout.count("top-level line") >= 1 + len(worker_lines)
