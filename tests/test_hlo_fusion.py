"""A CPU program's conversions and relayouts around its matmuls, which a TPU's matmuls do themselves."""

from __future__ import annotations

from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile

# As XLA's CPU compiler writes a bfloat16 matmul: its operand converted to float32 into a buffer of its
# own, its result transposed and converted back, and only then used by an add. A conversion that has
# nothing to do with a matmul (of `c`, for the add) stays.
AROUND_A_DOT = """HloModule around

ENTRY main {
  a = bf16[256,512]{1,0} parameter(0)
  b = f32[512,128]{1,0} parameter(1)
  c = bf16[128,256]{1,0} parameter(2)
  wide = f32[256,512]{1,0} convert(a)
  d = f32[256,128]{1,0} dot(wide, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[128,256]{1,0} transpose(d), dimensions={1,0}
  narrow = bf16[128,256]{1,0} convert(t)
  other = f32[128,256]{1,0} convert(c)
  back = bf16[128,256]{1,0} convert(other)
  ROOT sum = bf16[128,256]{1,0} add(narrow, back)
}
"""


def memory_bytes(cpu_program: bool) -> int:
    bins = work_profile(read_module(AROUND_A_DOT), cpu_program=cpu_program)
    return sum(entry.bytes for entry in bins if entry.kind == "memory")


def test_conversions_and_relayouts_of_a_matmuls_operand_and_result_move_nothing_in_a_cpu_program():
    wide = 256 * 512 * (2 + 4)
    transpose, narrow = 128 * 256 * (4 + 4), 128 * 256 * (4 + 2)
    other, back, add = 128 * 256 * (2 + 4), 128 * 256 * (4 + 2), 128 * 256 * 2 * 3
    assert memory_bytes(cpu_program=False) == wide + transpose + narrow + other + back + add
    # The operand's conversion and the result's transpose and conversion are the dot's on a TPU; the
    # conversions of `c`, which no matmul reads or writes, and the add are work of their own.
    assert memory_bytes(cpu_program=True) == other + back + add
