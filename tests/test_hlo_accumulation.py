"""Reductions a loop only accumulates: found in a CPU program, and read as the TPU runs them."""

from __future__ import annotations

import dataclasses

import pytest

from shardscope.case.hardware import load_hardware
from shardscope.cost.estimate import price_row
from shardscope.cost.layout import layout_for
from shardscope.cost.step import tpu_execution
from shardscope.extract.collectives import extract_collectives
from shardscope.hlo.accumulation import loop_accumulations
from shardscope.hlo.executions import Program
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile
from shardscope.plan.records import axes_with_marks
from shardscope.plan.units import human_bytes
from shardscope.report.why import row_headline

TRIPS = 6
# A pipeline's loop as XLA's CPU compiler writes it: state (counter, weights, a gradient slot per layer). Each
# iteration's weight gradient is summed over the devices and `{store}` (a fusion) puts it into slot i % 4.
LOOP = """HloModule loop, num_partitions=4

cond {{
  p = (s32[], f32[64,64]{{1,0}}, f32[4,64,64]{{2,1,0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant({trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

sum {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

accumulate {{
  slots = f32[4,64,64]{{2,1,0}} parameter(0)
  g = f32[64,64]{{1,0}} parameter(1)
  at = s32[] parameter(2)
  z = s32[] constant(0)
  old = f32[1,64,64]{{2,1,0}} dynamic-slice(slots, at, z, z), dynamic_slice_sizes={{1,64,64}}
  new = f32[1,64,64]{{2,1,0}} bitcast(g)
  added = f32[1,64,64]{{2,1,0}} add(old, new)
  ROOT put = f32[4,64,64]{{2,1,0}} dynamic-update-slice(slots, added, at, z, z)
}}

whole {{
  slots = f32[4,64,64]{{2,1,0}} parameter(0)
  g = f32[64,64]{{1,0}} parameter(1)
  at = s32[] parameter(2)
  every = f32[4,64,64]{{2,1,0}} broadcast(g), dimensions={{1,2}}
  ROOT summed = f32[4,64,64]{{2,1,0}} add(slots, every)
}}

overwrite {{
  slots = f32[4,64,64]{{2,1,0}} parameter(0)
  g = f32[64,64]{{1,0}} parameter(1)
  at = s32[] parameter(2)
  z = s32[] constant(0)
  new = f32[1,64,64]{{2,1,0}} bitcast(g)
  twice = f32[1,64,64]{{2,1,0}} add(new, new)
  ROOT put = f32[4,64,64]{{2,1,0}} dynamic-update-slice(slots, twice, at, z, z)
}}

body {{
  p = (s32[], f32[64,64]{{1,0}}, f32[4,64,64]{{2,1,0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  w = f32[64,64]{{1,0}} get-tuple-element(p), index=1
  slots = f32[4,64,64]{{2,1,0}} get-tuple-element(p), index=2
  one = s32[] constant(1)
  next = s32[] add(i, one)
  four = s32[] constant(4)
  at = s32[] remainder(i, four)
  grad = f32[64,64]{{1,0}} dot(w, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  reduced = f32[64,64]{{1,0}} all-reduce(grad), replica_groups={{{{0,1}},{{2,3}}}}, to_apply=sum
{extra}
  stored = f32[4,64,64]{{2,1,0}} fusion(slots, reduced, at), kind=kLoop, calls={store}
  ROOT t = (s32[], f32[64,64]{{1,0}}, f32[4,64,64]{{2,1,0}}) tuple(next, w, stored)
}}

ENTRY main {{
  z = s32[] constant(0)
  w0 = f32[64,64]{{1,0}} parameter(0)
  s0 = f32[4,64,64]{{2,1,0}} parameter(1)
  init = (s32[], f32[64,64]{{1,0}}, f32[4,64,64]{{2,1,0}}) tuple(z, w0, s0)
  ROOT loop = (s32[], f32[64,64]{{1,0}}, f32[4,64,64]{{2,1,0}}) while(init), condition=cond, body=body
}}
"""
SLOTS_BYTES = 4 * 64 * 64 * 4
# The accumulating fusion reads the slot, the gradient and the slot's index, and writes the slot back in place.
ADD_BYTES = 3 * 64 * 64 * 4 + 4


def program(store: str = "accumulate", extra: str = "") -> str:
    return LOOP.format(trips=TRIPS, store=store, extra=extra)


def accumulated(text: str):
    return loop_accumulations(Program(read_module(text)))


def test_an_all_reduce_only_added_into_a_slot_of_a_carried_buffer_is_accumulated():
    found = accumulated(program())
    assert found.reductions == found.slotted == {"body/reduced"}
    assert found.adds == found.slot_adds == {"body/stored"}
    assert found.buffer_bytes == {"body/reduced": SLOTS_BYTES}


