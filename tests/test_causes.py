"""Why each collective runs: origins traced through the compiled module, causes in plans and goldens checked
against the model's tensors and the preset's rules, `why`, and diffs that link collective changes to rule
changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.case.presets import get_preset
from shardscope.cli import app
from shardscope.diff.changes import MESH
from shardscope.diff.plans import diff_plans
from shardscope.extract.causes import collective_cause, plan_path, project_relative
from shardscope.golden.cases import load_manifest
from shardscope.golden.store import golden_path, load_golden
from shardscope.hlo.collectives import collectives_of
from shardscope.hlo.frames import source_frames
from shardscope.hlo.groups import MeshLayout
from shardscope.hlo.module import read_module
from shardscope.plan.frames import traffic_by
from shardscope.plan.json import load_plan, plan_from_json, plan_to_json
from shardscope.plan.records import TensorRecord

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
SAMPLES = Path(__file__).parent / "hlo_samples"
GOLDEN = ROOT / "golden"
CASES = load_manifest(GOLDEN)
runner = CliRunner()


def _traced(path: Path, mesh: MeshLayout | None = None):
    return collectives_of(read_module(path.read_text()), mesh, trace=True).collectives


# --- the compiled module: what a collective moves, the op that needs it, its line -------------------------


def test_a_weight_gathered_in_a_loop_is_traced_to_the_step_argument():
    # all-gather(fusion(transpose)) ← reshape ← dynamic-slice ← get-tuple-element(loop parameter) ← the
    # loop's operand tuple ← the entry parameter `state['params']['layers']['mlp']['kernel']`.
    rows = _traced(DATA / "origins.hlo", MeshLayout(("data", "fsdp"), (2, 2)))
    gather = next(r for r in rows if r.op == "all-gather")
    assert [(o.kind, o.name) for o in gather.origins] == [("parameter", "state['params']['layers']['mlp']['kernel']")]
    assert gather.axes == ("fsdp",)
    assert gather.consumer == "jit(step)/jvp(M)/while/body/layers/mlp/dot_general"
    # Its stack, innermost first: a library frame (left in where the library is installed in a virtual
    # environment), then the model line that called it; a printed parent id is one more than the parent's.
    assert gather.stack == (
        ("/venv/lib/python3.11/site-packages/flax/core/axes_scan.py", 200),
        ("/src/models/layers.py", 42),
    )
    assert gather.line == gather.stack[0]


def test_a_sum_is_traced_to_the_op_and_the_operands_it_is_computed_from():
    rows = _traced(DATA / "origins.hlo", MeshLayout(("data", "fsdp"), (2, 2)))
    total = next(r for r in rows if r.op == "all-reduce")
    (origin,) = total.origins
    assert (origin.kind, origin.opcode) == ("op", "dot")  # past the convert at the fusion's root
    assert [(i.kind, i.name) for i in origin.inputs] == [
        ("parameter", "batch['x']"),
        ("parameter", "state['params']['layers']['out']['kernel']"),
    ]
    assert total.line is None  # its metadata names no stack frame


def test_weights_of_a_real_flax_step_trace_to_their_parameters():
    # A real jax train step (`nn.scan` over layers, FSDP weights): every forward all-gather of a weight
    # names that weight's argument, in the module the collective reshards for.
    rows = _traced(SAMPLES / "flax_moe_train_step.hlo.txt")
    gathers = [r for r in rows if r.op == "all-gather" and r.pass_ == "forward"]
    assert gathers
    for row in gathers:
        (origin,) = row.origins
        assert origin.kind == "parameter" and origin.name.startswith("params['params']")
        module = row.source.split("/")[-1]
        assert f"['{module}']" in origin.name


def test_untraced_rows_carry_nothing_and_aggregate_as_before():
    module = read_module((SAMPLES / "flax_moe_train_step.hlo.txt").read_text())
    plain, traced = collectives_of(module).collectives, collectives_of(module, trace=True).collectives
    assert plain == traced  # origins never split or merge rows
    assert all(r.origins == () and r.consumer == "" for r in plain)


def test_source_frames_name_file_and_line():
    frames = source_frames((DATA / "origins.hlo").read_text())
    assert frames.line_of('op_name="x" stack_frame_id=1') == ("/src/models/layers.py", 42)
    assert frames.chain_of('op_name="x" stack_frame_id=2')[1] == ("/src/models/layers.py", 42)
    assert frames.line_of('op_name="x" stack_frame_id=9') is None
    assert frames.line_of(None) is None
    assert source_frames("HloModule m\n\nENTRY %e () -> f32[] {\n}\n").frames == {}


@pytest.mark.parametrize(
    ("argument", "path"),
    [
        ("state['params']['decoder']['mlp']['kernel']", "params/decoder/mlp/kernel"),
        ("state['opt_state'][0].mu['decoder']['w']", "opt_state/0/mu/decoder/w"),
        ("batch['tokens']", "inputs/tokens"),
        ("x", ""),
        ("state['params'] junk", ""),
    ],
)
def test_plan_path_of_a_step_argument(argument, path):
    assert plan_path(argument) == path


def test_source_files_are_named_by_import_path():
    assert project_relative(str(ROOT / "reference_models" / "layers.py")) == "reference_models/layers.py"
    assert project_relative("/nowhere/on/this/machine.py") == "/nowhere/on/this/machine.py"


def test_rules_are_the_ones_that_put_the_moved_dimension_on_the_collective_axes():
    rows = _traced(DATA / "origins.hlo", MeshLayout(("data", "fsdp"), (2, 2)))
    tensors = {
        "params/layers/mlp/kernel": TensorRecord(
            "param", (2, 4, 8), "float32", ("layers", "embed", "mlp"), (None, "fsdp", None), (2, 2, 8), 128
        ),
        "params/layers/out/kernel": TensorRecord(
            "param", (8, 4), "float32", ("mlp", None), (("data", "fsdp"), None), (2, 4), 32
        ),
    }
    rules = (("batch", ("data",)), ("embed", ("fsdp",)), ("mlp", ("data", "fsdp")))
    causes = dict(zip((r.op for r in rows), collective_cause(rows, tensors, rules), strict=True))
    gather, total = causes["all-gather"], causes["all-reduce"]
    assert gather is not None and total is not None
    assert gather.tensors == ("params/layers/mlp/kernel",)
    assert [(r.logical, r.axes, r.rule) for r in gather.rules] == [("embed", ("fsdp",), 1)]
    assert gather.line == "/src/models/layers.py:42"  # the model's line, not the library frame inside it
    # The sum over the sharded contraction names the operand sharded on its axes, and its rule.
    assert total.tensors == ("ops/layers/out/dot_general",)
    assert [(r.logical, r.rule, r.tensor) for r in total.rules] == [("mlp", 2, "params/layers/out/kernel")]
    none = collective_cause(rows, tensors, ())
    assert all(c is not None and c.compilers_choice for c in none)


# --- causes in the goldens, against the model's tensors and the preset's rules ----------------------------


def _golden_plans():
    for case in CASES:
        plan = load_golden(golden_path(GOLDEN, case))
        if plan.holds("collectives") and plan.collectives:
            yield case, plan


@pytest.mark.parametrize("case", [c for c, _ in _golden_plans()], ids=lambda c: c.case_id)
def test_golden_causes_name_tensors_and_rules_of_the_plan(case):
    plan = load_golden(golden_path(GOLDEN, case))
    tensors = plan.tensor_map
    rules = get_preset(plan.case.preset).logical_axis_rules
    total = sum(r.traffic or 0 for r in plan.collectives if r.axes != ())
    caused = 0
    for row in plan.collectives:
        cause = row.cause
        assert cause is not None, row
        for tensor in cause.tensors:
            if tensor.startswith("grads/"):
                assert tensors[tensor.removeprefix("grads/")].kind == "param"
            elif not tensor.startswith("ops/"):
                assert tensor in tensors, tensor
        for rule in cause.rules:
            # The rule is the preset's, the tensor it names has that logical dimension, and its spec puts
            # that dimension on one of the collective's axes.
            assert rules[rule.rule][0] == rule.logical
            record = tensors[rule.tensor]
            assert record.logical is not None
            dims = [d for d, name in enumerate(record.logical) if name == rule.logical]
            on = {
                axis
                for d in dims
                for axis in ((record.spec[d],) if isinstance(record.spec[d], str) else record.spec[d] or ())
            }
            assert on & set(row.axes or ()), (row, rule)
        if row.op == "all-gather" and any(t.startswith("params/") for t in cause.tensors):
            # A weight all-gather names a weight sharded over the gathered axes, and the rule that put it there.
            weight = next(t for t in cause.tensors if t.startswith("params/"))
            spec_axes = {a for e in tensors[weight].spec for a in ((e,) if isinstance(e, str) else e or ())}
            assert spec_axes & set(row.axes or ()), row
            assert any(r.tensor == weight for r in cause.rules), row
        if cause.tensors and row.axes != ():
            caused += row.traffic or 0
    assert total == 0 or caused / total >= 0.95


def test_goldens_cover_most_traffic_with_a_rule():
    # Measured, not a threshold of the contract: the share of traffic a rule explains (the rest is the
    # compiler's choice); printed for the validation page's figure.
    ruled = total = 0
    for _, plan in _golden_plans():
        for row in plan.collectives:
            if row.axes == () or row.traffic is None:
                continue
            total += row.traffic
            ruled += row.traffic if row.cause is not None and row.cause.rules else 0
    assert total > 0
    print(f"traffic with a rule: {ruled / total:.1%}")
    assert ruled / total > 0.9


def test_plan_json_round_trips_causes():
    _, plan = next(_golden_plans())
    again = plan_from_json(plan_to_json(plan))
    assert again == plan and any(r.cause is not None and r.cause.rules for r in again.collectives)


def test_collectives_frame_has_the_cause_columns():
    _, plan = next(_golden_plans())
    frame = plan.collectives_frame()
    for column in ("moves", "needed_by", "line", "rules"):
        assert column in frame
    assert frame["moves"].notna().all()
    by_rule = traffic_by(plan, ["rule"])
    assert int(by_rule["traffic"].sum()) == int(frame[frame["moves_data"]]["traffic"].sum())


# --- `why` ---------------------------------------------------------------------------------------------------


def _golden(model: str, preset: str) -> Path:
    return GOLDEN / model / "cpu-8" / f"{preset}.json"


def test_why_answers_with_rule_tensor_and_op():
    path = _golden("deepseek-tiny", "default")
    result = runner.invoke(app, ["why", str(path), "--op", "all-gather", "--axes", "fsdp", "--all"])
    assert result.exit_code == 0, result.output
    plan = load_golden(path)
    rows = [r for r in plan.collectives if r.op == "all-gather" and r.axes == ("fsdp",)]
    assert result.output.count("all-gather over fsdp,") == len(rows)
    first = max(rows, key=lambda r: r.traffic or 0)
    assert first.cause is not None and first.cause.rules
    block = result.output.split("\n\n")[0]
    assert f"{first.cause.rules[0].logical} → " in block and first.cause.consumer in block


def test_why_json_and_source_filter():
    path = _golden("mixtral-tiny", "ep-tp")
    result = runner.invoke(app, ["why", str(path), "--source", "decoder/layers", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert rows and all(r["source"].startswith("decoder/layers") for r in rows)
    traffic = [r["bytes"] * r["count"] * r["loop_trips"] for r in rows]
    assert traffic == sorted(traffic, reverse=True)
    assert all("cause" in r for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--op", "all-gathr"], "did you mean 'all-gather'"),
        (["--axes", "fsdpp"], "did you mean 'fsdp'"),
    ],
)
def test_why_wrong_inputs_are_one_line_errors(args, message):
    result = runner.invoke(app, ["why", str(_golden("deepseek-tiny", "default")), *args])
    assert result.exit_code == 2
    assert message in result.output and result.output.count("\n") == 1


def test_why_on_plans_without_causes_says_so(tmp_path):
    old = json.loads(_golden("deepseek-tiny", "default").read_text())
    for row in old["collectives"]:
        del row["cause"]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(old))
    result = runner.invoke(app, ["why", str(older)])
    assert result.exit_code == 2 and "records no causes" in result.output and result.output.count("\n") == 1
    hlo = runner.invoke(app, ["why", str(DATA / "origins.hlo")])
    assert hlo.exit_code == 2 and "HLO module, not a plan" in hlo.output and hlo.output.count("\n") == 1


# --- diffs that explain themselves ------------------------------------------------------------------------


SEEDS = [(m, p) for m in ("deepseek-tiny", "mixtral-tiny") for p in ("ep-as-cp", "shard-exp-on-fsdp", "ep-tp")]


def _delta(change) -> int:
    def traffic(side):
        return 0 if side is None else side.traffic or 0

    return abs(traffic(change.after) - traffic(change.before))


@pytest.mark.parametrize(("model", "preset"), SEEDS, ids=[f"{m}-{p}" for m, p in SEEDS])
def test_seed_diffs_link_collective_changes_to_rule_changes(model, preset):
    old, new = load_golden(_golden(model, "default")), load_golden(_golden(model, preset))
    diff = diff_plans(old, new)
    collective = [c for c in diff.changes if c.kind.startswith("collective")]
    linked = {s for r in diff.rule_changes for s in r.collectives}
    # Every collective change is in exactly one group: a rule change or the compiler's choices.
    assert sorted(linked | set(diff.compilers_choices)) == sorted(c.subject for c in collective)
    assert not linked & set(diff.compilers_choices)
    assert all(r.logical != MESH for r in diff.rule_changes)  # the seeds keep the mesh
    # Each rule change is a spec change of the diff: some tensor's dimension of that logical axis moved
    # from `before` to `after`.
    moved = {(d.logical, d.before, d.after) for c in diff.changes for d in c.dims}
    for rule in diff.rule_changes:
        assert any(logical == rule.logical for logical, _, _ in moved)
    total = max(diff.totals_before.total or 0, diff.totals_after.total or 0)
    big = [c for c in collective if _delta(c) >= 0.01 * total]
    assert [c.subject for c in big if c.subject not in linked] == []


def test_diff_report_groups_collective_changes_under_rule_changes(tmp_path):
    old, new = _golden("deepseek-tiny", "default"), _golden("deepseek-tiny", "ep-tp")
    md, html = tmp_path / "diff.md", tmp_path / "diff.html"
    result = runner.invoke(app, ["diff", str(old), str(new), "--markdown", str(md), "--html", str(html)])
    assert result.exit_code == 1, result.output
    assert "Why the collectives changed" in result.output
    diff = diff_plans(load_plan(old), load_plan(new))
    top = diff.rule_changes[0]
    assert top.title in result.output
    assert "**Why the collectives changed**" in md.read_text()
    page = html.read_text()
    assert f'rule change <span class="mono">{top.logical}</span>: {top.move}' in page
    assert page.count('title="moves ') == len([c for c in diff.changes if c.kind.startswith("collective")])
