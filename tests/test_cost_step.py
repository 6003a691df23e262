"""The per-op work profile of a compiled step (`shardscope.hlo.profile`) and the expected step time priced
from it (`shardscope.cost.step`).

The profile is checked against what the program is made of (a compiled matmul's FLOPs and bytes, the ops
of a scanned loop times its trips, a named scope, a host-memory buffer); the expected step against the
arithmetic its definition gives and against the two bounds it must lie between.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import shardscope
from shardscope.case.hardware import load_hardware
from shardscope.case.tpu import libtpu_version
from shardscope.cost.step import bin_seconds, expected_step, host_seconds, per_op_compute
from shardscope.hlo.attention_kernels import causal_block_fraction
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import BINS_PER_OCTAVE, WorkBin, work_profile
from shardscope.hlo.shapes import hbm_bytes
from shardscope.hlo.work import step_work
from shardscope.plan.estimate import RowTime
from shardscope.plan.records import CollectiveRow


def profile_of(function, *args) -> tuple[WorkBin, ...]:
    return work_profile(read_module(jax.jit(function).lower(*args).compile().as_text()))


def test_a_matmul_is_one_matmul_op_with_its_flops_and_its_operands_and_result_as_bytes():
    a, b = jnp.ones((256, 512), jnp.float32), jnp.ones((512, 128), jnp.float32)
    bins = profile_of(jnp.matmul, a, b)
    matmuls = [entry for entry in bins if entry.kind == "matmul"]
    assert sum(entry.flops for entry in matmuls) == 2 * 256 * 512 * 128
    assert sum(entry.bytes for entry in matmuls) == 4 * (256 * 512 + 512 * 128 + 256 * 128)
    assert sum(entry.ops for entry in matmuls) == 1


def test_a_scanned_loop_counts_its_body_once_per_trip_and_the_profile_sums_to_the_step_work():
    x, ws = jnp.ones((128, 256)), jnp.ones((6, 256, 256))

    def layers(x, ws):
        y, _ = jax.lax.scan(lambda c, w: (jax.nn.relu(c @ w), None), x, ws)
        return y.sum()

    text = jax.jit(layers).lower(x, ws).compile().as_text()
    bins = work_profile(read_module(text))
    in_loop = [entry for entry in bins if entry.kind == "matmul" and entry.executions == 6]
    assert sum(entry.flops for entry in in_loop) == 6 * 2 * 128 * 256 * 256
    # Every matrix FLOP of the step is in the profile, once.
    assert sum(entry.flops for entry in bins) == step_work(read_module(text)).matmul_flops


def test_ops_in_the_attention_kernel_marker_are_the_kernels_flops_without_bytes():
    import shardscope.kernels

    def attention(q, k):
        with shardscope.kernels.attention_kernel():
            return jax.nn.softmax(q @ k.T).sum()

    bins = profile_of(attention, jnp.ones((128, 64)), jnp.ones((128, 64)))
    kernel = [entry for entry in bins if entry.kind == "kernel"]
    assert sum(entry.flops for entry in kernel) == 2 * 128 * 64 * 128
    assert all(entry.bytes == 0 for entry in kernel)
    assert not [entry for entry in bins if entry.kind == "matmul"]


def test_matmuls_in_the_grouped_marker_are_the_grouped_kernels_with_their_flops_and_bytes():
    import shardscope.kernels

    def experts(tokens, w, v):
        with shardscope.kernels.grouped_matmul_kernel():
            hidden = jnp.einsum("xce,xem->xcm", tokens, w)
        return (hidden @ v).sum()  # outside the scope: an ordinary matmul

    tokens, w, v = jnp.ones((4, 32, 64)), jnp.ones((4, 64, 128)), jnp.ones((128, 16))
    bins = profile_of(experts, tokens, w, v)
    grouped = [entry for entry in bins if entry.kind == "grouped"]
    assert sum(entry.flops for entry in grouped) == 2 * 4 * 32 * 64 * 128
    assert sum(entry.bytes for entry in grouped) == 4 * (4 * 32 * 64 + 4 * 64 * 128 + 4 * 32 * 128)
    assert sum(entry.flops for entry in bins if entry.kind == "matmul") == 2 * 4 * 32 * 128 * 16


def test_the_grouped_kernel_runs_narrow_experts_further_below_peak():
    # The table's relation: the matmuls' fraction × (width / reference) ** exponent, never above theirs.
    tuned = dataclasses.replace(V5P, mxu_efficiency=0.8, grouped_reference_width=8192.0, grouped_width_exponent=0.5)
    assert tuned.grouped_efficiency(2048) == pytest.approx(0.8 * 0.5)
    assert tuned.grouped_efficiency(32768) == pytest.approx(0.8)
    entry = work("grouped", 1, 10**12, 10**6)
    assert bin_seconds(entry, tuned, expert_width=2048) == pytest.approx(10**12 / (V5P.flops_per_device * 0.4))
    # Without a width (no experts known) or without the table's relation, as the matmuls.
    matmul = work("matmul", 1, 10**12, 10**6)
    assert bin_seconds(entry, tuned) == bin_seconds(matmul, tuned)
    untuned = dataclasses.replace(tuned, grouped_reference_width=None)
    assert bin_seconds(entry, untuned, expert_width=2048) == bin_seconds(matmul, untuned)


def test_bins_are_quarter_octaves_of_arithmetic_intensity():
    a, b = jnp.ones((256, 512), jnp.float32), jnp.ones((512, 128), jnp.float32)
    (matmul,) = [entry for entry in profile_of(jnp.matmul, a, b) if entry.kind == "matmul"]
    intensity = matmul.flops / matmul.bytes
    assert 2 ** (matmul.intensity / BINS_PER_OCTAVE) <= intensity < 2 ** ((matmul.intensity + 1) / BINS_PER_OCTAVE)


HOST_UPDATE = """HloModule offload, entry_computation_layout={()->f32[8,128]{1,0:S(5)}}

