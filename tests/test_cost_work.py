"""Work per step counted from compiled HLO (`shardscope.cost.work`) against XLA's own cost analysis.

XLA's figure counts every instruction once, so it is the reference for programs without loops; for a
scanned loop the reference is XLA's figure for the same loop unrolled (every trip written out), which our
count of the rolled loop must reach by multiplying by the trip count. XLA sums its figures in float32, so
they are compared to one part in a million.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from shardscope.hlo.module import read_module
from shardscope.hlo.work import StepWork, step_work


def cost(compiled) -> tuple[float, float]:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return analysis["flops"], analysis["bytes accessed"]


def work(compiled) -> StepWork:
    return step_work(read_module(compiled.as_text()))


def layers(x, ws, unroll):
    def layer(carry, w):
        return jax.nn.relu(carry @ w) + 1.0, None

    y, _ = jax.lax.scan(layer, x, ws, unroll=unroll)
    return (y * y).sum()


X = jnp.ones((256, 512))
WS = jnp.ones((6, 512, 512))


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"]) ** 2)


MLP = {"w1": jnp.ones((64, 128)), "b1": jnp.ones((128,)), "w2": jnp.ones((128, 16))}

PROGRAMS = {
    "matmul": (jnp.matmul, (jnp.ones((64, 128)), jnp.ones((128, 32)))),
    "mlp loss": (mlp, (MLP, jnp.ones((32, 64)))),
    "mlp gradient": (jax.grad(mlp), (MLP, jnp.ones((32, 64)))),
    "slices": (lambda a: a[2:5].sum() + a[:, 1].max(), (jnp.ones((8, 16)),)),
    "in-place update": (
        lambda a, b: jax.lax.dynamic_update_slice(a, b, (3, 0)) * 2,
        (jnp.ones((64, 8)), jnp.ones((4, 8))),
    ),
    "six layers, unrolled": (lambda x, ws: layers(x, ws, True), (X, WS)),
    "their gradient, unrolled": (jax.grad(lambda x, ws: layers(x, ws, True), argnums=1), (X, WS)),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_without_loops_costs_what_xla_says(name):
    fn, args = PROGRAMS[name]
    compiled = jax.jit(fn).lower(*args).compile()
    flops, accessed = cost(compiled)
    ours = work(compiled)
    assert ours.flops == pytest.approx(flops, rel=1e-6)
    assert ours.bytes_accessed == pytest.approx(accessed, rel=1e-6)
    assert ours.unknown_computations == 0


def test_a_scanned_loop_counts_every_trip():
    rolled = jax.jit(lambda x, ws: layers(x, ws, 1)).lower(X, WS).compile()
    unrolled = jax.jit(lambda x, ws: layers(x, ws, True)).lower(X, WS).compile()
    xla_rolled, _ = cost(rolled)
    xla_unrolled, _ = cost(unrolled)
    # XLA's own figure for the loop is one trip's: the reason this count exists.
    assert xla_rolled < xla_unrolled / 5
    # Ours for the loop is the unrolled program's, plus the loop counter's add and compare on each trip.
    assert work(rolled).flops == pytest.approx(xla_unrolled, rel=1e-6)
    assert work(rolled).flops >= work(unrolled).flops


def test_a_loop_whose_trips_are_unknown_is_left_out_and_said():
    text = """HloModule m

body {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,8] get-tuple-element(p), index=1
  d = f32[8,8] dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (s32[], f32[8,8]) tuple(i, d)
}

cond {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] parameter(1)
  ROOT lt = pred[] compare(i, i), direction=LT
}

