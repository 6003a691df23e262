"""Flash attention on a TPU is MaxText's splash kernel (reference_models/splash.py): the same function as the
reference attention, and in a TPU compile the same work as the CPU stand-in's (reference_models/attention.py)."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reference_models.flash_stand_in import causal_attention
from reference_models.splash import local_splash_attention
from shardscope.case.tpu import libtpu_version

# The quick lane (`-m "not slow"`) leaves these out: attention kernels compiled and run.
pytestmark = pytest.mark.slow

BLOCKS = "kv:128,kv_compute:128,q_dkv:128,kv_dkv:128,kv_dkv_compute:128,q_dq:128,kv_dq:128"


def test_the_kernel_is_causal_attention_with_fewer_kv_heads_and_a_narrower_value():
    # Pallas' interpreter runs the TPU kernel anywhere: values and gradients equal the reference attention,
    # with grouped queries (four query heads on two key/value heads) and MLA's narrower value head.
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (1, 256, 4, 128), jnp.float32)
    k = jax.random.normal(keys[1], (1, 256, 2, 128), jnp.float32)
    v = jax.random.normal(keys[2], (1, 256, 2, 64), jnp.float32)
    blocks = dict.fromkeys(("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq"), 128)
    scale = 128**-0.5

    def kernel(q, k, v):
        return local_splash_attention(q, k, v, scale=scale, blocks=blocks, fused_backward=False, interpret=True)

    np.testing.assert_allclose(kernel(q, k, v), causal_attention(q, k, v, scale), atol=2e-5)
    grads = jax.grad(lambda *a: jnp.sum(kernel(*a) ** 2), argnums=(0, 1, 2))(q, k, v)
    expected = jax.grad(lambda *a: jnp.sum(causal_attention(*a, scale) ** 2), argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.abs(want).max()))


_KERNEL_WORK = """
import json, sys
import shardscope
found = {}
for fused in ("false", "true"):
    settings = {"model.seq_len": "256", "model.attention_kernel": "flash", "model.attention_block": "128",
                "model.attention_blocks": sys.argv[2], "model.attention_fused_backward": fused}
    plan = shardscope.plan_case("llama-tiny", topology=sys.argv[1], settings=settings, use_cache=False)
    work = {}
    for entry in plan.work:
        if entry.kind == "kernel" and entry.flops:
            work[entry.pass_] = work.get(entry.pass_, 0) + entry.flops * entry.executions
    found[fused] = {"kernel": work, "memory": dict(plan.memory)}