ENTRY main {
  buffer = f32[8,128]{1,0:S(5)} parameter(0)
  update = f32[1,128]{1,0} parameter(1)
  zero = s32[] constant(0)
  three = s32[] constant(3)
  ROOT offloaded = f32[8,128]{1,0:S(5)} dynamic-update-slice(buffer, update, three, zero)
}
"""


def test_an_update_of_a_host_buffer_is_a_host_transfer_of_the_update():
    bins = work_profile(read_module(HOST_UPDATE))
    (host,) = [entry for entry in bins if entry.kind == "host"]
    assert host.bytes == 4 * 128 and host.flops == 0


def test_only_arrays_in_hbm_count_as_hbm_bytes():
    assert hbm_bytes("f32[8,16]{1,0:T(8,128)}") == 512
    assert hbm_bytes("f32[8,16]{1,0:T(8,128)S(1)}") == 0  # prefetched into vector memory
    assert hbm_bytes("(f32[8,16]{1,0}, bf16[4]{0:S(5)}, s32[])") == 512 + 4  # the host buffer is not HBM


V5P = load_hardware("v5p")


def work(kind: str, executions: int, flops: int, nbytes: int, pass_: str = "forward") -> WorkBin:
    return WorkBin(kind, pass_, executions, None, executions, flops, nbytes)


def row(trips: int, pass_: str = "forward") -> CollectiveRow:
    return CollectiveRow("all-gather", ("fsdp",), "bfloat16", (8,), 16, 1, trips, pass_, "decoder")


def test_an_op_takes_the_longer_of_its_flops_and_its_bytes_at_the_calibrated_rates():
    tuned = dataclasses.replace(V5P, mxu_efficiency=0.5, hbm_efficiency=0.8)
    compute_bound = work("matmul", 1, 10**12, 10**6)
    memory_bound = work("memory", 1, 0, 10**10)
    assert bin_seconds(compute_bound, tuned) == pytest.approx(10**12 / (V5P.flops_per_device * 0.5))
    assert bin_seconds(memory_bound, tuned) == pytest.approx(10**10 / (V5P.hbm_bandwidth_per_device * 0.8))
    # The attention kernel: its FLOPs only (its scores stay on chip), at its own fraction of peak, else the
    # matmuls'.
    kernel = work("kernel", 1, 10**12, 10**12)
    assert bin_seconds(kernel, dataclasses.replace(tuned, kernel_efficiency=0.25)) == pytest.approx(
        10**12 / (V5P.flops_per_device * 0.25)
    )
    assert bin_seconds(kernel, dataclasses.replace(tuned, kernel_efficiency=None)) == bin_seconds(compute_bound, tuned)
    assert host_seconds(work("host", 1, 0, 10**9), tuned) == pytest.approx(10**9 / V5P.host_bandwidth_per_device)


def test_a_cpu_programs_gathers_and_elementwise_ops_count_at_their_own_factors():
    tuned = dataclasses.replace(V5P, hbm_efficiency=0.5, cpu_memory_bytes_factor=0.25, cpu_gather_bytes_factor=0.75)
    rate = V5P.hbm_bandwidth_per_device * 0.5
    memory, gather = work("memory", 1, 0, 10**10), work("gather", 1, 0, 10**10)
    assert bin_seconds(memory, tuned, cpu_program=True) == pytest.approx(0.25 * 10**10 / rate)
    assert bin_seconds(gather, tuned, cpu_program=True) == pytest.approx(0.75 * 10**10 / rate)
    # A TPU compile's bytes are the TPU's: no factor, a gather as any op without matrix work; and so are a
    # CPU compile's buffers of a scatter into zeros, counted as the TPU writes them.
    assert bin_seconds(gather, tuned) == bin_seconds(memory, tuned) == pytest.approx(10**10 / rate)
    buffer = work("buffer", 1, 0, 10**10)
    assert bin_seconds(buffer, tuned, cpu_program=True) == bin_seconds(buffer, tuned) == pytest.approx(10**10 / rate)


def test_collectives_hide_behind_the_compute_of_the_loop_they_run_in_and_no_other():
    layers = work("matmul", 48, 48 * 10**10, 1)  # 48 layer iterations of compute
    outside = work("memory", 1, 0, 10**9)  # the optimizer update, once
    in_loop = (row(48), RowTime(0.5 * bin_seconds(layers, V5P), 0.0, 0.0))  # half the loop's compute
    once = (row(1, "other"), RowTime(3 * bin_seconds(outside, V5P), 0.0, 0.0))  # three times the update
    expected = expected_step([layers, outside], [in_loop, once], V5P)
    # The loop's collectives are hidden; the update hides a third of the last one.
    assert expected == pytest.approx(bin_seconds(layers, V5P) + 3 * bin_seconds(outside, V5P))
    compute = per_op_compute([layers, outside], V5P)
    communication = in_loop[1].seconds + once[1].seconds
    assert max(compute, communication) <= expected <= compute + communication


def test_unpriced_rows_add_nothing():
    layers = work("matmul", 4, 4 * 10**10, 1)
    unpriced = (row(4), RowTime(None, 0.0, 0.0, "unknown loop trip count"))
    assert expected_step([layers], [unpriced], V5P) == bin_seconds(layers, V5P)


def tpu_traffic(plan) -> int:
    """Bytes per device per step as a TPU moves them (a CPU plan's rows say so in `tpu_bytes`)."""
    return sum((r.bytes if r.tpu_bytes is None else r.tpu_bytes) * r.count * r.loop_trips for r in plan.collectives)


@pytest.mark.slow
@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_a_cpu_program_priced_as_a_tpu_moves_what_the_tpu_program_moves():
    # XLA's CPU compiler moves a bfloat16 model's weights and gradients in float32; the TPU's in bfloat16.
    settings = {"model.dtype": "bfloat16"}
    cpu = shardscope.plan_case("llama-tiny", "default", "cpu-8", settings=settings)
    tpu = shardscope.plan_case("llama-tiny", "default", "v5p-16", settings=settings)
    as_cpu = sum(r.bytes * r.count * r.loop_trips for r in cpu.collectives)
    assert as_cpu > 1.8 * tpu_traffic(tpu)  # the CPU program's own bytes: float32
    assert tpu_traffic(cpu) == pytest.approx(tpu_traffic(tpu), rel=0.10)
    assert all(r.tpu_bytes is None for r in tpu.collectives)


# XLA's CPU compiler's expansion of a scatter-add (an embedding's gradient): a loop over the 512 updates,
# each trip rewriting the [1000, 64] operand in place.
SCATTER_LOOP = """HloModule scatter

body {
  p = (s32[], f32[1000,64]{1,0}, s32[512]{0}, f32[512,64]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  operand = f32[1000,64]{1,0} get-tuple-element(p), index=1
  indices = s32[512]{0} get-tuple-element(p), index=2
  updates = f32[512,64]{1,0} get-tuple-element(p), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  zero = s32[] constant(0)
  row = f32[1,64]{1,0} dynamic-slice(updates, i, zero), dynamic_slice_sizes={1,64}
  updated = f32[1000,64]{1,0} dynamic-update-slice(operand, row, i, zero)
  ROOT t = (s32[], f32[1000,64]{1,0}, s32[512]{0}, f32[512,64]{1,0}) tuple(next, updated, indices, updates)
}

cond {
  p = (s32[], f32[1000,64]{1,0}, s32[512]{0}, f32[512,64]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(512)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  operand = f32[1000,64]{1,0} parameter(0)
  indices = s32[512]{0} parameter(1)
  updates = f32[512,64]{1,0} parameter(2)
  zero = s32[] constant(0)
  init = (s32[], f32[1000,64]{1,0}, s32[512]{0}, f32[512,64]{1,0}) tuple(zero, operand, indices, updates)
  loop = (s32[], f32[1000,64]{1,0}, s32[512]{0}, f32[512,64]{1,0}) while(init), condition=cond, body=body,
    metadata={op_name="jit(step)/transpose(jvp(Model))/embed/scatter-add"}
  ROOT result = f32[1000,64]{1,0} get-tuple-element(loop), index=1
}
"""


def test_a_scatter_the_cpu_compiler_expanded_into_a_loop_counts_as_one_scatter():
    bins = work_profile(read_module(SCATTER_LOOP))
    assert all(entry.executions == 1 for entry in bins)  # nothing of the 512-trip loop body is counted
    (scatter,) = [entry for entry in bins if entry.ops == 1 and entry.pass_ == "backward"]
    # Indices and updates read, the rows they touch read and written; it moves rows by index.
    assert scatter.bytes == 3 * (512 * 4 + 512 * 64 * 4)
    assert scatter.kind == "gather"


def test_an_op_that_gathers_rows_by_index_is_a_gather_op_apart_from_the_elementwise_ones():
    table, ids = jnp.ones((1000, 64), jnp.float32), jnp.arange(256, dtype=jnp.int32) * 3

    def lookup(table, ids):
        return jnp.sin(table).sum() + jnp.take(table, ids, axis=0).sum()

    bins = profile_of(lookup, table, ids)
    gathers = [entry for entry in bins if entry.kind == "gather"]
    assert gathers and all(entry.flops == 0 for entry in gathers)
    # At least the rows it reads: 256 rows of 64 float32.
    assert sum(entry.bytes for entry in gathers) >= 256 * 64 * 4
    # The elementwise pass over the table is not one.
    assert sum(entry.bytes for entry in bins if entry.kind == "memory") >= 1000 * 64 * 4


# The CPU compiler's layout copy of the kernel's scores has no metadata; the residual add after it has.
KERNEL_COPY = """HloModule kernel

ENTRY main {
  q = f32[128,64]{1,0} parameter(0)
  k = f32[128,64]{1,0} parameter(1)
  scores = f32[128,128]{1,0} dot(q, k), lhs_contracting_dims={1}, rhs_contracting_dims={1},
    metadata={op_name="jit(step)/attention/shardscope.kernel.attention/dot_general"}
  moved = f32[128,128]{0,1} copy(scores)
  other = f32[128,64]{1,0} add(q, k), metadata={op_name="jit(step)/add"}
  ROOT out = (f32[128,128]{0,1}, f32[128,64]{1,0}) tuple(moved, other)
}
"""


def test_unnamed_ops_next_to_the_kernel_are_the_kernels():
    bins = work_profile(read_module(KERNEL_COPY))
    kernel = [entry for entry in bins if entry.kind == "kernel"]
    assert sum(entry.ops for entry in kernel) == 2  # the dot and its unnamed copy
    assert all(entry.bytes == 0 for entry in kernel)
    (memory,) = [entry for entry in bins if entry.kind == "memory"]
    assert memory.bytes == 3 * 128 * 64 * 4  # the named add is not the kernel's


# A vmapped layer on the CPU: the query projection runs as a library fusion without metadata, its result
# converted (unnamed too) and read by the kernel's reshape; what it multiplies is the layer's normalised input.
PROJECTION_INTO_KERNEL = """HloModule projection

ENTRY main {
  x = f32[256,64]{1,0} parameter(0)
  w = f32[64,64]{1,0} parameter(1)
  normed = f32[256,64]{1,0} multiply(x, x), metadata={op_name="jit(step)/jvp(layer)/pre_attention_norm/mul"}
  projected = f32[256,64]{1,0} dot(normed, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  narrowed = bf16[256,64]{1,0} convert(projected)
  heads = bf16[4,64,64]{2,1,0} reshape(narrowed),
    metadata={op_name="jit(step)/jvp(layer)/attention/shardscope.kernel.attention/reshape"}
  ROOT scores = bf16[4,64,64]{2,1,0} dot(heads, heads), lhs_batch_dims={0}, rhs_batch_dims={0},
    lhs_contracting_dims={2}, rhs_contracting_dims={2},
    metadata={op_name="jit(step)/jvp(layer)/attention/shardscope.kernel.attention/dot_general"}
}
"""


def test_a_projection_the_kernel_reads_is_a_matmul_of_its_own():
    # Its reader is the kernel's, but the named op it reads is the layer's: a matmul at its own bytes, where
    # counting it with the kernel priced it at the kernel's efficiency (a pipeline's stages on the CPU route).
    bins = work_profile(read_module(PROJECTION_INTO_KERNEL))
    flops = {kind: sum(entry.flops for entry in bins if entry.kind == kind) for kind in ("kernel", "matmul")}
    assert flops == {"kernel": 2 * 4 * 64 * 64 * 64, "matmul": 2 * 256 * 64 * 64}


# The CPU compiler writes the stand-in's matmuls out anew without metadata: one against the other sequence
# shards' keys (its reader in the off-diagonal scope), one of the scope's probabilities whose result a
# combining add outside the scope reads, and one of the diagonal block's (neither).
OFF_DIAGONAL = """HloModule off_diagonal

ENTRY main {
  q = f32[64,32]{1,0} parameter(0)
  k = f32[128,32]{1,0} parameter(1)
  v = f32[128,32]{1,0} parameter(2)
  mask = pred[64,128]{1,0} parameter(3)
  low = f32[64,128]{1,0} parameter(4)
  d = f32[64,64]{1,0} parameter(5)
  scores = f32[64,128]{1,0} dot(q, k), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  masked = f32[64,128]{1,0} select(mask, scores, low),
    metadata={op_name="jit(step)/jvp(attention)/shardscope.kernel.attention/shard_map/shardscope.kernel.half_visited/select_n"}
  probs = f32[64,128]{1,0} exponential(masked),
    metadata={op_name="jit(step)/jvp(attention)/shardscope.kernel.attention/shard_map/shardscope.kernel.half_visited/exp"}
  moved = f32[64,128]{0,1} copy(probs)
  out = f32[64,32]{1,0} dot(moved, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  diag = f32[64,64]{1,0} dot(q, q), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  diag_out = f32[64,32]{1,0} dot(diag, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  both = f32[64,32]{1,0} add(out, diag_out),
    metadata={op_name="jit(step)/jvp(attention)/shardscope.kernel.attention/shard_map/add"}
  ROOT result = (f32[64,32]{1,0}, f32[64,64]{1,0}) tuple(both, d)
}
"""


def test_the_stand_ins_matmuls_against_the_other_shards_keys_count_half():
    # Each sequence shard sees the shards before it wholly and the others not at all; MaxText's load-balanced
    # order makes every shard visit half of them, where the stand-in multiplies against all of them under a
    # mask. Its unnamed matmuls are told by the nearest named ops they feed or read, and take their pass.
    bins = work_profile(read_module(OFF_DIAGONAL))
    kernel = [entry for entry in bins if entry.kind == "kernel"]
    off_diagonal = 2 * 64 * 128 * 32 * 2  # scores and values against the other shards' 128 keys
    diagonal = 2 * 64 * 64 * 32 * 2
    assert sum(entry.flops for entry in kernel) == off_diagonal // 2 + diagonal
    assert {entry.pass_ for entry in kernel if entry.flops} == {"forward"}


def test_a_loop_nested_in_a_loop_is_the_outer_loops_region():
    def nested(x, ws):
        def layer(c, w):
            inner, _ = jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), c, None, length=3)
            return inner, None

        return jax.lax.scan(layer, x, ws)[0].sum()

    bins = profile_of(nested, jnp.ones((64, 64)), jnp.ones((5, 64, 64)))
    (inner,) = [entry for entry in bins if entry.kind == "matmul"]
    assert (inner.executions, inner.region) == (15, 5)


