"""Sharding must not change the math: every preset's compiled step equals the single-device step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import PRESETS, TINY_MODELS
from reference_models.decoder import Transformer, layer_stacks, pipeline_layout
from shardscope.case import resolve_case
from shardscope.stages.train_step import make_optimizer, make_train_step
from shardscope.verify.layout import same_layout, stacked_config, to_case_layout, to_stacked

# The quick lane (`-m "not slow"`) leaves these out: each runs a sharded train step and the same step on one device.
pytestmark = pytest.mark.slow

# float32 everywhere; sharded reductions sum in a different order, nothing more.
LOSS_RTOL = 1e-5
# Gradients are compared through AdamW's first moment after one step (mu = (1 - b1) * grad, linear in
# the gradient), relative to the largest gradient entry of each tensor.
GRAD_RTOL_OF_MAX = 1e-4


def real_state_and_batch(case):
    cfg = case.model
    key_params, key_tokens = jax.random.split(jax.random.key(0))
    tokens = jax.random.randint(key_tokens, (case.global_batch, cfg.seq_len), 0, cfg.vocab_size)
    params = nn.unbox(Transformer(cfg).init(key_params, tokens))["params"]
    state = {"params": params, "opt_state": make_optimizer().init(params)}
    return state, {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}


def single_device_step(case, state, batch):
    """The same train step, no mesh, no constraints, one device."""
    with jax.default_device(jax.devices()[0]):
        return jax.jit(make_train_step(case))(state, batch)


@pytest.fixture(scope="module")
def references(compiled_cases):
    cache = {}

    def get(model):
        if model not in cache:
            case = compiled_cases(model, "default").case
            state, batch = real_state_and_batch(case)
            cache[model] = (state, batch, single_device_step(case, state, batch))
        return cache[model]

    return get


# The MoE families' tiny models and the dense one (Llama).
MODELS = (*TINY_MODELS, "llama-tiny")
CASES = [(preset, {}) for preset in PRESETS] + [(p, {"shard_mode": "explicit"}) for p in ("default", "ep-tp")]


@pytest.mark.parametrize(
    ("preset", "overrides"), CASES, ids=[p + "".join(f"-{v}" for v in o.values()) for p, o in CASES]
)
@pytest.mark.parametrize("model", MODELS)
def test_sharded_step_equals_single_device(model, preset, overrides, compiled_cases, references):
    state, batch, reference = references(model)
    assert_same_step(compiled_cases(model, preset, **overrides), state, batch, reference)


def assert_same_step(step, state, batch, reference):
    """The compiled step's loss and gradients (through AdamW's first moment) equal the reference's; `state` is
    the single-device model's, laid out as the case's model keeps it first (`in_case_layout`)."""
    ref_state, ref_metrics = reference
    state = in_case_layout(step.case, state)
    # From host copies: the compiled step donates its state, which must not be the cached reference.
    placed_state = jax.device_put(jax.tree.map(np.asarray, state), step.abstract.state_shardings)
    placed_batch = jax.device_put(batch, step.abstract.batch_shardings)
    new_state, metrics = step.compiled(placed_state, placed_batch)
    loss, ref_loss = float(metrics["loss"]), float(ref_metrics["loss"])
    assert np.isfinite(ref_loss) and ref_loss > 1.0
    np.testing.assert_allclose(loss, ref_loss, rtol=LOSS_RTOL)
    got_mu = stacked(step.case, new_state["opt_state"][0].mu)
    worst = 0.0
    got_leaves = jax.tree_util.tree_flatten_with_path(got_mu)[0]
    for (path, got), want in zip(got_leaves, jax.tree.leaves(ref_state["opt_state"][0].mu), strict=True):
        got, want = np.asarray(got), np.asarray(want)
        scale = float(np.max(np.abs(want)))
        if jax.tree_util.keystr(path).endswith("['gate']['bias']"):
            # DeepSeek-V3's router bias only chooses experts (top-k), so it gets no gradient.
            assert scale == 0 and not np.any(got)
            continue
        assert scale > 0, f"zero gradient for {jax.tree_util.keystr(path)}"
        worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    assert worst < GRAD_RTOL_OF_MAX


def in_case_layout(case, state):
    """A state of the stacked (single-device) model in the layout the case's model keeps (a pipelined case's:
    MaxText's, where parameter [r, s] (its `layers_j`) is layer (r · stages + s) · per_visit + j)."""
    if same_layout(case.model, stacked_config(case.model)):
        return state
    params = to_case_layout(case.model, state["params"])
    return {"params": params, "opt_state": make_optimizer().init(params)}


def stacked(case, tree):
    """The inverse of `in_case_layout` for one tree (params or a moment of them)."""
    return to_stacked(case.model, tree)


