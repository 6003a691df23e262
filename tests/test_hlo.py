"""HLO collectives parser: replica-group spellings, bytes, loops, passes, sources, and real jax samples."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardscope.hlo import (
    Collective,
    HloParseError,
    MeshLayout,
    UnknownOp,
    expand_iota_groups,
    groups_to_axes,
    module_path,
    parse_collectives,
    pass_of,
    shape_info,
)
from shardscope.hlo.groups import expand_mesh_groups, pairs_to_shift, parse_replica_groups

SAMPLES = Path(__file__).parent / "hlo_samples"
MESH = MeshLayout(("fsdp", "expert"), (4, 2))
MESH4 = MeshLayout(("data", "stage", "fsdp", "expert"), (1, 1, 4, 2))
ADD = """%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}
"""
PAIRS_FSDP_RING = "{{0,2},{2,4},{4,6},{6,0},{1,3},{3,5},{5,7},{7,1}}"


def module(*lines: str, computations: str = "", header: str = "HloModule test, num_partitions=8") -> str:
    """A module whose ENTRY holds `lines` after a parameter %p = f32[8,16]."""
    body = "\n".join(f"  {line}" for line in lines)
    entry = f"ENTRY %main (p: f32[8,16]) -> f32[8,16] {{\n  %p = f32[8,16]{{1,0}} parameter(0)\n{body}\n}}\n"
    return f"{header}\n\n{ADD}\n{computations}\n{entry}"


def all_reduce(groups: str, shape: str = "f32[8,16]{1,0}", name: str = "ar", extra: str = "") -> str:
    return f"%{name} = {shape} all-reduce(%p), channel_id=1, replica_groups={groups}, to_apply=%add{extra}"


def only(text: str, mesh: MeshLayout | None = MESH) -> Collective:
    rows = parse_collectives(text, mesh).collectives
    assert len(rows) == 1, rows
    return rows[0]


# Replica groups


@pytest.mark.parametrize(
    ("groups", "axes"),
    [
        ("{{0,2,4,6},{1,3,5,7}}", ("fsdp",)),
        ("{{0,1},{2,3},{4,5},{6,7}}", ("expert",)),
        ("{{1,0},{3,2},{5,4},{7,6}}", ("expert",)),
        ("{{0,1,2,3,4,5,6,7}}", ("fsdp", "expert")),
        ("{}", ("fsdp", "expert")),
        ("{{0},{1},{2},{3},{4},{5},{6},{7}}", ()),
        ("[2,4]<=[4,2]T(1,0)", ("fsdp",)),
        ("[4,2]<=[8]", ("expert",)),
        ("[1,8]<=[8]", ("fsdp", "expert")),
        ("mesh['axis_0'=1,'axis_1'=4,'axis_2'=2] {'axis_1'}", ("fsdp",)),
        ("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", ("fsdp",)),
        ("mesh['axis_0'=8,'axis_1'=1] {'axis_0'}", ("fsdp", "expert")),
        ("@mesh<a=4,b=2> {b}", ("expert",)),
    ],
)
@pytest.mark.parametrize("mesh", [MESH, MESH4], ids=["fsdp4-expert2", "with-size-1-axes"])
def test_every_replica_group_spelling_maps_to_mesh_axes(groups: str, axes: tuple[str, ...], mesh: MeshLayout) -> None:
    row = only(module(all_reduce(groups, extra=", use_global_device_ids=true")), mesh)
    assert (row.axes, row.groups) == (axes, None)


def test_mesh_axes_spelling_with_device_order() -> None:
    spec = "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}"
    # iota(8).reshape(2,4).T = [[0,4],[1,5],[2,6],[3,7]] is the [4,1,2] mesh; axis_0 runs down each column.
    assert expand_mesh_groups(spec) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_replica_groups(spec) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    row = only(module(all_reduce(spec)))
    assert (row.axes, row.groups) == (None, "{{0,1,2,3},{4,5,6,7}}")  # half the fsdp and both experts
    assert only(module(all_reduce(spec)), MeshLayout(("data", "fsdp"), (2, 4))).axes == ("fsdp",)


@pytest.mark.parametrize(
    ("spec", "groups"),
    [
        ("mesh['a'=4,'b'=2] {'a':(2)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),  # the minor half of a
        ("mesh['a'=4,'b'=2] {'a':(1)2}", [[0, 4], [1, 5], [2, 6], [3, 7]]),  # the major half of a
        ("mesh['a'=4,'b'=2] {'a', 'b'}", [[0, 1, 2, 3, 4, 5, 6, 7]]),
        ("@mesh<a=2,b=4>(0,4,1,5,2,6,3,7) {a}", [[0, 2], [4, 6], [1, 3], [5, 7]]),
        ("@mesh<a=2,b=4>([4,2]T(1,0)) {b}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ],
)
def test_mesh_axes_sub_axes_and_device_orders(spec: str, groups: list[list[int]]) -> None:
    assert expand_mesh_groups(spec) == groups


def test_iota_spellings_expand_by_hand() -> None:
    assert expand_iota_groups("[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert expand_iota_groups("[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert expand_iota_groups("[2,10]<=[4,5]T(1,0)")[1] == [12, 17, 3, 8, 13, 18, 4, 9, 14, 19]  # XLA's own test
    for bad in ("[3,3]<=[8]", "[2,4]<=[2,4]T(0,0)", "{{0,1}}"):
        with pytest.raises(ValueError):
            expand_iota_groups(bad)


@st.composite
def iota_cases(draw: st.DrawFn) -> tuple[str, list[list[int]]]:
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    transposed = draw(st.booleans())
    perm = draw(st.permutations(range(len(dims)))) if transposed else list(range(len(dims)))
    n = math.prod(dims)
    size = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    spec = f"[{n // size},{size}]<=[{','.join(map(str, dims))}]"
    spec += f"T({','.join(map(str, perm))})" if transposed else ""
    expected = np.arange(n).reshape(dims).transpose(perm).reshape(n // size, size).tolist()
    return spec, expected


@given(iota_cases())
def test_iota_expansion_matches_numpy(case: tuple[str, list[list[int]]]) -> None:
    spec, expected = case
    assert expand_iota_groups(spec) == expected


def test_groups_to_axes_prefers_varying_axes_and_rejects_others() -> None:
    assert groups_to_axes([[0, 2, 4, 6], [1, 3, 5, 7]], MESH4) == ("fsdp",)
    assert groups_to_axes([], MESH4) == ("fsdp", "expert")
    assert groups_to_axes([[0], [1]], MESH) == ()
    assert groups_to_axes([[0, 1, 2, 3], [4, 5, 6, 7]], MESH) is None  # not a product of whole axes
    assert groups_to_axes([[0, 1], [2, 3]], MESH) is None  # leaves devices out
    assert groups_to_axes([[0, 8]], MESH) is None  # names a device beyond the mesh


def test_unmatched_or_meshless_groups_keep_a_canonical_spelling() -> None:
    assert only(module(all_reduce("{{6,7},{3,2},{0,1},{4,5}}")), None).groups == "{{0,1},{2,3},{4,5},{6,7}}"
    assert only(module(all_reduce("{}")), None).groups == "{{0,1,2,3,4,5,6,7}}"  # num_partitions=8
    assert only(module(all_reduce("{}"), header="HloModule bare"), None).groups == "{}"
    row = only(module(all_reduce("{{0,1,2,3},{4,5,6,7}}")))
    assert (row.axes, row.groups) == (None, "{{0,1,2,3},{4,5,6,7}}")


# collective-permute


@pytest.mark.parametrize(
    ("pairs", "axes", "shift"),
    [
        (PAIRS_FSDP_RING, ("fsdp",), 1),
        ("{{2,0},{4,2},{6,4},{0,6},{3,1},{5,3},{7,5},{1,7}}", ("fsdp",), -1),
        ("{{0,4},{4,0},{2,6},{6,2},{1,5},{5,1},{3,7},{7,3}}", ("fsdp",), 2),
        ("{{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}", ("expert",), 1),
        ("{{0,2},{2,4},{4,6}}", ("fsdp",), 1),  # a shift without wrap-around
        ("{{0,0},{1,1}}", (), 0),
    ],
)
def test_collective_permute_is_a_shift_along_one_axis(pairs: str, axes: tuple[str, ...], shift: int) -> None:
    row = only(module(f"%cp = f32[8,16]{{1,0}} collective-permute(%p), channel_id=1, source_target_pairs={pairs}"))
    assert (row.axes, row.shift, row.groups, row.bytes) == (axes, shift, None, 512)


def test_a_ring_through_every_device_shifts_along_the_axes_it_carries_through() -> None:
    # fsdp=4 x expert=2, expert minor: device d sits at (d // 2, d % 2), so d -> d+1 steps along expert and
    # carries into fsdp at every odd d: one ring of eight over both axes, as a decomposed all-gather makes.
    forward = [(d, (d + 1) % 8) for d in range(8)]
    backward = [(d, (d - 1) % 8) for d in range(8)]
    assert pairs_to_shift(forward, MESH) == (("fsdp", "expert"), 1)
    assert pairs_to_shift(backward, MESH) == (("fsdp", "expert"), -1)
    # Size-1 axes inside the run shift nothing and are not named.
    spaced = MeshLayout(("fsdp", "stage", "expert"), (4, 1, 2))
    assert pairs_to_shift(forward, spaced) == (("fsdp", "expert"), 1)
    # Not one uniform step on the run's index: two rings of four, one per expert, interleaved wrongly.
    assert pairs_to_shift([(0, 3), (3, 0)], MESH) is None


def test_irregular_or_meshless_permute_keeps_its_pairs() -> None:
    line = "%cp = f32[8,16]{1,0} collective-permute(%p), channel_id=1, source_target_pairs={{3,0},{0,3}}"
    row = only(module(line))
    assert (row.axes, row.shift, row.groups) == (None, None, "{0->3,3->0}")  # moves along both axes
    row = only(module(line.replace("{{3,0},{0,3}}", PAIRS_FSDP_RING)), None)
    assert (row.axes, row.shift, row.groups) == (None, None, "{0->2,1->3,2->4,3->5,4->6,5->7,6->0,7->1}")
    assert pairs_to_shift([(0, 1), (1, 3)], MESH) is None


# Shapes and bytes


@pytest.mark.parametrize(
    ("shape", "dtype", "dims", "nbytes"),
    [
        ("f32[8,16]{1,0}", "float32", (8, 16), 512),
        ("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}", "bfloat16", (8, 128), 2048),
        ("f32[<=8,4]{1,0}", "float32", (8, 4), 128),
        ("(s32[], f32[4]{0}, /*index=2*/u8[3]{0})", "float32+int32+uint8", (), 23),
        ("pred[10]{0}", "bool", (10,), 10),
        ("s4[3]{0}", "int4", (3,), 2),
        ("f8e4m3fn[16]{0}", "float8_e4m3fn", (16,), 16),
        ("c64[2]{0}", "complex64", (2,), 16),
        ("(f32[2]{0}, token[])", "float32", (2,), 8),
    ],
)
def test_shapes_tolerate_layouts_tiling_and_dynamic_dims(shape: str, dtype: str, dims: tuple, nbytes: int) -> None:
    assert shape_info(shape) == (dtype, dims, nbytes)


def test_combined_all_reduce_sums_its_tuple() -> None:
    row = only(module(all_reduce("{{0,1},{2,3},{4,5},{6,7}}", shape="(f32[8,16]{1,0}, f32[4]{0})")))
    assert (row.op, row.dtype, row.shape, row.bytes) == ("all-reduce", "float32", (8, 16), 528)
    row = only(module(all_reduce("{}", shape="(bf16[8]{0}, f32[4]{0})")))
    assert (row.dtype, row.shape, row.bytes) == ("bfloat16+float32", (8,), 32)


def test_reduce_scatter_reports_the_operand_bytes() -> None:
    line = "%rs = f32[4,16]{1,0} reduce-scatter(%p), channel_id=1, replica_groups=GROUPS, dimensions={0}, to_apply=%add"
    assert only(module(line.replace("GROUPS", "{{0,1},{2,3},{4,5},{6,7}}"))).bytes == 4 * 16 * 4 * 2
    assert only(module(line.replace("GROUPS", "[2,4]<=[4,2]T(1,0)"))).bytes == 4 * 16 * 4 * 4
    assert only(module(line.replace("GROUPS", "{}"))).bytes == 4 * 16 * 4 * 8


WRAPPED_ALL_TO_ALL = """%wrapped_all_to_all (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  ROOT %a2a = f32[8,16]{1,0} all-to-all(%a), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
}
"""
ASYNC_LINES = (
    "%ags = (f32[2,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%p), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0),"
    " dimensions={0}, use_global_device_ids=true",
    "%agd = f32[8,16]{1,0} all-gather-done(%ags)",
    "%cps = (f32[8,16]{1,0}, f32[8,16]{1,0}, u32[], u32[]) collective-permute-start(%agd), channel_id=2,"
    f" source_target_pairs={PAIRS_FSDP_RING}",
    "%cpd = f32[8,16]{1,0} collective-permute-done(%cps)",
    "%ars = f32[8,16]{1,0} all-reduce-start(%cpd), channel_id=3, replica_groups={}, to_apply=%add",
    "%ard = f32[8,16]{1,0} all-reduce-done(%ars)",
    "%a2as = ((f32[8,16]{1,0}), f32[8,16]{1,0}, s32[]) async-start(%ard), calls=%wrapped_all_to_all",
    "%a2ad = f32[8,16]{1,0} async-done(%a2as), calls=%wrapped_all_to_all",
    "%rss = ((f32[8,16]{1,0}), f32[4,16]{1,0}) reduce-scatter-start(f32[8,16]{1,0} %a2ad), channel_id=5,"
    " replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, to_apply=%add",
    "ROOT %rsd = f32[4,16]{1,0} reduce-scatter-done(((f32[8,16]{1,0}), f32[4,16]{1,0}) %rss)",
)


@pytest.mark.parametrize("with_done", [True, False])
def test_async_pairs_count_the_start_once_with_the_result_bytes(with_done: bool) -> None:
    lines = [line for line in ASYNC_LINES if with_done or "-done" not in line]
    rows = parse_collectives(module(*lines, computations=WRAPPED_ALL_TO_ALL), MESH).collectives
    got = {(r.op, r.axes, r.count, r.bytes, r.shape) for r in rows}
    assert got == {
        ("all-gather", ("fsdp",), 1, 512, (8, 16)),
        ("collective-permute", ("fsdp",), 1, 512, (8, 16)),
        ("all-reduce", ("fsdp", "expert"), 1, 512, (8, 16)),
        ("all-to-all", ("expert",), 1, 512, (8, 16)),
        ("reduce-scatter", ("expert",), 1, 512, (4, 16)),  # operand bytes: 4x16 floats x 2 devices
    }


# Call graph and loops


def loop_module(
    trips: str | None = '{"known_trip_count":{"n":"6"}}',
    start: str = "s32[] constant(0)",
    compare: str = "compare(%i, %n), direction=LT",
    bound: int = 6,
    step: str = "add(%i, %one)",
    inner: str = "",
) -> str:
    """A while loop holding one all-reduce over "expert" in its body (plus `inner`)."""
    config = f", backend_config={trips}" if trips else ""
    computations = f"""%body (s: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {{
  %s = (s32[], f32[8,16]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = f32[8,16]{{1,0}} get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %next = s32[] {step}
  {all_reduce("{{0,1},{2,3},{4,5},{6,7}}", name="in_loop").replace("(%p)", "(%x)")}
  {inner}
  ROOT %t = (s32[], f32[8,16]{{1,0}}) tuple(%next, %in_loop)
}}

%cond (s: (s32[], f32[8,16])) -> pred[] {{
  %s = (s32[], f32[8,16]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant({bound})
  ROOT %c = pred[] {compare}
}}
"""
    return module(
        f"%start = {start}",
        "%copy = s32[] copy(%start)",
        "%init = (s32[], f32[8,16]{1,0}) tuple(%copy, %p)",
        f"%w = (s32[], f32[8,16]{{1,0}}) while(%init), condition=%cond, body=%body{config}",
        all_reduce("{{0,2,4,6},{1,3,5,7}}", name="after"),
        computations=computations,
    )


def trips_by_axes(text: str) -> dict[tuple[str, ...] | None, int | None]:
    return {r.axes: r.loop_trips for r in parse_collectives(text, MESH).collectives}


def test_known_trip_count_multiplies_the_body_only() -> None:
    assert trips_by_axes(loop_module()) == {("expert",): 6, ("fsdp",): 1}


@pytest.mark.parametrize(
    ("start", "compare", "bound", "step", "trips"),
    [
        ("s32[] constant(0)", "compare(%i, %n), direction=LT", 6, "add(%i, %one)", 6),
        ("s32[] constant(2)", "compare(%i, %n), direction=LT", 6, "add(%i, %one)", 4),
        ("s32[] constant(2)", "compare(%i, %n), direction=LE", 6, "add(%i, %one)", 5),
        ("s32[] constant(0)", "compare(%n, %i), direction=GT", 6, "add(%i, %one)", 6),
        ("s32[] constant(0)", "compare(%i, %n), direction=NE", 6, "add(%one, %i)", 6),
        ("s32[] constant(0)", "compare(%i, %n), direction=LT", 7, "add(%i, %two)", 4),
        ("s32[] constant(6)", "compare(%i, %n), direction=GT", 0, "subtract(%i, %one)", 6),
        ("s32[] constant(6)", "compare(%i, %n), direction=GE", 1, "subtract(%i, %one)", 6),
    ],
)
def test_trip_count_is_derived_from_condition_and_init(
    start: str, compare: str, bound: int, step: str, trips: int
) -> None:
    text = loop_module(trips=None, start=start, compare=compare, bound=bound, step=step)
    text = text.replace("  %one = s32[] constant(1)", "  %one = s32[] constant(1)\n  %two = s32[] constant(2)")
    assert trips_by_axes(text)[("expert",)] == trips


def test_unknown_trip_count_is_none_never_one() -> None:
    text = loop_module(trips=None, start="s32[] parameter(1)")
    assert trips_by_axes(text) == {("expert",): None, ("fsdp",): 1}
    text = loop_module(trips=None, compare="compare(%i, %x), direction=LT")  # bound is not a constant
    assert trips_by_axes(text)[("expert",)] is None


def test_nested_loops_multiply() -> None:
    outer = loop_module(trips='{"known_trip_count":{"n":"3"}}', inner=INNER_WHILE)
    rows = parse_collectives(outer.replace("%main (", "%unused (") + INNER_LOOP + "\n", MESH).collectives
    assert {(r.axes, r.loop_trips) for r in rows} == {(("expert",), 3), (("fsdp", "expert"), 12), (("fsdp",), 1)}


INNER_WHILE = (
    "%zero = s32[] constant(0)\n"
    "  %inner_init = (s32[], f32[8,16]{1,0}) tuple(%zero, %x)\n"
    "  %inner = (s32[], f32[8,16]{1,0}) while(%inner_init), condition=%cond, body=%inner_body,"
    ' backend_config={"known_trip_count":{"n":"4"}}'
)
INNER_LOOP = """
%inner_body (s: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %s = (s32[], f32[8,16]{1,0}) parameter(0)
  %x = f32[8,16]{1,0} get-tuple-element(%s), index=1
  %ar = f32[8,16]{1,0} all-reduce(%x), channel_id=7, replica_groups={}, to_apply=%add
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %ar)
}
"""


def test_called_computations_count_per_call_site() -> None:
    shard = """%shard (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  ROOT %ag = f32[8,16]{1,0} all-gather(%a), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}
}

%ag_fusion (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  ROOT %ag = f32[8,16]{1,0} all-gather(%a), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
}

%branch_0 (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  ROOT %ar = f32[8,16]{1,0} all-reduce(%a), channel_id=3, replica_groups={}, to_apply=%add
}

%branch_1 (a: f32[8,16]) -> f32[8,16] {
  ROOT %a = f32[8,16]{1,0} parameter(0)
}
"""
    text = module(
        "%c1 = f32[8,16]{1,0} call(%p), to_apply=%shard",
        "%c2 = f32[8,16]{1,0} call(%c1), to_apply=%shard",
        "%f = f32[8,16]{1,0} fusion(%c2), kind=kCustom, calls=%ag_fusion",
        "%k = s32[] constant(0)",
        "%cond = f32[8,16]{1,0} conditional(%k, %f, %f), branch_computations={%branch_0, %branch_1}",
        computations=shard,
    )
    rows = parse_collectives(text, MESH).collectives
    assert {(r.op, r.axes, r.count, r.loop_trips) for r in rows} == {
        ("all-gather", ("fsdp",), 2, 1),
        ("all-gather", ("expert",), 1, 1),
        ("all-reduce", ("fsdp", "expert"), 1, 1),
    }


# Passes and sources

FWD = "jit(train_step)/jvp(Model)/decoder/while/body/closed_call"
BWD = "jit(train_step)/transpose(jvp(Model))/decoder/while/body/closed_call"


@pytest.mark.parametrize(
    ("op_name", "pass_", "source"),
    [
        (f"{FWD}/layers/moe/shard_map/all_to_all", "forward", "decoder/layers/moe"),
        (f"{BWD}/checkpoint/rematted_computation/layers/moe/shard_map/all_to_all", "backward", "decoder/layers/moe"),
        (f"{BWD}/layers/moe/shard_map/td,de->te/psum_invariant", "backward", "decoder/layers/moe"),
        # JAX 0.11 names a scan's body `eval_jaxpr` (JAX 0.10: `closed_call`).
        (f"{BWD.replace('closed_call', 'eval_jaxpr')}/checkpoint/layers/mlp/mul", "backward", "decoder/layers/mlp"),
        (f"{BWD}/layers/(moe/shard_map/td,de->te/psum_invariant:proj/dot_general)", "backward", "decoder/layers"),
        ("jit(train_step)/(transpose(jvp(Model))/embed/reduce_sum:jvp()/reduce_sum)", "backward", ""),
        ("jit(train_step)/transpose(jvp())/mul;jit(train_step)/transpose(jvp())/broadcast_in_dim", "backward", ""),
        ("jit(train_step)/jvp(Model)/decoder/while/body/jit(dynamic_index_in_dim)/squeeze", "forward", "decoder"),
        ("jit(train_step)/jvp(Model)/embed/dot_general", "forward", "embed"),
        (f"{FWD}/moe_layers/moe/moe._routed/shard_map/all_to_all", "forward", "decoder/moe_layers/moe"),
        (f"{FWD}/moe/moe._routed/experts/wi/dot_general", "forward", "decoder/moe/experts/wi"),
        ("jit(step)/jvp(Transformer)/Decoder_0/Block_1/Attn_0/dot_general", "forward", "Decoder_0/Block_1/Attn_0"),
        ("jit(train_step)/add", "optimizer", ""),
        ("jit(train_step)/jit(_where)/select_n", "optimizer", ""),
        ("jit(f)/jit(main)/jit(shmap_body)/all_to_all[axis_name=(\\'y\\',) split_axis=2 tiled=True]", "optimizer", ""),
        ("psum_invariant", "other", ""),
    ],
)
def test_pass_and_module_path_from_op_name(op_name: str, pass_: str, source: str) -> None:
    assert (pass_of(op_name), module_path(op_name)) == (pass_, source)
    row = only(module(all_reduce("{}", extra=f', metadata={{op_name="{op_name}" stack_frame_id=3}}')))
    assert (row.pass_, row.source) == (pass_, source)


def test_no_metadata_is_other() -> None:
    assert only(module(all_reduce("{}"))).pass_ == "other"


# Robustness


def test_unknown_collective_like_ops_are_reported_and_bad_lines_skipped() -> None:
    text = module(
        "%tok = token[] after-all()",
        "%s = (f32[8,16]{1,0}, u32[], token[]) send(%p, %tok), channel_id=9",
        "%sd = token[] send-done(%s), channel_id=9",
        "%r = (f32[8,16]{1,0}, u32[], token[]) recv(%tok), channel_id=10",
        "%rd = (f32[8,16]{1,0}, token[]) recv-done(%r), channel_id=10",
        "%x = f32[8,16]{1,0} all-reduce-scatter(%p), replica_groups={}",
        "this line is not HLO at all(",
        "%trunc = f32[8 all-gather(",
        all_reduce("{{0,1},{2,3}", name="broken"),
        all_reduce("{{0,1},{2,x}}", name="odd"),
        all_reduce("{{0,1},{2,3},{4,5},{6,7}}"),
    )
    lines = text.split("\n")

    def line(needle: str) -> int:
        return lines.index(next(x for x in lines if needle in x)) + 1

    parsed = parse_collectives(text, MESH)
    # What parses but is not understood, and what does not parse (the unclosed `[` and `{`), by opcode.
    assert parsed.unknown == (
        UnknownOp("send", line(" send(")),
        UnknownOp("recv", line(" recv(")),
        UnknownOp("all-reduce-scatter", line("all-reduce-scatter(")),
        UnknownOp("all-gather", line("%trunc")),
        UnknownOp("all-reduce", line("%broken")),
    )
    got = {(r.axes, r.groups) for r in parsed.collectives}
    assert got == {(("expert",), None), (None, "{{0,1},{2,x}}")}  # an unknown spelling is kept verbatim
    assert parsed.notices == (
        f"3 instruction(s) that do not parse were skipped (lines {line('not HLO')}, {line('%trunc')},"
        f" {line('%broken')})",
    )


@pytest.mark.parametrize(
    "text", ["", "hello world\nnot hlo", '{"json": true}', "HloModule empty, num_partitions=8\n\n"]
)
def test_text_that_is_not_hlo_raises(text: str) -> None:
    with pytest.raises(HloParseError) as err:
        parse_collectives(text)
    assert isinstance(err.value, ValueError)
    assert "\n" not in str(err.value) and "expected" in str(err.value)


def test_names_without_percent_and_unindented_closings() -> None:
    text = """HloModule bare, num_partitions=8

wrapped {
  a = f32[8]{0} parameter(0)
  ROOT ag = f32[32]{0} all-gather(a), replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}
}, execution_thread="parallel"