SPLASH = """HloModule splash, entry_computation_layout={()->bf16[1,2,1024,64]{3,2,1,0}}

ENTRY main {
  mask = s8[1,4,4]{2,1,0} parameter(0)
  q = bf16[1,2,1024,64]{3,2,1,0} parameter(1)
  k = bf16[1,2,1024,64]{3,2,1,0} parameter(2)
  v = bf16[1,2,1024,64]{3,2,1,0} parameter(3)
  do = bf16[1,2,1024,64]{3,2,1,0} parameter(4)
  splash_mha_fwd_residuals_block_q_256.1 = (bf16[1,2,1024,64]{3,2,1,0}, f32[1,2,1024,64]{3,2,1,0})
    custom-call(mask, q, k, v), custom_call_target="tpu_custom_call"
  splash_mha_dkv_block_q_dkv_256.1 = (bf16[1,2,1024,64]{3,2,1,0}, bf16[1,2,1024,64]{3,2,1,0})
    custom-call(mask, q, k, v, do), custom_call_target="tpu_custom_call"
  other_kernel.1 = bf16[1,2,1024,64]{3,2,1,0} custom-call(q, k), custom_call_target="tpu_custom_call"
  ROOT out = bf16[1,2,1024,64]{3,2,1,0} get-tuple-element(splash_mha_fwd_residuals_block_q_256.1), index=0
}
"""