ENTRY main {
  a = f32[8,8] parameter(0)
  z = s32[] constant(0)
  s = (s32[], f32[8,8]) tuple(z, a)
  w = (s32[], f32[8,8]) while(s), condition=cond, body=body
  x = f32[8,8] get-tuple-element(w), index=1
  ROOT e = f32[8,8] dot(x, a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    result = step_work(read_module(text))
    # Only the entry's dot counts (2 x 8 x 8 x 8 FLOPs); the loop's body and condition are unknown.
    assert result.flops == 2 * 8 * 8 * 8
    assert result.unknown_computations == 2


# A layer loop's kept activations: a stack of 80 [1024] rows, one written per trip and one read back, as a TPU
# program does it: the fusion that writes the row runs a nested in-place copy fusion over the stack first (a
# layout change, `output_to_operand_aliasing`), and the fusion that reads it takes the row in a nested fusion.
STACK_HLO = """HloModule m

relayout {
  s = bf16[80,1024] parameter(0)
  ROOT c = bf16[80,1024] copy(s)
}

write_row {
  stack = bf16[80,1024] parameter(0)
  i = s32[] parameter(1)
  row = bf16[1,1024] parameter(2)
  view = bf16[80,1024] fusion(stack), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=relayout
  z = s32[] constant(0)
  ROOT u = bf16[80,1024] dynamic-update-slice(view, row, i, z)
}

take_row {
  stack = bf16[80,1024] parameter(0)
  i = s32[] parameter(1)
  z = s32[] constant(0)
  ROOT d = bf16[1,1024] dynamic-slice(stack, i, z), dynamic_slice_sizes={1,1024}
}

read_row {
  stack = bf16[80,1024] parameter(0)
  i = s32[] parameter(1)
  row = bf16[1,1024] fusion(stack, i), kind=kLoop, calls=take_row
  ROOT n = bf16[1,1024] negate(row)
}

ENTRY main {
  stack = bf16[80,1024] parameter(0)
  i = s32[] parameter(1)
  row = bf16[1,1024] parameter(2)
  w = bf16[80,1024] fusion(stack, i, row), kind=kLoop, calls=write_row
  ROOT r = bf16[1,1024] fusion(w, i), kind=kLoop, calls=read_row
}
"""


def test_a_row_written_to_or_read_from_a_stack_through_nested_fusions_touches_the_row_only():
    row, index = 1024 * 2, 4
    # Writing: the row and the index read, the row written (the stack is updated in place, not read).
    # Reading: the row and the index read, the row written. Not the 80 rows of the stack.
    assert step_work(read_module(STACK_HLO)).bytes_accessed == (row + index + row) + (row + index + row)


def test_the_tpu_compiler_program_counts_as_its_own_cost_analysis_says():
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardscope.case.tpu import libtpu_version, parse_tpu_slice
    from shardscope.stages.devices import quiet_libtpu, tpu_devices

    if libtpu_version() is None:
        pytest.skip("needs the TPU extra (libtpu)")
    quiet_libtpu()
    devices = tpu_devices(parse_tpu_slice("v5p-8")).devices
    mesh = Mesh(np.array(devices), ("data",))
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    ws = jax.ShapeDtypeStruct((6, 512, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
    rolled = jax.jit(lambda x, ws: layers(x, ws, 1)).lower(x, ws).compile()
    unrolled = jax.jit(lambda x, ws: layers(x, ws, True)).lower(x, ws).compile()
    xla_unrolled, _ = cost(unrolled)
    assert work(unrolled).flops == pytest.approx(xla_unrolled, rel=1e-6)
    # Per device the batch is split four ways: six 64x512x512 matmuls, which the TPU compiler writes as
    # convolutions, in the rolled loop as in the unrolled program.
    matmuls = 6 * 2 * 64 * 512 * 512
    assert work(rolled).matmul_flops == work(unrolled).matmul_flops == matmuls
    # The rolled loop converts its carry on every trip, which the unrolled program does once: a sliver more.
    assert work(rolled).flops == pytest.approx(xla_unrolled, rel=0.01)


def test_a_plan_records_the_work_of_its_step():
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import shardscope

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    replicated = NamedSharding(mesh, P())
    compiled = jax.jit(mlp, in_shardings=replicated, out_shardings=replicated).lower(MLP, jnp.ones((32, 64))).compile()
    flops, accessed = cost(compiled)
    plan = shardscope.plan_compiled(compiled, mesh)
    compute = dict(plan.compute)
    assert compute["flops"] == pytest.approx(flops, rel=1e-6)
    assert compute["bytes_accessed"] == pytest.approx(accessed, rel=1e-6)
    assert "unknown_computations" not in compute


def test_a_program_jitted_without_a_mesh_is_planned_whole_on_one_device():
    from jax.sharding import Mesh

    import shardscope

    compiled = jax.jit(mlp).lower(MLP, jnp.ones((32, 64))).compile()
    plan = shardscope.plan_compiled(compiled, Mesh(jax.devices()[:1], ("data",)))
    assert {path: record.spec for path, record in plan.tensors} == {
        "inputs/0/b1": (None,),
        "inputs/0/w1": (None, None),
        "inputs/0/w2": (None, None),
        "inputs/1": (None, None),
        "outputs": (),
    }


# The same write as XLA's CPU compiler runs it on a bfloat16 stack (its float normalisation): the stack
# widened to float32, updated, and rounded back, all in one fusion. A TPU updates the bfloat16 stack in
# place: only the row moves.
WIDENED_STACK_HLO = """HloModule m

write_row {
  i = s32[] parameter(0)
  stack = bf16[80,1024] parameter(1)
  wide = f32[80,1024] convert(stack)
  row = bf16[1024] parameter(2)
  wide_row = f32[1024] convert(row)
  view = f32[1,1024] bitcast(wide_row)
  z = s32[] constant(0)
  u = f32[80,1024] dynamic-update-slice(wide, view, i, z)
  ROOT back = bf16[80,1024] convert(u)
}

ENTRY main {
  i = s32[] parameter(0)
  stack = bf16[80,1024] parameter(1)
  row = bf16[1024] parameter(2)
  ROOT w = bf16[80,1024] fusion(i, stack, row), kind=kLoop, calls=write_row
}
"""


def test_a_row_written_to_a_stack_widened_to_float32_and_back_touches_the_row_only():
    row, index = 1024 * 2, 4
    # The index and the bfloat16 row read, the row written at the stack's two bytes an element: not the
    # stack read and written whole (80 rows each way), as a widening conversion reads it.
    assert step_work(read_module(WIDENED_STACK_HLO)).bytes_accessed == index + row + row