# Circular pipelines (each stage visited twice, one layer a visit), Explicit and Auto, with the remat
# policies whose layer inputs the schedule keeps on the device, offloads, or keeps nothing of.
AUTO = {"shard_mode": "auto"}
OFFLOAD = {"model.remat": "custom", "model.remat_custom": "decoder_layer_input:offload"}
CIRCULAR_CASES = [
    *((model, overrides) for model in MODELS for overrides in ({}, AUTO)),
    ("llama-tiny", {**AUTO, **OFFLOAD}),
    ("deepseek-tiny", {**AUTO, "model.remat": "none"}),
    *(("llama-tiny", {**mode, "pipeline.fsdp_gather_once": "true"}) for mode in ({}, AUTO)),
]


@pytest.mark.parametrize(
    ("model", "overrides"),
    CIRCULAR_CASES,
    ids=[m + "".join(f"-{v}" for v in o.values()) for m, o in CIRCULAR_CASES],
)
def test_circular_pipeline_equals_single_device_in_its_layer_order(model, overrides, compiled_cases, references):
    preset = "explicit-pipeline"
    state, batch, reference = references(model)
    step = compiled_cases(model, preset, **{"pipeline.repeats": "2"}, **overrides)
    layout = pipeline_layout(step.case.model, layer_stacks(step.case.model)[-1])
    assert layout is not None and layout.repeats == 2
    # Parameters [r, s] hold layer r · stages + s (MaxText's numbering), which is the order the schedule runs
    # them in: the single-device step over the layers in their stacked order, relabelled into that layout.
    assert_same_step(step, state, batch, reference)


# More microbatches than stages: each stage's share of the inputs, and then of the outputs, moves through
# the loop state several at a time, and in a circular schedule what the last stage sends round waits in the
# circular storage for its next visit. Four microbatches over two stages (of 4 devices, so that a microbatch
# of 2 sequences still splits), one visit and circular; and eight over four stages of one layer each, where
# the loop state passes through stages that neither take nor give a microbatch.
MICROBATCH_CASES = [
    *(
        (model, "2", "4", repeats, mode)
        for model, repeats in (("llama-tiny", "1"), ("deepseek-tiny", "1"), ("llama-tiny", "2"), ("mixtral-tiny", "2"))
        for mode in ("explicit", "auto")
    ),
    *(("llama-tiny", "4", "8", "1", mode) for mode in ("explicit", "auto")),
]