def test_a_pallas_attention_kernel_is_the_kernel_with_the_flops_its_shapes_and_causal_blocks_give():
    # MaxText's splash kernels are custom calls: their FLOPs come from q/k's shapes, the pass from the
    # kernel's name (forward: 2 matmuls of [1024 × 1024] scores per head, key/value gradient: 4), and the
    # 4 × 4 block mask of a causal kernel visits 10 of its 16 blocks. Another Pallas kernel stays a memory op.
    bins = work_profile(read_module(SPLASH))
    kernel = [entry for entry in bins if entry.kind == "kernel"]
    one_matmul = 2 * 1 * 2 * 1024 * 1024 * 64
    assert sum(entry.flops for entry in kernel) == round((2 + 4) * one_matmul * 10 / 16)
    assert all(entry.bytes == 0 for entry in kernel)
    assert sum(entry.ops for entry in bins if entry.kind == "memory") == 1  # other_kernel.1


def test_a_kernel_named_after_the_shard_map_around_it_is_told_by_its_op_name():
    # Inside a vmap (a pipeline's stages with Explicit axes) the TPU compiler names each kernel call after the
    # shard_map around it; only its op_name keeps the kernel's own name, and with it the kernel's pass.
    scope = "jit(train_step)/vmap(LlamaLayer)/self_attention/shard_map/vmap(static_sparsity_splash)"
    renamed = SPLASH
    for number, (kernel, pass_name) in enumerate(
        (
            ("splash_mha_fwd_residuals_block_q_256.1", "splash_mha_fwd_residuals"),
            ("splash_mha_dkv_block_q_dkv_256.1", "splash_mha_dkv_no_residuals"),
        )
    ):
        metadata = f'metadata={{op_name="{scope}/jit(_splash_attention)/{pass_name}/shard_map/pallas_call"}}'
        renamed = renamed.replace(f"{kernel} =", f"shard_map.{number} =").replace(
            f"({kernel})", f"(shard_map.{number})"
        )
        renamed = renamed.replace(
            'custom_call_target="tpu_custom_call"\n', f'custom_call_target="tpu_custom_call", {metadata}\n', 1
        )
    assert "splash_mha_fwd_residuals_block" not in renamed and renamed.count("pallas_call") == 2
    flops = [sum(e.flops for e in work_profile(read_module(text)) if e.kind == "kernel") for text in (renamed, SPLASH)]
    assert flops[0] == flops[1] > 0


