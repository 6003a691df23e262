"""Collectives in the plans of the tiny cases: the ones each preset implies, with bytes computed from the
model config and mesh (independently of the extractor)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import PRESETS, TINY_MODELS
from reference_models import MODELS
from shardscope.cli import app
from shardscope.hlo import MeshLayout, parse_collectives

F32 = 4
MOE_SOURCE = {
    "deepseek-tiny": "decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0",
    "mixtral-tiny": "decoder/layers/MoeBlock_0",
}


def rows(plan, **match):
    return [r for r in plan.collectives if all(getattr(r, k) == v for k, v in match.items())]


@pytest.mark.parametrize("model", TINY_MODELS)
def test_default_dispatches_tokens_with_all_to_all_over_expert(model, tiny_plans):
    plan = tiny_plans(model, "default")
    cfg, mesh = MODELS[model], dict(plan.case.mesh)
    # Tokens are batch-sharded over data×fsdp×expert; a dropless buffer holds every expert × local tokens.
    local_tokens = cfg.global_batch * cfg.seq_len // (mesh["data"] * mesh["fsdp"] * mesh["expert"])
    buffer_bytes = cfg.num_experts * local_tokens * cfg.embed_dim * F32
    for pass_ in ("forward", "backward"):
        (row,) = rows(plan, op="all-to-all", axes=("expert",), pass_=pass_)
        assert row.source == MOE_SOURCE[model]
        assert row.loop_trips == cfg.num_moe_layers
        # Dispatch and return; the backward pass of a fully rematerialised layer runs both again before
        # their transposes (MaxText's default remat policy), so it holds four.
        assert row.count == (2 if pass_ == "forward" else 4)
        assert row.bytes == buffer_bytes


def test_default_gathers_weights_over_fsdp_and_reduces_gradients(tiny_plans):
    plan = tiny_plans("deepseek-tiny", "default")
    cfg = MODELS["deepseek-tiny"]
    (gather,) = rows(plan, op="all-gather", pass_="forward", source="decoder/dense_layers/mlp/wi_0")
    assert gather.axes == ("fsdp", "expert")  # the embed dimension is on fsdp×expert
    assert gather.bytes == cfg.embed_dim * cfg.mlp_dim * F32  # one whole layer's kernel per device
    assert gather.loop_trips == cfg.first_dense_layers
    # Routed-expert weights: placed on (exp, -, mlp_no_fsdp) without fsdp before the experts run, as MaxText
    # places them, so each layer's slice of the stacked weights is gathered over fsdp in the layer loop
    # (before the MoE body, hence the decoder as its source).
    experts_per_shard = cfg.num_experts // dict(plan.case.mesh)["expert"]
    wi_slice = (1, experts_per_shard, cfg.embed_dim, cfg.moe_mlp_dim)
    (wi_gather,) = rows(plan, op="all-gather", axes=("fsdp",), pass_="forward", shape=wi_slice)
    assert wi_gather.count == 2  # wi_0 and wi_1
    assert wi_gather.loop_trips == cfg.num_moe_layers
    assert wi_gather.bytes == experts_per_shard * cfg.embed_dim * cfg.moe_mlp_dim * F32
    # Their gradients are summed over fsdp in the backward pass.
    assert rows(plan, op="all-reduce", axes=("fsdp",), pass_="backward", source=MOE_SOURCE["deepseek-tiny"])


@pytest.mark.parametrize("model", TINY_MODELS)
def test_shard_exp_on_fsdp_gathers_routed_experts_over_fsdp(model, tiny_plans):
    plan = tiny_plans(model, "shard-exp-on-fsdp")
    cfg, mesh = MODELS[model], dict(plan.case.mesh)
    # Experts live on expert×fsdp; before computing, each layer's slice is gathered over fsdp back to
    # expert-parallel shards (in the layer loop).
    gathered_shape = (1, cfg.num_experts // mesh["expert"], cfg.embed_dim, cfg.moe_mlp_dim)
    (gather,) = rows(plan, op="all-gather", axes=("fsdp",), pass_="forward", shape=gathered_shape)
    # wi_0 and wi_1 of every MoE layer (and wo, where it has the same shape)
    assert gather.count == 2 + (cfg.moe_mlp_dim == cfg.embed_dim)
    assert gather.loop_trips == cfg.num_moe_layers
    assert gather.bytes == gathered_shape[1] * gathered_shape[2] * gathered_shape[3] * F32


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ep_tp_uses_the_ring_and_shards_heads_over_expert(model, tiny_plans):
    plan = tiny_plans(model, "ep-tp")
    cfg = MODELS[model]
    assert not [r for r in plan.collectives if r.op == "all-to-all" and r.axes and "expert" in r.axes]
    # Tensor-parallel attention leaves the tokens replicated over `expert`: every shard runs its own experts
    # on all of them and the partial outputs are added over `expert` (the ring's gather has nothing to do).
    # (DeepSeek's shared experts are tensor-parallel too; the compiler combines both sums into one.)
    block = MOE_SOURCE[model].removesuffix("/MoeBlock_0")
    local_tokens = cfg.global_batch // dict(plan.case.mesh)["fsdp"]
    sums = [
        r
        for r in rows(plan, op="all-reduce", axes=("expert",), pass_="forward")
        if r.source.startswith(block) and r.shape == (local_tokens, cfg.seq_len, cfg.embed_dim)
    ]
    assert sums and all(r.loop_trips == cfg.num_moe_layers for r in sums)
    heads = {p: t for p, t in plan.tensors if t.kind == "param" and t.logical and "q_heads" in t.logical}
    assert heads
    for path, tensor in heads.items():
        assert tensor.spec[tensor.logical.index("q_heads")] == "expert", path


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ring_of_experts_gathers_tokens_split_over_the_expert_axis(model, tiny_plans_with):
    # Under ep-as-dp the batch is split over `expert` too: the ring all-gathers the tokens over it and
    # reduce-scatters the partial outputs back, in the forward pass and (transposed) in the backward one.
    plan = tiny_plans_with(model, "ep-as-dp", moe="ring")
    moe = [r for r in plan.collectives if r.source == MOE_SOURCE[model]]
    assert not [r for r in plan.collectives if r.op == "all-to-all" and r.axes == ("expert",)]
    for pass_ in ("forward", "backward"):
        assert any(r.op == "all-gather" and r.axes == ("expert",) and r.pass_ == pass_ for r in moe)
        assert any(r.op == "reduce-scatter" and r.axes == ("expert",) and r.pass_ == pass_ for r in moe)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("model", TINY_MODELS)
def test_collectives_command_reads_every_tiny_case(model, preset, compiled_cases, tiny_plans, tmp_path):
    step = compiled_cases(model, preset)
    text = step.compiled.as_text()
    plan = tiny_plans(model, preset)
    assert parse_collectives(text).unknown == ()
    layout = MeshLayout(tuple(a for a, _ in plan.case.mesh), tuple(s for _, s in plan.case.mesh))
    assert len(parse_collectives(text, layout).collectives) == len(plan.collectives)
    hlo = tmp_path / "module.txt"
    hlo.write_text(text)
    mesh = ",".join(f"{a}={s}" for a, s in plan.case.mesh)
    result = CliRunner().invoke(app, ["collectives", str(hlo), "--mesh", mesh])
    assert result.exit_code == 0, result.output
    assert "Traffic per mesh axis" in result.stdout
    without_mesh = CliRunner().invoke(app, ["collectives", str(hlo)])
    assert without_mesh.exit_code == 0
    assert "groups" in without_mesh.stdout