@pytest.mark.parametrize(
    ("model", "stages", "microbatches", "repeats", "mode"),
    MICROBATCH_CASES,
    ids=["-".join(case) for case in MICROBATCH_CASES],
)
def test_pipeline_of_more_microbatches_than_stages(
    model, stages, microbatches, repeats, mode, compile_cached, references
):
    state, batch, reference = references(model)
    mesh = {"data": 1, "stage": int(stages), "fsdp": 4 // int(stages), "expert": 1}
    settings = {"pipeline.microbatches": microbatches, "pipeline.repeats": repeats, "shard_mode": mode}
    step = compile_cached(resolve_case(model, "explicit-pipeline", "cpu-4", mesh, settings))
    assert dict(step.case.mesh)["stage"] == int(stages)
    assert step.case.preset.pipeline is not None and step.case.preset.pipeline.microbatches == int(microbatches)
    assert_same_step(step, state, batch, reference)


# MaxText's remat policies by name (and `none`): what the backward pass keeps changes, the math does not.
REMAT_CASES = [
    ("minimal", ()),
    ("minimal_with_context", ()),
    ("save_dot_except_mlp", ()),
    ("save_qkv_proj", ()),
    ("save_out_proj", ()),
    ("minimal_offloaded", ()),
    ("qkv_proj_offloaded", ()),
    ("custom", (("query_proj", "offload"), ("mlpwo", "device"))),
    ("none", ()),
]


@pytest.mark.parametrize(("policy", "custom"), REMAT_CASES, ids=[p for p, _ in REMAT_CASES])
@pytest.mark.parametrize("model", MODELS)
def test_every_remat_policy_gives_the_single_device_loss(model, policy, custom, compiled_cases, references):
    state, batch, (_, ref_metrics) = references(model)
    extra = {"model.remat_custom": ",".join(f"{k}:{v}" for k, v in custom)} if custom else {}
    step = compiled_cases(model, "default", **{"model.remat": policy}, **extra)
    placed_state = jax.device_put(jax.tree.map(np.asarray, state), step.abstract.state_shardings)
    placed_batch = jax.device_put(batch, step.abstract.batch_shardings)
    _, metrics = step.compiled(placed_state, placed_batch)
    np.testing.assert_allclose(float(metrics["loss"]), float(ref_metrics["loss"]), rtol=LOSS_RTOL)


@pytest.mark.parametrize("model", MODELS)
def test_flash_attention_gives_the_single_device_loss(model, compiled_cases, references):
    # Blocks of 8 query rows over the tiny models' 32 tokens: four blocks, three of them off the diagonal.
    state, batch, (_, ref_metrics) = references(model)
    step = compiled_cases(model, "ep-as-cp", **{"model.attention_kernel": "flash", "model.attention_block": "8"})
    placed_state = jax.device_put(jax.tree.map(np.asarray, state), step.abstract.state_shardings)
    placed_batch = jax.device_put(batch, step.abstract.batch_shardings)
    _, metrics = step.compiled(placed_state, placed_batch)
    np.testing.assert_allclose(float(metrics["loss"]), float(ref_metrics["loss"]), rtol=LOSS_RTOL)


# ZeRO-1 (MaxText's shard_optimizer_over_data): the optimizer state and the stored parameters are split over
# `data` as well; the step gathers the parameters back and must give the single-device step's numbers.
@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("model", ["llama-tiny", "deepseek-tiny"])
def test_zero1_step_equals_single_device(model, mode, compile_cached, references):
    from shardscope.case import resolve_case

    case = resolve_case(
        model,
        "default",
        mesh={"data": 2, "fsdp": 2, "expert": 2},
        overrides={"shard_optimizer_over": "data", "shard_mode": mode},
    )
    step = compile_cached(case)
    stored = step.abstract.state_shardings
    split = [s.spec for s in jax.tree.leaves(stored["opt_state"][0].mu)]
    # Every stacked weight (three dimensions or more) takes `data` somewhere (norm scales, on `tensor` by
    # the rules, may keep their spec, as in MaxText); the parameters are stored as their optimizer state.
    assert split and all(
        any("data" in (e if isinstance(e, tuple) else (e,)) for e in spec) for spec in split if len(spec) >= 3
    )
    assert [s.spec for s in jax.tree.leaves(stored["params"])] == split
    state, batch, reference = references(model)
    assert_same_step(step, state, batch, reference)


@pytest.mark.parametrize("model", TINY_MODELS)
def test_experts_sharded_on_fsdp_give_the_single_device_loss(model, compiled_cases, references):
    # MaxText's shard_exp_on_fsdp: the expert weights stored with their expert dimension on FSDP.
    state, batch, reference = references(model)
    step = compiled_cases(model, "default", **{"model.shard_experts_on_fsdp": "true"})
    assert step.case.model.shard_experts_on_fsdp
    assert_same_step(step, state, batch, reference)


@pytest.mark.parametrize("model", MODELS)
def test_iota_embedding_gives_the_single_device_loss(model, compiled_cases, references):
    # MaxText's use_iota_embed: the token lookup as a one-hot matmul (its table gradient a matmul too).
    state, batch, reference = references(model)
    step = compiled_cases(model, "default", **{"model.iota_embed": "true"})
    assert step.case.model.iota_embed
    assert_same_step(step, state, batch, reference)


@pytest.mark.parametrize("model", TINY_MODELS)
def test_experts_on_2d_fsdp_give_the_single_device_loss(model, compile_cached, references):
    # MaxText's use_2d_fsdp_sharding: each expert weight's experts on fsdp and first matrix dimension on
    # fsdp_transpose, gathered whole for the expert matmuls.
    state, batch, reference = references(model)
    case = resolve_case(
        model, "default", "cpu-8", {"fsdp": 2, "fsdp_transpose": 2, "expert": 2}, {"model.experts_2d_fsdp": "true"}
    )
    step = compile_cached(case)
    stored = {
        jax.tree_util.keystr(path): sharding.spec
        for path, sharding in jax.tree_util.tree_flatten_with_path(step.abstract.state_shardings["params"])[0]
    }
    wi = [spec for path, spec in stored.items() if path.endswith("['MoeBlock_0']['wi_0']")]
    assert wi and all(spec[0] == "fsdp" and spec[2] == "fsdp_transpose" for spec in wi), wi
    assert_same_step(step, state, batch, reference)


@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("model", MODELS)
def test_vocab_tiling_gives_the_single_device_loss_and_gradients(model, mode, compiled_cases, references):
    # MaxText's num_vocab_tiling: the loss over 4 chunks of the batch's tokens, the head's logits recomputed
    # chunk by chunk in the backward pass (a custom VJP), its parameters gathered over FSDP first.
    state, batch, reference = references(model)
    step = compiled_cases(model, "default", **{"model.vocab_tiles": "4", "shard_mode": mode})
    assert step.case.model.vocab_tiles == 4
    assert_same_step(step, state, batch, reference)