def test_a_kernel_of_longer_query_blocks_than_key_blocks_visits_its_causal_blocks_only():
    # MaxText runs with sa_block_q=2048 and key blocks of 512 on 4096 tokens: a [2 × 8] grid. Query block 0
    # sees key blocks 0-3, query block 1 all 8: 12 of 16 blocks, as on a square grid of 2 (3 of 4).
    rectangular = work_profile(read_module(SPLASH.replace("mask = s8[1,4,4]", "mask = s8[1,2,8]")))
    square = work_profile(read_module(SPLASH.replace("mask = s8[1,4,4]", "mask = s8[1,2,2]")))
    one_matmul = 2 * 1 * 2 * 1024 * 1024 * 64
    flops = [sum(entry.flops for entry in bins if entry.kind == "kernel") for bins in (rectangular, square)]
    assert flops == [round((2 + 4) * one_matmul * 12 / 16)] * 2
    assert causal_block_fraction(8, 2) == causal_block_fraction(2, 8) == 0.75
    assert causal_block_fraction(5) == 6 / 10  # the square grid's (n + 1) / 2n


def test_queries_split_along_the_sequence_visit_the_whole_grids_causal_blocks_on_average():
    # Context parallelism over 2 devices: each runs 512 queries against all 1024 keys, a [2 × 4] grid of its
    # shard of the [4 × 4] causal mask. The shards visit 3 and 7 of their 8 blocks; balanced (MaxText's token
    # order), each does the average, 10 of the whole grid's 16 blocks: half the unsplit kernel's FLOPs.
    split = SPLASH.replace("mask = s8[1,4,4]", "mask = s8[1,2,4]").replace(
        "q = bf16[1,2,1024,64]", "q = bf16[1,2,512,64]"
    )
    one_matmul = 2 * 1 * 2 * 512 * 1024 * 64
    flops = sum(entry.flops for entry in work_profile(read_module(split)) if entry.kind == "kernel")
    assert flops == round((2 + 4) * one_matmul * 10 / 16)
    whole = sum(entry.flops for entry in work_profile(read_module(SPLASH)) if entry.kind == "kernel")
    assert 2 * flops == whole


