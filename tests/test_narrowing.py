"""A CPU program's collectives priced in the bytes a TPU moves: float32 values of bfloat16 precision narrow,
but a sum of them does not (`shardscope.hlo.narrowing`)."""

from __future__ import annotations

from shardscope.hlo.collectives import collectives_of
from shardscope.hlo.module import read_module

# A bfloat16 value widened to float32 (by the program or by the CPU compiler's float normalisation), moved
# or summed across two devices, and either added to a float32 accumulator or rounded back to bfloat16.
PROGRAM = """HloModule widened, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  g = bf16[64,128]{1,0} parameter(0)
  acc = f32[64,128]{1,0} parameter(1)
  wide = f32[64,128]{1,0} convert(g)
  moved = f32[64,128]{1,0} COLLECTIVE, channel_id=1, use_global_device_ids=true
  ROOT out = USE
}
"""
PERMUTE = "collective-permute(wide), source_target_pairs={{0,1},{1,0}}"
SUM = "all-reduce(wide), replica_groups={{0,1}}, to_apply=add"
ACCUMULATED = "f32[64,128]{1,0} add(acc, moved)"
ROUNDED = "bf16[64,128]{1,0} convert(moved)"
FLOAT32 = 64 * 128 * 4


def tpu_bytes(collective: str, use: str) -> int | None:
    text = PROGRAM.replace("COLLECTIVE", collective).replace("USE", use)
    (row,) = collectives_of(read_module(text), narrow=True).collectives
    assert row.bytes == FLOAT32
    return row.tpu_bytes


def test_a_widened_value_moves_in_bfloat16():
    # The TPU moves the conversion to the other side of a collective that only moves values.
    assert tpu_bytes(PERMUTE, ACCUMULATED) == FLOAT32 // 2


def test_a_sum_of_widened_values_rounded_after_it_is_a_bfloat16_sum():
    # The CPU compiler's float normalisation of a bfloat16 all-reduce: widened, summed, rounded back.
    assert tpu_bytes(SUM, ROUNDED) == FLOAT32 // 2


def test_a_sum_of_widened_values_kept_in_float32_is_a_float32_sum():
    # The program widened the values to sum them in float32 (an Explicit pipeline's visit gradient, typed
    # reduced, summed at every iteration and accumulated in float32): the TPU sums 4 bytes an element too.
    assert tpu_bytes(SUM, ACCUMULATED) is None