ENTRY main {
  p = f32[8]{0} parameter(0)
  start = ((f32[8]{0}), f32[32]{0}) async-start(p), calls=wrapped
  ROOT done = f32[32]{0} async-done(start), calls=wrapped
}
"""
    row = only(text)
    assert (row.op, row.axes, row.count, row.bytes) == ("all-gather", ("fsdp",), 1, 128)


# Real jax 0.10.2 samples (see tests/hlo_samples/README.md)


def test_flax_sample_all_to_all_per_pass_with_scan_trips() -> None:
    parsed = parse_collectives((SAMPLES / "flax_moe_train_step.hlo.txt").read_text(), MESH)
    rows = parsed.collectives
    a2a = {(r.pass_, r.axes, r.source, r.loop_trips, r.count, r.bytes, r.handoff) for r in rows if r.op == "all-to-all"}
    # Per pass, the MoE's two all-to-alls: the one that returns the experts' output to the residual stream,
    # which the next layer's matmuls all wait for, is a hand-off between loop iterations.
    assert a2a == {
        (p, ("expert",), "decoder/layers/moe", 3, 1, 256, handoff)
        for p in ("forward", "backward")
        for handoff in (False, True)
    }
    assert parsed.unknown == ()
    assert all(r.axes is not None and r.groups is None for r in rows)  # explicit, iota and mesh-axes spellings
    assert [r.pass_ for r in rows] == sorted((r.pass_ for r in rows), key=("forward", "backward").index)
    assert ("all-gather", ("fsdp",), "embed", 1) in {(r.op, r.axes, r.source, r.loop_trips) for r in rows}
    fsdp_weights = {(r.op, r.source) for r in rows if r.axes == ("fsdp",) and r.pass_ == "backward"}
    assert ("all-reduce", "decoder/layers") in fsdp_weights  # a combined all-reduce under a merged op_name
    counts = {op: sum(r.count for r in rows if r.op == op) for op in ("all-gather", "all-reduce", "all-to-all")}
    assert counts == {"all-gather": 6, "all-reduce": 6, "all-to-all": 4} and len(rows) == 16  # two hand-offs
    json.dumps([r.to_dict() for r in rows])
    assert set(rows[0].to_dict()) == {"op", "axes", "groups", "shift", "dtype", "shape", "bytes", "count"} | {
        "loop_trips",
        "pass",
        "source",
    }


def test_flax_sample_without_mesh_spells_groups() -> None:
    rows = parse_collectives((SAMPLES / "flax_moe_train_step.hlo.txt").read_text()).collectives
    assert {r.groups for r in rows} == {
        "{{0,1},{2,3},{4,5},{6,7}}",
        "{{0,2,4,6},{1,3,5,7}}",
        "{{0,1,2,3,4,5,6,7}}",
    }
    assert all(r.axes is None for r in rows)


def test_nested_scan_sample_multiplies_trips() -> None:
    text = (SAMPLES / "shard_map_nested_scan.hlo.txt").read_text()
    rows = parse_collectives(text, MESH).collectives
    assert {r.loop_trips for r in rows} == {10}
    assert {(r.op, r.axes, r.shift) for r in rows if r.op == "collective-permute"} == {
        ("collective-permute", ("fsdp",), 1),
        ("collective-permute", ("expert",), 1),
    }
    assert {(r.op, r.axes, r.bytes) for r in rows if r.op == "reduce-scatter"} == {("reduce-scatter", ("expert",), 256)}
    # Without the compiler's known_trip_count the trips come from the condition and the init tuple.
    stripped = re.sub(r", backend_config=\{\"dynamic_variables.*$", "", text, flags=re.M)
    assert "known_trip_count" not in stripped
    assert parse_collectives(stripped, MESH).collectives == rows


def test_flax_sample_trips_survive_without_backend_config() -> None:
    text = (SAMPLES / "flax_moe_train_step.hlo.txt").read_text()
    stripped = re.sub(r", backend_config=\{\"dynamic_variables.*$", "", text, flags=re.M)
    assert "known_trip_count" not in stripped
    assert parse_collectives(stripped, MESH) == parse_collectives(text, MESH)