def test_a_kernel_whose_batch_of_one_the_compiler_dropped_counts_the_same():
    # q, k and v as [heads, length, head dim]: a batch of one on the device, folded away.
    rank3 = SPLASH.replace("bf16[1,2,1024,64]{3,2,1,0}", "bf16[2,1024,64]{2,1,0}")
    flops = [sum(e.flops for e in work_profile(read_module(text)) if e.kind == "kernel") for text in (rank3, SPLASH)]
    assert flops[0] == flops[1] > 0


def test_a_fused_backward_kernel_is_told_by_its_three_gradients_with_or_without_a_batch():
    # The fused backward kernel returns the queries' gradient too (dq, dk, dv beside [block × dim] scratch):
    # five matmuls per block, where the key/value kernel runs four. Its batch of one folded away, the
    # gradients are [heads, length, dim].
    dkv = "splash_mha_dkv_block_q_dkv_256.1 = (bf16[1,2,1024,64]{3,2,1,0}, bf16[1,2,1024,64]{3,2,1,0})"
    fused = "splash_mha_dkv_block_q_dkv_256.1 = (f32[256,64]{1,0}, bf16[1,2,1024,64]{3,2,1,0}, "
    fused += "bf16[1,2,1024,64]{3,2,1,0}, bf16[1,2,1024,64]{3,2,1,0})"
    with_batch = SPLASH.replace(dkv, fused)
    folded = with_batch.replace("bf16[1,2,1024,64]{3,2,1,0}", "bf16[2,1024,64]{2,1,0}")
    one_matmul = 2 * 1 * 2 * 1024 * 1024 * 64
    for text in (with_batch, folded):
        flops = sum(entry.flops for entry in work_profile(read_module(text)) if entry.kind == "kernel")
        assert flops == round((2 + 5) * one_matmul * 10 / 16)