print(json.dumps(found))
"""


def _kernel_work(topology: str) -> dict:
    import json

    done = subprocess.run(
        [sys.executable, "-c", _KERNEL_WORK, topology, BLOCKS], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_the_kernel_on_a_tpu_and_the_stand_in_elsewhere_do_the_same_matmuls():
    tpu, cpu = _kernel_work("v5p-8"), _kernel_work("cpu-4")
    for fused, matmuls in (("false", 2 + 3 + 4), ("true", 2 + 5)):
        # The kernel's FLOPs are counted from the custom calls' shapes, names and causal block grids; the
        # stand-in's from its dots over causal query rows: the two passes agree.
        assert tpu[fused]["kernel"] == cpu[fused]["kernel"]
        # Forward: scores and values (two matmuls). Backward: the layer's forward again (full remat), then the
        # query-gradient kernel (three) and the key/value-gradient kernel (four), or the fused kernel (five).
        forward = tpu[fused]["kernel"]["forward"]
        assert forward > 0 and tpu[fused]["kernel"]["backward"] == matmuls / 2 * forward
    # Only the TPU compile records the compiler's peak, below the static sum of its figures.
    memory = tpu["false"]["memory"]
    static = memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"] - memory["alias_bytes"]
    assert 0 < memory["peak_bytes"] <= static
    assert "peak_bytes" not in cpu["false"]["memory"]


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_a_kernel_over_its_vector_memory_is_one_line_naming_the_limit(tmp_path):
    out = tmp_path / "plan.json"
    sets = ["model.seq_len=2048", "model.attention_kernel=flash", "model.attention_block=2048"]
    sets += ["model.attention_blocks=kv:2048,kv_compute:2048", "xla.xla_tpu_scoped_vmem_limit_kib=2048"]
    command = [sys.executable, "-m", "shardscope.cli", "dump", "llama-tiny", "--topology", "v5p-8", "-o", str(out)]
    done = subprocess.run([*command, *(f"--set={s}" for s in sets)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs more vector memory" in lines[0] and "scoped_vmem_limit_kib" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_queries_split_along_the_sequence_run_their_own_rows_of_the_causal_mask(axis_type):
    # Context parallelism as MaxText's all-gather strategy runs it: each device keeps its queries, the keys
    # and values are gathered whole, and the kernel runs its shard of the causal mask. Values and gradients
    # equal the reference attention (Pallas' interpreter on fake CPU devices).
    from jax.sharding import NamedSharding, PartitionSpec

    from reference_models.splash import context_parallel_splash

    if jax.device_count() < 4:
        pytest.skip("needs 4 devices")
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((2, 2), ("data", "context"), devices=jax.devices()[:4], axis_types=(kind, kind))
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(keys[0], (2, 512, 4, 128), jnp.float32)
    k = jax.random.normal(keys[1], (2, 512, 2, 128), jnp.float32)
    v = jax.random.normal(keys[2], (2, 512, 2, 128), jnp.float32)
    whole = (q, k, v)  # the reference runs on one device
    q, k, v = (jax.device_put(x, NamedSharding(mesh, PartitionSpec("data", "context"))) for x in whole)
    blocks = dict.fromkeys(("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq"), 128)
    scale = 128**-0.5

    def kernel(q, k, v):
        return context_parallel_splash(
            q,
            k,
            v,
            mesh=mesh,
            spec=("data", "context", None),
            scale=scale,
            blocks=blocks,
            fused_backward=False,
            interpret=True,
        )

    out = jax.jit(kernel)(q, k, v)
    assert out.sharding.spec[:2] == ("data", "context")
    np.testing.assert_allclose(out, causal_attention(*whole, scale), atol=2e-5)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(kernel(*a) ** 2), argnums=(0, 1, 2)))(q, k, v)
    expected = jax.grad(lambda *a: jnp.sum(causal_attention(*a, scale) ** 2), argnums=(0, 1, 2))(*whole)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.abs(want).max()))


_BLOCKS_128 = " ".join(
    f"sa_block_{name}=128" for name in ("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")
)
# A remat policy that keeps the projections (as MaxText's long-context runs do): the saved keys and values.
_SAVED = (
    "remat_policy=custom decoder_layer_input=device context=device query_proj=device key_proj=device value_proj=device"
)


def _tiny_plan(tmp_path, name: str, mesh: str, topology: str = "v5p-8") -> dict:
    import json

    out = tmp_path / f"{name}.json"
    maxtext = f"{mesh} max_target_length=1024 attention=flash per_device_batch_size=1 {_BLOCKS_128} {_SAVED}"
    command = [sys.executable, "-m", "shardscope.cli", "dump", "llama-tiny", "--topology", topology, "--no-cache"]
    subprocess.run([*command, "--maxtext", maxtext, "-o", str(out)], capture_output=True, text=True, check=True)
    return json.loads(out.read_text())


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_context_parallelism_runs_the_kernel_on_each_devices_queries_against_gathered_keys(tmp_path):
    # 4 sequences of 1024 tokens on 4 devices: split by sequence (fsdp 4) or by 2 sequences × 2 halves of
    # each (fsdp 2, context 2). The kernel runs in both (no stand-in), and each device does the same
    # attention work: half the rows of the causal mask of 2 sequences is the whole mask of one.
    meshes = {"batch": "ici_fsdp_parallelism=-1", "context": "ici_fsdp_parallelism=-1 ici_context_parallelism=2"}
    plans = {name: _tiny_plan(tmp_path, name, mesh) for name, mesh in meshes.items()}
    work = {
        name: sum(e["flops"] * e["executions"] for e in plan["work"] if e["kind"] == "kernel")
        for name, plan in plans.items()
    }
    assert work["context"] == work["batch"] > 0
    # The keys and values are gathered over the context axis (forward, and again in the recomputed forward),
    # their gradients reduce-scattered back.
    context_ops = {(row["op"], row["pass"]) for row in plans["context"]["collectives"] if row["axes"] == ["context"]}
    assert {("all-gather", "forward"), ("all-gather", "backward"), ("reduce-scatter", "backward")} <= context_ops
    # The saved keys and values stay split: the peak is the batch split's (the same tokens per device);
    # saved gathered, it was 27% above.
    peaks = {name: plan["memory"]["peak_bytes"] for name, plan in plans.items()}
    assert peaks["context"] <= 1.1 * peaks["batch"]


def test_context_parallelism_on_a_cpu_compile_has_the_kernels_structure(tmp_path):
    # The stand-in where the kernel cannot run, over a split sequence: each device's queries against keys and
    # values gathered inside a shard_map, as on a TPU. Each device does the batch split's attention work
    # (its own causal block, and half the other shards' keys on average), the forward pass is not run again
    # under a policy that saves the context (the backward pass is the kernel's 7 matmuls to its 2), and the
    # keys and values are gathered over the context axis and their gradients reduce-scattered back.
    meshes = {"batch": "ici_fsdp_parallelism=-1", "context": "ici_fsdp_parallelism=-1 ici_context_parallelism=2"}
    plans = {name: _tiny_plan(tmp_path, name, mesh, "cpu-8") for name, mesh in meshes.items()}
    work = {}
    for name, plan in plans.items():
        for entry in plan["work"]:
            if entry["kind"] == "kernel":
                key = (name, entry["pass"])
                work[key] = work.get(key, 0) + entry["flops"] * entry["executions"]
    for name in meshes:
        assert work[(name, "backward")] == 3.5 * work[(name, "forward")] > 0, work
    assert work[("context", "forward")] == work[("batch", "forward")]
    context_ops = {(row["op"], row["pass"]) for row in plans["context"]["collectives"] if row["axes"] == ["context"]}
    assert {("all-gather", "forward"), ("all-gather", "backward"), ("reduce-scatter", "backward")} <= context_ops
