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
    # conversions of `c`, which no matmul reads or writes, and the add are work of their own, `other`'s
    # float32 result (made from bfloat16, rounded back by its one user) counted at two bytes an element
    # as the TPU would hold it.
    other, back = 128 * 256 * (2 + 2), 128 * 256 * (2 + 2)
    assert memory_bytes(cpu_program=True) == other + back + add


def test_a_cpu_programs_matmul_reads_and_writes_its_bfloat16_values_at_two_bytes_an_element():
    bins = {cpu: work_profile(read_module(AROUND_A_DOT), cpu_program=cpu) for cpu in (False, True)}
    matmul = {cpu: sum(entry.bytes for entry in found if entry.kind == "matmul") for cpu, found in bins.items()}
    assert matmul[False] == 256 * 512 * 4 + 512 * 128 * 4 + 256 * 128 * 4
    # `wide` is `a` converted (bfloat16 precision), `b` a float32 parameter (kept at four bytes), the
    # result rounded to bfloat16 by its only user (through the transpose): as the TPU's matmul reads
    # and writes them.
    assert matmul[True] == 256 * 512 * 2 + 512 * 128 * 4 + 256 * 128 * 2


# A gated MLP's product as XLA's CPU compiler writes it: `silu(a) · b` an elementwise op of its own that
# writes its result, converted for the matmul that reads it. `kept` is the same product read by an add
# too: it has to be written out whatever the compiler.
GATED = """HloModule gated

ENTRY main {
  a = bf16[256,512]{1,0} parameter(0)
  b = bf16[256,512]{1,0} parameter(1)
  w = f32[512,128]{1,0} parameter(2)
  s = bf16[256,512]{1,0} logistic(a)
  g = bf16[256,512]{1,0} multiply(s, b)
  wide = f32[256,512]{1,0} convert(g)
  d = f32[256,128]{1,0} dot(wide, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  kept = bf16[256,512]{1,0} multiply(a, b)
  wide_kept = f32[256,512]{1,0} convert(kept)
  e = f32[256,128]{1,0} dot(wide_kept, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  sum = bf16[256,512]{1,0} add(kept, a)
  ROOT t = (f32[256,128]{1,0}, f32[256,128]{1,0}, bf16[256,512]{1,0}) tuple(d, e, sum)
}
"""


def test_elementwise_ops_that_only_feed_matmuls_move_nothing_in_a_cpu_program():
    bins = {cpu: work_profile(read_module(GATED), cpu_program=cpu) for cpu in (False, True)}
    memory = {cpu: sum(entry.bytes for entry in found if entry.kind == "memory") for cpu, found in bins.items()}
    unary, binary, widen = 256 * 512 * 2 * 2, 256 * 512 * 2 * 3, 256 * 512 * (2 + 4)
    # The TPU's program as compiled: the sigmoid, both products, both conversions and the add.
    assert memory[False] == unary + binary + widen + binary + widen + binary
    # As the TPU runs it: the sigmoid and its product feed the matmul only (through its conversion), so
    # the matmul computes them as it reads; `kept` is read by the add too, so it is written (its conversion
    # is the matmul's), and the add is work of its own.
    assert memory[True] == binary + binary