def test_a_kernel_with_narrower_value_heads_counts_them_where_values_enter():
    # MLA's values are narrower than its queries and keys: of the forward kernel's two matmuls one is over the
    # query/key head dimension (64 here), one over the value's (32); of the key/value gradient's four, two each.
    narrow = SPLASH.replace("v = bf16[1,2,1024,64]", "v = bf16[1,2,1024,32]")
    narrow = narrow.replace("do = bf16[1,2,1024,64]", "do = bf16[1,2,1024,32]")
    kernel = [entry for entry in work_profile(read_module(narrow)) if entry.kind == "kernel"]
    per_dim = 2 * 1 * 2 * 1024 * 1024 * 10 / 16
    assert sum(entry.flops for entry in kernel) == round(per_dim * (64 + 32)) + round(per_dim * (2 * 64 + 2 * 32))


# A TPU program's generic async wrappers: a prefetch of a slice into vector memory, and an offloaded
# stack read back from host memory one layer at a time.
ASYNC_WRAPPED = """HloModule wrapped

%prefetch (source: s8[4096]) -> s8[1024] {
  %source = s8[4096]{0} parameter(0)
  ROOT %piece = s8[1024]{0:S(1)} slice(%source), slice={[0:1024]}
}

%reload (stack: f32[8,128], i: s32[]) -> f32[1,128] {
  %stack = f32[8,128]{1,0:S(5)} parameter(0)
  %i = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %layer = f32[1,128]{1,0} dynamic-slice(%stack, %i, %zero), dynamic_slice_sizes={1,128}
}

ENTRY main {
  buffer = s8[4096]{0} parameter(0)
  stack = f32[8,128]{1,0:S(5)} parameter(1)
  three = s32[] constant(3)
  slice-start = ((s8[4096]{0}), s8[1024]{0:S(1)}, s32[]) async-start(buffer), calls=%prefetch
  slice-done = s8[1024]{0:S(1)} async-done(slice-start)
  reload-start = ((f32[8,128]{1,0:S(5)}, s32[]), f32[1,128]{1,0}, s32[]) async-start(stack, three), calls=%reload
  reload-done = f32[1,128]{1,0} async-done(reload-start)
  ROOT out = (s8[1024]{0:S(1)}, f32[1,128]{1,0}) tuple(slice-done, reload-done)
}
"""


def test_an_async_wrapper_accesses_what_the_op_it_wraps_does():
    # The prefetch reads its 1 KiB slice of HBM (the result is in vector memory), not the 4 KiB source; the
    # reload is a host transfer of one layer, not HBM traffic of the stack; the computations they call are
    # not counted a second time.
    bins = work_profile(read_module(ASYNC_WRAPPED))
    (host,) = [entry for entry in bins if entry.kind == "host"]
    assert host.bytes == 128 * 4
    memory = [entry for entry in bins if entry.kind == "memory"]
    assert sum(entry.bytes for entry in memory) == 1024 and sum(entry.ops for entry in memory) == 1