def test_a_sum_added_into_a_whole_carried_value_is_accumulated_but_not_into_a_slot():
    # As a loss summed over vocabulary tiles: the TPU compiles keep such a sum in its loop.
    found = accumulated(program(store="whole"))
    assert found.reductions == {"body/reduced"} and found.adds == {"body/stored"}
    assert not found.slotted and not found.slot_adds and not found.buffer_bytes


def test_a_sum_written_into_its_slot_once_or_used_again_is_not():
    # A layer loop's gradient, stored in its layer's slot (nothing read back from the slot): no accumulation.
    assert not accumulated(program(store="overwrite")).reductions
    # The sum also feeds the iteration's own work: it must be taken in the loop.
    used = "  again = f32[64,64]{1,0} dot(reduced, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    assert not accumulated(program(extra=used)).reductions


def bytes_by_kind(explicit: bool) -> dict[str, int]:
    bins = work_profile(read_module(program()), cpu_program=True, explicit_reductions=explicit)
    totals: dict[str, int] = {}
    for entry in bins:
        totals[entry.kind] = totals.get(entry.kind, 0) + entry.bytes
    return totals


def test_the_adds_are_a_buffer_when_the_program_asks_for_the_sum_and_free_when_the_tpu_moves_it_out():
    as_tpu = work_profile(read_module(program()), cpu_program=False)
    as_is = sum(entry.bytes for entry in as_tpu if entry.kind == "memory")
    explicit, auto = bytes_by_kind(explicit=True), bytes_by_kind(explicit=False)
    # Explicit axes: the TPU adds each sum into its slot on its own, at the bytes counted (no CPU factor).
    assert explicit["buffer"] == TRIPS * ADD_BYTES
    assert explicit.get("memory", 0) == as_is - TRIPS * ADD_BYTES
    # Auto axes: the partial sums are added inside the matmul that makes them.
    assert "buffer" not in auto and auto.get("memory", 0) == as_is - TRIPS * ADD_BYTES
    # A sum added into a whole carried value stays in the loop with Auto axes: its add is counted as it is.
    whole = work_profile(read_module(program(store="whole")), cpu_program=True, explicit_reductions=False)
    kept = work_profile(read_module(program(store="whole")), cpu_program=False)
    assert sum(e.bytes for e in whole if e.kind == "memory") == sum(e.bytes for e in kept if e.kind == "memory") > 0
    assert not [e for e in whole if e.kind == "buffer"]


def test_only_a_sum_added_into_slots_is_moved_out():
    mesh = (("stage", 2), ("data", 2))
    (row,) = extract_collectives(program(store="whole"), mesh, narrow=True, moved_out=True)
    assert row.tpu_moved_out is None and row.loop_trips == TRIPS


@pytest.mark.parametrize("moved_out", [False, True])
def test_a_moved_out_all_reduce_is_priced_once_on_the_accumulated_buffer(moved_out):
    mesh = (("stage", 2), ("data", 2))
    (row,) = extract_collectives(program(), mesh, narrow=True, moved_out=moved_out)
    assert (row.op, row.loop_trips, row.bytes) == ("all-reduce", TRIPS, 64 * 64 * 4)
    assert row.tpu_moved_out == (SLOTS_BYTES if moved_out else None)
    assert tpu_execution(row, cpu_program=True) == ((SLOTS_BYTES, 1) if moved_out else (64 * 64 * 4, TRIPS))
    # A TPU plan's row is what its program runs.
    assert tpu_execution(row, cpu_program=False) == (64 * 64 * 4, TRIPS)
    hardware = load_hardware("v5p")
    layout = layout_for(hardware, mesh)
    # Priced as the TPU's own row would be: the accumulated buffer once, or the iteration's sum every trip.
    as_tpu = (
        dataclasses.replace(row, tpu_moved_out=None, bytes=SLOTS_BYTES, loop_trips=1)
        if moved_out
        else dataclasses.replace(row, tpu_moved_out=None)
    )
    priced = price_row(row, layout, hardware, 1.0, False, cpu_program=True).seconds
    assert priced is not None and priced > 0
    assert priced == price_row(as_tpu, layout, hardware, 1.0, False).seconds


def test_tables_and_why_say_a_row_is_summed_once_on_tpu():
    (row,) = extract_collectives(program(), (("stage", 2), ("data", 2)), narrow=True, moved_out=True)
    assert axes_with_marks(row) == "data (TPU: once, after the loop)"
    assert axes_with_marks(dataclasses.replace(row, tpu_moved_out=None)) == "data"
    headline = row_headline(row, None, None)
    assert headline.endswith(f"; on TPU summed once, after the loop ({human_bytes(SLOTS_BYTES)})")
    assert "× 6 = " in headline  # the CPU program's own executions stay what it runs
