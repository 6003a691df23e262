"""Plan diffs by meaning: hand-built plans for each kind of change, and the real default vs ep-as-cp pair."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shardscope.diff import (
    CHANGE_KINDS,
    DEFAULT_TEMP_TOLERANCE,
    Change,
    DimChange,
    FieldChange,
    changes_from_json,
    diff_plans,
    group_tensor_changes,
    within_tolerance,
)
from shardscope.diff.json import change_to_json
from shardscope.plan import CaseRecord, CollectiveRow, Plan, TensorRecord, plan_from_json, plan_to_json

DATA = Path(__file__).parent / "data"
MESH = (("data", 1), ("stage", 1), ("fsdp", 4), ("expert", 2))
QUERY = "activations/decoder/moe_layers/self_attention/query"


def tensor(spec=(("fsdp", "expert"), None), shape=(8, 64), bytes_per_device=256, **fields) -> TensorRecord:
    """A float32 tensor record; only what a test varies needs naming."""
    values = {
        "kind": "param",
        "shape": shape,
        "dtype": "float32",
        "logical": ("embed", "mlp"),
        "spec": spec,
        "shard_shape": (1, 64),
        "bytes_per_device": bytes_per_device,
    }
    values.update(fields)
    return TensorRecord(**values)


def row(op="all-gather", axes=("fsdp",), count=1, loop_trips=1, nbytes=1024, **fields) -> CollectiveRow:
    """A forward collective row at decoder/mlp."""
    values = {"dtype": "float32", "shape": (8, 32), "pass_": "forward", "source": "decoder/mlp"}
    values.update(fields)
    return CollectiveRow(op=op, axes=axes, bytes=nbytes, count=count, loop_trips=loop_trips, **values)


def plan(tensors=None, collectives=(), memory=None, preset="default", provenance=(("jax", "0.10.2"),)) -> Plan:
    """A small plan; tensors as a dict path → record."""
    tensors = {"params/w": tensor()} if tensors is None else tensors
    memory = {"argument_bytes": 1000, "output_bytes": 1000, "temp_bytes": 100_000} if memory is None else memory
    return Plan(
        case=CaseRecord("deepseek-tiny", preset, "cpu-8", MESH, "auto"),
        provenance=provenance,
        tensors=tuple(sorted(tensors.items())),
        collectives=tuple(collectives),
        memory=tuple(sorted(memory.items())),
    )


@pytest.fixture(scope="module")
def sample_plans():
    old = plan_from_json((DATA / "plan-deepseek-tiny-default.json").read_text())
    new = plan_from_json((DATA / "plan-deepseek-tiny-ep-as-cp.json").read_text())
    return old, new


@pytest.fixture(scope="module")
def sample_diff(sample_plans):
    return diff_plans(*sample_plans)


def only(changes: tuple[Change, ...], subject: str) -> Change:
    found = [c for c in changes if c.subject == subject]
    assert len(found) == 1, f"expected one change of {subject!r}, found {found}"
    return found[0]


def test_plan_against_itself_is_same():
    base = plan(collectives=[row()])
    diff = diff_plans(base, base)
    assert diff.same
    assert diff.changes == ()
    assert [p for p, _ in diff.unchanged_tensors] == ["params/w"]
    assert diff.unchanged_collectives == (row(),)


def test_sample_plan_against_itself_is_same():
    sample = plan_from_json((DATA / "plan-deepseek-tiny-ep-as-cp.json").read_text())
    diff = diff_plans(sample, sample)
    assert diff.same
    assert len(diff.unchanged_tensors) == len(sample.tensors) > 0
    assert diff.totals_before == diff.totals_after


def test_provenance_alone_is_same():
    old = plan(provenance=(("jax", "0.10.2"), ("backend", "cpu")))
    new = plan(provenance=(("jax", "0.11.0"), ("backend", "cpu"), ("libtpu", "x")))
    diff = diff_plans(old, new)
    assert diff.same
    assert dict(diff.provenance_after)["jax"] == "0.11.0"  # kept for display, not compared


def test_spec_change_reports_the_dimension_and_axes():
    old = plan({"params/w": tensor(spec=(("fsdp", "expert"), None), bytes_per_device=256)})
    new = plan({"params/w": tensor(spec=("fsdp", "expert"), bytes_per_device=256)})
    diff = diff_plans(old, new)
    change = only(diff.changes, "params/w")
    assert change.kind == "spec_changed"
    assert change.dims == (
        DimChange(
            dim=0, logical="embed", before=("fsdp", "expert"), after="fsdp", axes_added=(), axes_dropped=("expert",)
        ),
        DimChange(dim=1, logical="mlp", before=None, after="expert", axes_added=("expert",), axes_dropped=()),
    )
    assert change.before.spec == (("fsdp", "expert"), None)
    assert change.after.spec == ("fsdp", "expert")
    # The diff JSON writes the sides as the plan does, and reads them back into the same records.
    text = json.dumps({"changes": [change_to_json(change)]})
    assert json.loads(text)["changes"][0]["before"]["spec"] == [["fsdp", "expert"], None]
    assert changes_from_json(json.loads(text)) == (change,)


def test_spec_change_carries_bytes_per_device():
    old = plan({"params/w": tensor(spec=(("fsdp", "expert"), None), bytes_per_device=256)})
    new = plan({"params/w": tensor(spec=("fsdp", None), bytes_per_device=512)})
    change = only(diff_plans(old, new).changes, "params/w")
    assert FieldChange("bytes_per_device", 256, 512) in change.fields
    assert [(d.dim, d.axes_dropped) for d in change.dims] == [(0, ("expert",))]


def test_reordered_axes_are_a_change_without_added_or_dropped_axes():
    old = plan({"params/w": tensor(spec=(("fsdp", "expert"), None))})
    new = plan({"params/w": tensor(spec=(("expert", "fsdp"), None))})
    (dim,) = only(diff_plans(old, new).changes, "params/w").dims
    assert (dim.axes_added, dim.axes_dropped) == ((), ())


def test_shape_change_is_tensor_changed():
    old = plan({"params/w": tensor(shape=(8, 64))})
    new = plan({"params/w": tensor(shape=(8, 128))})
    change = only(diff_plans(old, new).changes, "params/w")
    assert change.kind == "tensor_changed"
    assert change.fields == (FieldChange("shape", [8, 64], [8, 128]),)


def test_tensor_added_and_removed():
    old = plan({"params/w": tensor(), "params/gone": tensor()})
    new = plan({"params/w": tensor(), "params/new": tensor(bytes_per_device=64)})
    diff = diff_plans(old, new)
    assert [(c.kind, c.subject) for c in diff.changes] == [
        ("tensor_removed", "params/gone"),
        ("tensor_added", "params/new"),
    ]
    assert only(diff.changes, "params/new").after.bytes_per_device == 64
    assert only(diff.changes, "params/gone").after is None


def test_collective_count_change():
    diff = diff_plans(plan(collectives=[row(count=2)]), plan(collectives=[row(count=4)]))
    (change,) = diff.changes
    assert change.kind == "collective_changed"
    assert change.before.count == 2 and change.after.count == 4
    assert change.fields == (FieldChange("count", 2, 4), FieldChange("traffic", 2048, 4096))
    assert change.subject == "all-gather over fsdp float32[8,32] forward at decoder/mlp"


def test_collective_trips_and_bytes_change():
    diff = diff_plans(plan(collectives=[row(loop_trips=4)]), plan(collectives=[row(loop_trips=8, nbytes=512)]))
    (change,) = diff.changes
    assert [f.field for f in change.fields] == ["bytes", "loop_trips"]  # traffic 4096 both sides


def test_collective_on_other_axes_is_removed_and_added():
    diff = diff_plans(plan(collectives=[row(axes=("fsdp", "expert"))]), plan(collectives=[row(axes=("fsdp",))]))
    assert [c.kind for c in diff.changes] == ["collective_removed", "collective_added"]
    assert diff.changes[0].before.axes == ("fsdp", "expert")
    assert diff.changes[1].after.axes_label == "fsdp"


def test_rows_sharing_a_key_are_aggregated_first():
    # One instruction of count 2 on one side, two of count 1 on the other: the same collectives.
    diff = diff_plans(plan(collectives=[row(count=2)]), plan(collectives=[row(), row()]))
    assert diff.same
    diff = diff_plans(plan(collectives=[row(count=2)]), plan(collectives=[row(), row(), row()]))
    (change,) = diff.changes
    assert change.fields[0] == FieldChange("count", 2, 3)


def test_temp_bytes_within_tolerance_is_not_a_change():
    old = plan(memory={"temp_bytes": 100_000, "argument_bytes": 10})
    new = plan(memory={"temp_bytes": 101_500, "argument_bytes": 10})
    diff = diff_plans(old, new)
    assert diff.same
    assert diff.notes and "temp_bytes moved by +1500 B" in diff.notes[0]


def test_temp_bytes_beyond_tolerance_is_a_change():
    old = plan(memory={"temp_bytes": 100_000})
    new = plan(memory={"temp_bytes": 103_000})
    assert diff_plans(old, new).changes == (Change("memory_changed", "temp_bytes", 100_000, 103_000),)
    assert diff_plans(old, new, temp_tolerance=0.05).same


def test_other_memory_fields_are_exact():
    diff = diff_plans(plan(memory={"argument_bytes": 1000}), plan(memory={"argument_bytes": 1001}))
    assert diff.changes == (Change("memory_changed", "argument_bytes", 1000, 1001),)


def test_tolerance_is_symmetric():
    assert DEFAULT_TEMP_TOLERANCE == 0.02
    assert within_tolerance(100, 102, 0.02) and within_tolerance(102, 100, 0.02)
    assert not within_tolerance(100, 103, 0.02) and not within_tolerance(103, 100, 0.02)


def test_case_header_changes():
    old = plan()
    new = dataclasses.replace(
        plan(preset="ep-as-cp"),
        case=CaseRecord("deepseek-tiny", "ep-as-cp", "cpu-8", MESH[::-1], "auto", (("moe", "ring"),)),
    )
    diff = diff_plans(old, new)
    assert [(c.kind, c.subject) for c in diff.changes] == [("case", "mesh"), ("case", "overrides"), ("case", "preset")]
    assert only(diff.changes, "mesh").after == "expert=2,fsdp=4 (+2 axes of size 1)"
    assert only(diff.changes, "overrides").after == {"moe": "ring"}


def test_change_order_is_deterministic():
    tensors = {f"params/{name}": tensor() for name in ("b", "a", "c")}
    new_tensors = {path: tensor(spec=("fsdp", None)) for path in tensors}
    old = plan(tensors, collectives=[row(source="z"), row(source="a", op="all-reduce")])
    new = plan(new_tensors, collectives=[row(source="a", op="all-reduce", count=3)], preset="other")
    first, second = diff_plans(old, new), diff_plans(old, new)
    assert first.changes == second.changes
    assert [c.subject for c in first.changes][:4] == ["preset", "params/a", "params/b", "params/c"]
    assert [c.kind for c in first.changes][4:] == ["collective_changed", "collective_removed"]


def test_json_round_trip_does_not_change_the_verdict():
    base = plan({"params/w": tensor(), "activations/x": tensor(kind="activation")}, collectives=[row()])
    assert diff_plans(base, plan_from_json(plan_to_json(base))).same


def test_default_vs_ep_as_cp_moves_expert_from_batch_to_sequence(sample_diff):
    # MLA's query is (activation_kv_batch, activation_length, …): MaxText's base rules put the batch on
    # data×fsdp×fsdp_transpose×expert and the length on context (size 1); ep-as-cp the batch on data×fsdp
    # and the length on expert.
    change = only(sample_diff.changes, QUERY)
    assert change.kind == "spec_changed"
    assert change.dims == (
        DimChange(0, "activation_kv_batch", ("fsdp", "expert"), "fsdp", (), ("expert",)),
        DimChange(1, "activation_length", None, "expert", ("expert",), ()),
    )
    assert FieldChange("shard_shape", [1, 32, 4, 24], [2, 16, 4, 24]) in change.fields
    assert change.before.bytes_per_device == change.after.bytes_per_device == 12288


def test_default_vs_ep_as_cp_needs_whole_sequence_keys_in_attention(sample_diff):
    # Keys are placed like queries (split over the sequence); attention over the whole sequence then
    # gathers them over expert inside self_attention, in both passes.
    key = only(sample_diff.changes, "activations/decoder/moe_layers/self_attention/key")
    assert [(d.dim, d.axes_added, d.axes_dropped) for d in key.dims] == [(0, (), ("expert",)), (1, ("expert",), ())]
    added = [c.subject for c in sample_diff.of_kind("collective_added")]
    for pass_ in ("forward", "backward"):
        assert any(
            s.startswith("all-gather over expert") and f" {pass_} at decoder/moe_layers/self_attention" in s
            for s in added
        )


def test_default_vs_ep_as_cp_latent_projections_lose_expert(sample_diff):
    # q_lora and kv_lora are on fsdp only under ep-as-cp (base.yml: fsdp×…×expert).
    wq_b = only(sample_diff.changes, "params/decoder/moe_layers/self_attention/wq_b/kernel")
    assert [(d.dim, d.logical, d.axes_dropped) for d in wq_b.dims] == [(0, "q_lora", ("expert",))]
    groups = {g.change.subject: g.mirrors for g in group_tensor_changes(sample_diff.changes)}
    assert groups["params/decoder/moe_layers/self_attention/wq_b/kernel"] == (
        "opt_state/0/mu/decoder/moe_layers/self_attention/wq_b/kernel",
        "opt_state/0/nu/decoder/moe_layers/self_attention/wq_b/kernel",
        "outputs/opt_state/0/mu/decoder/moe_layers/self_attention/wq_b/kernel",
        "outputs/opt_state/0/nu/decoder/moe_layers/self_attention/wq_b/kernel",
        "outputs/params/decoder/moe_layers/self_attention/wq_b/kernel",
    )
    changed_params = sorted(s for s in groups if s.startswith("params/"))
    assert changed_params == [
        f"params/decoder/{stack}/self_attention/{name}/kernel"
        for stack in ("dense_layers", "moe_layers")
        for name in ("wkv_b", "wq_b")
    ]


def test_default_vs_ep_as_cp_totals(sample_diff, sample_plans):
    old, new = sample_plans
    # The two meshes split devices alike (fsdp=4, expert=2) and differ only in how many axes of size 1 they
    # list: not a mesh change.
    assert {axis: size for axis, size in old.case.mesh if size > 1} == {a: s for a, s in new.case.mesh if s > 1}
    assert old.case.mesh != new.case.mesh
    assert [(c.kind, c.subject, c.after) for c in sample_diff.of_kind("case")] == [("case", "preset", "ep-as-cp")]
    assert {c.kind for c in sample_diff.changes} <= set(CHANGE_KINDS)
    # Exactly the tensors whose spec differs between the two plans, computed from the plans themselves.
    before, after = old.tensor_map, new.tensor_map
    assert before.keys() == after.keys()
    moved = {path for path in before if before[path].spec != after[path].spec}
    assert {c.subject for c in sample_diff.of_kind("spec_changed")} == moved
    assert not sample_diff.of_kind("tensor_added", "tensor_removed", "tensor_changed")
    assert len(sample_diff.unchanged_tensors) == len(before) - len(moved)
    # MoE weights keep their sharding: the core MoE block is the same under both presets.
    unchanged = dict(sample_diff.unchanged_tensors)
    assert unchanged["params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0"].spec[0] == "expert"


def test_default_vs_ep_as_cp_collectives(sample_diff):
    added = {c.subject for c in sample_diff.of_kind("collective_added")}
    removed = {c.subject for c in sample_diff.of_kind("collective_removed")}
    # wq_b's q_lora dimension leaves expert: gathered over fsdp alone.
    assert "all-gather over fsdp float32[32,4,24] forward at decoder/moe_layers/self_attention/wq_b" in added
    assert "all-gather over fsdp+expert float32[32,4,24] forward at decoder/moe_layers/self_attention/wq_b" in removed
    # The EP all-to-all of the MoE core is untouched.
    assert any(r.op == "all-to-all" and r.axes == ("expert",) for r in sample_diff.unchanged_collectives)


def test_a_tensors_only_plan_is_compared_on_tensors_alone(sample_plans):
    old, _ = sample_plans
    partial = dataclasses.replace(old, collectives=(), memory=(), parts=("tensors",))
    diff = diff_plans(old, partial)
    assert diff.same
    assert any("tensors only" in note and "collectives and memory not compared" in note for note in diff.notes)
    # A tensor that moved is still a change.
    path, record = old.tensors[0]
    moved = dataclasses.replace(record, spec=("fsdp",) * len(record.shape))
    changed = diff_plans(old, dataclasses.replace(partial, tensors=((path, moved), *old.tensors[1:])))
    assert [c.subject for c in changed.changes] == [path]


# --- what each side is, and what decides the exit code ------------------------------------------------------


def _tensors_only(tmp_path: Path, preset: str, name: str, *extra: str) -> Path:
    from typer.testing import CliRunner

    from shardscope.cli import app

    out = tmp_path / f"{name}.json"
    result = CliRunner().invoke(
        app, ["dump", "deepseek-tiny", "--preset", preset, *extra, "--tensors-only", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out


def test_same_shardings_from_a_file_differ_only_in_findings_and_exit_0(tmp_path, monkeypatch):
    # MaxText's own ep-as-cp rule file against the built-in preset carrying it: the same placement; the file's
    # rules for other model families give lint findings, which are reported apart and do not fail the diff.
    from typer.testing import CliRunner

    from shardscope.cli import app

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    rule_file = "tests/data/maxtext/custom_mesh_and_rule/ep-as-cp.yml"
    old = _tensors_only(tmp_path, "ep-as-cp", "builtin")
    new = _tensors_only(tmp_path, rule_file, "file", "--mesh", "fsdp=4,expert=2")
    diff = diff_plans(plan_from_json(old.read_text()), plan_from_json(new.read_text()))
    assert not diff.placement_changes and diff.finding_changes
    runner = CliRunner()
    result = runner.invoke(app, ["diff", str(old), str(new)], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # piped output wraps at 120 columns
    old_side, new_side = text.index("old deepseek-tiny under ep-as-cp (built-in)"), text.index("new deepseek-tiny")
    assert old_side < new_side and f"under ep-as-cp (file {rule_file})" in text[new_side:]
    assert "(tensors only)" in text[old_side:new_side]
    assert f"same placement and traffic; {len(diff.finding_changes)} lint findings changed" in text
    assert runner.invoke(app, ["diff", str(old), str(new), "--strict"]).exit_code == 1


def test_import_maxtext_takes_the_model_name(tmp_path):
    from typer.testing import CliRunner

    from shardscope.cli import app

    dump = DATA / "maxtext" / "sharding_info" / "llama3.1-70b" / "v5p-16" / "slice_1" / "rule_default"
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["import-maxtext", str(dump), "--model", "my-llama", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = plan_from_json(out.read_text())
    assert plan.case.model == "my-llama" and plan.case.topology == "v5p-16"
    inferred = tmp_path / "inferred.json"
    assert CliRunner().invoke(app, ["import-maxtext", str(dump), "-o", str(inferred)]).exit_code == 0
    assert plan_from_json(inferred.read_text()).case.model == "llama3.1-70b"