# The TPU compiler sinks the constant the stand-in's masked scores start from out of the rematerialised
# call and names it after the call: a broadcast only kernel ops read.
KERNEL_ZEROS = """HloModule kernel_zeros

ENTRY main {
  q = f32[128,64]{1,0} parameter(0)
  k = f32[128,64]{1,0} parameter(1)
  zero = f32[] constant(0)
  zeros = f32[128,128]{1,0} broadcast(zero), dimensions={}, metadata={op_name="jit(step)/while/body/closed_call"}
  scores = f32[128,128]{1,0} dot(q, k), lhs_contracting_dims={1}, rhs_contracting_dims={1},
    metadata={op_name="jit(step)/attention/shardscope.kernel.attention/dot_general"}
  ROOT masked = f32[128,128]{1,0} maximum(scores, zeros),
    metadata={op_name="jit(step)/attention/shardscope.kernel.attention/max"}
}
"""


def test_a_broadcast_only_the_kernel_reads_is_the_kernels():
    bins = work_profile(read_module(KERNEL_ZEROS))
    assert [entry.kind for entry in bins] == ["kernel"] * len(bins)
    assert sum(entry.ops for entry in bins) == 3  # the dot, the max, and the broadcast they read


def test_a_kernel_records_its_sequence_minor_operands_and_counts_the_same():
    # `sa_q_layout=SEQ_MINOR sa_v_layout=SEQ_MINOR`: q and v arrive as [.., head dim, length], and the
    # kernel's recorded configuration says so (tokamax's QKVLayout: HEAD_DIM_MINOR 1, SEQ_MINOR 2). Read
    # by their shapes alone, v's length would be taken for its head dimension (16x the value matmul's FLOPs).
    recorded = (
        'frontend_attributes={kernel_metadata={\n"xprof_metadata":"{\\"block_q\\": 256, '
        '\\"q_layout\\": 2, \\"k_layout\\": 1, \\"v_layout\\": 2}"\n}}'
    )
    # Queries split over 2 devices along the sequence (context parallelism: 512 queries against 1024 keys),
    # where reading q's head dimension as its length no longer gives the same product.
    split = SPLASH.replace("mask = s8[1,4,4]", "mask = s8[1,2,4]").replace(
        "q = bf16[1,2,1024,64]", "q = bf16[1,2,512,64]"
    )
    seq_minor = (
        split.replace("q = bf16[1,2,512,64]", "q = bf16[1,2,64,512]")
        .replace("v = bf16[1,2,1024,64]", "v = bf16[1,2,64,1024]")
        .replace('custom_call_target="tpu_custom_call"\n', f'custom_call_target="tpu_custom_call", {recorded}\n', 2)
    )
    unrecorded = seq_minor.replace(recorded, "metadata={}")
    flops = [
        sum(e.flops for e in work_profile(read_module(text)) if e.kind == "kernel")
        for text in (seq_minor, split, unrecorded)
    ]
    assert flops[0] == flops[1] > 0
    assert flops[2] != flops[1]  # what the shapes alone gave


def test_a_kernel_given_the_list_of_blocks_it_visits_counts_its_causal_blocks_from_its_recorded_sizes():
    # tokamax's static sparsity: the mask arrives as the 10 blocks a causal 4 x 4 grid visits (an int8 [10]),
    # not as the grid; the kernel records its block sizes (256 of 1024: a 4 x 4 grid per pass).
    recorded = (
        'frontend_attributes={kernel_metadata={\n"xprof_metadata":"{\\"block_q\\": 256, \\"block_kv\\": 256, '
        '\\"block_q_dkv\\": 256, \\"block_kv_dkv\\": 256, \\"q_layout\\": 1}"\n}}'
    )
    listed = SPLASH.replace("mask = s8[1,4,4]", "mask = s8[10]").replace(
        'custom_call_target="tpu_custom_call"\n', f'custom_call_target="tpu_custom_call", {recorded}\n', 2
    )
    unrecorded = listed.replace(recorded, "metadata={}")
    flops = [
        sum(e.flops for e in work_profile(read_module(text)) if e.kind == "kernel")
        for text in (listed, SPLASH, unrecorded)
    ]
    assert flops[0] == flops[1] > 0
    assert flops[2] == round(flops[1] * 16 / 10)  # without the sizes: the whole grid
