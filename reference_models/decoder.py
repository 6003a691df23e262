"""The decoder-only transformer both families share (MaxText's `Decoder`): token embedding → scanned layer
stacks → `decoder_norm` → `logits_dense`, and its loss.

Layers are stacked with `nn.scan` as MaxText stacks them: the stacked dimension sits at index 1 of every
parameter (MaxText's `param_scan_axis`) and carries the stack's name as its logical axis. DeepSeek has a
`dense_layers` stack then a `moe_layers` stack; Mixtral one `layers` stack. The last stack is the main
one, the one a pipeline splits over stages.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from reference_models.config import DecoderConfig
from reference_models.decoder_layers import RESIDUAL, DeepSeekLayer, LlamaLayer, MixtralLayer
from reference_models.layers import DenseGeneral, Embed, RMSNorm, weights_in
from reference_models.pipeline import run_pipeline
from reference_models.remat import pipeline_remat_policy, remat_policy
from reference_models.sharding import (
    ShardingContext,
    current_context,
    path_prefix,
    place,
    sharding_context,
    unsharded,
)

# MaxText's `param_scan_axis`: where a stack's layer dimension sits in each of its parameters.
PARAM_SCAN_AXIS = 1
_LOGITS = ("activation_embed_and_logits_batch", "activation_length", "activation_vocab")
# The output head's parameters (the final norm and the vocabulary projection) and their logical axes: what a
# tiled loss gathers over FSDP before its chunks (vocab_tiling.py), as MaxText's does.
HEAD_PARAMS = {"decoder_norm": {"scale": ("norm",)}, "logits_dense": {"kernel": ("embed_vocab", "vocab")}}


@dataclass(frozen=True)
class LayerStack:
    """One stack of identical layers; `name` is also the logical axis of its stacked dimension."""

    name: str
    layer: type[nn.Module]
    options: dict[str, Any]
    length: int

    def layer_module(self, config: DecoderConfig, **kwargs: Any) -> nn.Module:
        return self.layer(config, **self.options, **kwargs)


def layer_stacks(config: DecoderConfig) -> tuple[LayerStack, ...]:
    """The model's layer stacks, in order."""
    if config.family == "deepseek":
        candidates = (
            LayerStack("dense_layers", DeepSeekLayer, {"use_moe": False}, config.first_dense_layers),
            LayerStack("moe_layers", DeepSeekLayer, {"use_moe": True}, config.num_moe_layers),
        )
        return tuple(stack for stack in candidates if stack.length)
    layer = LlamaLayer if config.family == "llama" else MixtralLayer
    return (LayerStack("layers", layer, {}, config.num_layers),)


def _scanned(layer: type[nn.Module] | Any, stack: LayerStack) -> Any:
    """`layer` scanned over the stack's layers, its parameters stacked at `PARAM_SCAN_AXIS` under the stack's name."""
    return nn.scan(
        layer,
        variable_axes={"params": PARAM_SCAN_AXIS},
        split_rngs={"params": True},
        length=stack.length,
        metadata_params={nn.PARTITION_NAME: stack.name},
    )


class SequentialStage(nn.Module):
    """A pipeline stage of several layers run in turn (MaxText's sequential stage): `layers_0`, `layers_1`, …"""

    config: DecoderConfig
    layer: type[nn.Module]
    options: tuple[tuple[str, Any], ...]
    count: int

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        for index in range(self.count):
            x, _ = self.layer(self.config, **dict(self.options), name=f"layers_{index}")(x, None)
        return x, None


@dataclass(frozen=True)
class PipelineLayout:
    """How MaxText lays out a pipelined stack's parameters (`decoder/pipeline_module/layers/…`): each leaf is
    [repeats, stages, …] (['stages', …] with one repeat), logical ('circular_repeats', 'layers', …); under the
    two leading indices, one stage's layers for one visit: the layer's own parameters, or `layers_0` … when a
    visit runs several (MaxText's `num_layers_per_pipeline_stage`). Parameter [r, s] (its `layers_j`) is layer
    (r · stages + s) · per_visit + j of the stack, which is the order the schedule runs them in."""

    stages: int
    repeats: int
    per_visit: int

    def layers_of(self, stage_params: Any) -> list[Any]:
        """One visit's per-layer parameters, in the order they run."""
        if self.per_visit == 1:
            return [stage_params]
        return [stage_params[f"layers_{index}"] for index in range(self.per_visit)]


def pipeline_layout(config: DecoderConfig, stack: LayerStack) -> PipelineLayout | None:
    """The main stack's layout when the model is pipelined (`DecoderConfig.pipeline_stages`), else None."""
    stages, repeats = config.pipeline_stages, config.pipeline_repeats
    if stages <= 1:
        return None
    if stack.length % (stages * repeats):
        raise ValueError(f"{stack.length} layers do not split into {stages} pipeline stages × {repeats} repeats")
    return PipelineLayout(stages, repeats, stack.length // (stages * repeats))


class PipelineModule(nn.Module):
    """Holds a pipelined stack's parameters in MaxText's layout (`PipelineLayout`); calling it creates them
    (the schedule runs on them in `Decoder._pipelined`)."""

    config: DecoderConfig
    stack: LayerStack
    layout: PipelineLayout

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        layout = self.layout
        # One visit's stage: the layer itself, or several in turn (MaxText's sequential stage).
        stage: Any = self.stack.layer
        kwargs: dict[str, Any] = dict(self.stack.options)
        if layout.per_visit > 1:
            stage = SequentialStage
            kwargs = {"layer": self.stack.layer, "options": tuple(sorted(kwargs.items())), "count": layout.per_visit}

        def over(target: Any, size: int, name: str) -> Any:
            return nn.vmap(
                target,
                in_axes=(None, None),
                out_axes=0,
                axis_size=size,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                metadata_params={nn.PARTITION_NAME: name},
            )

        target = over(stage, layout.stages, "layers")
        if layout.repeats > 1:
            target = over(target, layout.repeats, "circular_repeats")
        target(self.config, **kwargs, name="layers")(x, None)
        return x


def _stored_specs(config: DecoderConfig, stack: LayerStack, x: jax.Array, context: ShardingContext) -> Any:
    """The rules' sharding of each of the pipelined stack's parameters, from their logical axes (an abstract
    init, traced unsharded so that it records nothing): with Auto axes a traced parameter does not carry it."""
    layout = pipeline_layout(config, stack)
    assert layout is not None
    module = PipelineModule(config, stack, layout)
    hidden = jax.ShapeDtypeStruct(x.shape, x.dtype)
    with unsharded():
        boxed = jax.eval_shape(lambda h: module.init(jax.random.key(0), h), hidden)["params"]["layers"]
    logical = nn.get_partition_spec(boxed)
    return jax.tree.map(
        lambda spec: context.resolve(tuple(spec)), logical, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)
    )


class Decoder(nn.Module):
    """Layer stacks, then the final norm and the vocabulary projection."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, head_only: bool = False) -> jax.Array:
        """Logits of the embedded tokens `x`; or, with `head_only`, of hidden states `x` through the output
        head alone (a tiled loss's chunks); with `vocab_tiles` > 1, a step's hidden states before the head
        (MaxText's decoder returns them for its tiled loss)."""
        cfg = self.config
        stacks = () if head_only else layer_stacks(cfg)
        outer = current_context()
        for stack in stacks:
            layout = pipeline_layout(cfg, stack) if stack is stacks[-1] else None
            context = outer
            placed: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if layout is None and outer is not None and outer.resolve_outside_pipeline is not None:
                # A stack the pipeline does not run: the stage axis acts as data (MaxText's rules for it).
                context = dataclasses.replace(outer, resolve=outer.resolve_outside_pipeline)
                placed = sharding_context(context)
            with placed:
                if context is not None and context.explicit:
                    # A scan's carry keeps its type: enter each stack on the residual stream's sharding.
                    x = jax.sharding.reshard(x, context.resolve(RESIDUAL))
                if layout is not None:
                    if self.is_initializing():
                        PipelineModule(cfg, stack, layout, name="pipeline_module")(x)
                    elif context is not None and context.pipeline is not None:
                        x = self._pipelined(x, stack, layout, context)
                    else:
                        x = self._in_order(x, stack, layout)
                    continue
                # MaxText's `remat_policy` (default `full`: each layer saves only its input and recomputes the
                # rest in the backward pass, which is where its gathers run a second time); shardscope's `none`
                # keeps all.
                layer = stack.layer
                if cfg.remat != "none":
                    policy = remat_policy(cfg.remat, cfg.remat_custom)
                    layer = nn.remat(stack.layer, prevent_cse=False, policy=policy)
                x, _ = _scanned(layer, stack)(cfg, **stack.options, name=stack.name)(x, None)
        if cfg.vocab_tiles > 1 and not head_only and not self.is_initializing():
            return x
        x = RMSNorm(cfg.norm_epsilon, name="decoder_norm")(x)
        # A chunk's logits are placed by the tiled loss; the whole batch's by the matmul (MaxText's out_sharding).
        out = None if head_only else _LOGITS
        return DenseGeneral(
            (cfg.vocab_size,), ("embed_vocab", "vocab"), dtype=cfg.dtype, out_logical=out, name="logits_dense"
        )(x)

    def _in_order(self, x: jax.Array, stack: LayerStack, layout: PipelineLayout) -> jax.Array:
        """A pipelined stack's layers run one after another in their order, outside any pipeline (one device)."""
        layer = stack.layer_module(self.config, parent=None)
        params = self.variables["params"]["pipeline_module"]["layers"]
        visits = jax.tree.map(lambda p: p.reshape(-1, *p.shape[1 + (layout.repeats > 1) :]), params)

        def visit(hidden, stage_params):
            for layer_params in layout.layers_of(stage_params):
                hidden = layer.apply({"params": layer_params}, hidden, None)[0]
            return hidden, None

        return jax.lax.scan(visit, x, visits)[0]

    def _pipelined(
        self, x: jax.Array, stack: LayerStack, layout: PipelineLayout, context: ShardingContext
    ) -> jax.Array:
        """The main stack run by the pipeline, one layer at a time on the parameters `PipelineModule` made."""
        cfg = self.config
        layer = stack.layer_module(cfg, parent=None)

        prefix = (*self.path, "pipeline_module", "layers")

        def apply_layer(params, hidden, index):
            # Its activations are named as its parameters are (`…/layers/layers_1/…` when a visit runs several).
            with path_prefix(prefix if layout.per_visit == 1 else (*prefix, f"layers_{index}")):
                return layer.apply({"params": params}, hidden, None)[0]

        # MaxText rematerialises each of a pipeline's iterations as a whole (its pipeline remat policy keeps
        # each iteration's and each layer's input besides what the model's policy keeps); the layers inside
        # are not rematerialised again.
        remat = None if cfg.remat == "none" else pipeline_remat_policy(cfg.remat, cfg.remat_custom)
        gather_once = context.pipeline is not None and context.pipeline.fsdp_gather_once
        specs = _stored_specs(cfg, stack, x, context) if gather_once else None
        params = self.variables["params"]["pipeline_module"]["layers"]
        return run_pipeline(apply_layer, layout.layers_of, params, x, context, prefix[:-1], remat, specs)


class Transformer(nn.Module):
    """Token embedding (`token_embedder`) + decoder; returns logits [batch, seq, vocab]."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, tokens: jax.Array | None, hidden: jax.Array | None = None) -> jax.Array:
        """Logits of `tokens` (hidden states before the head when `vocab_tiles` > 1), or of `hidden` states
        through the output head alone (`tokens` None: MaxText's `logits_from_hidden_states_for_vocab_tiling`)."""
        with weights_in(self.config.weight_dtype):
            decoder = Decoder(self.config, name="decoder")
            if hidden is not None:
                return decoder(hidden, head_only=True)
            assert tokens is not None
            return decoder(Embed(self.config, name="token_embedder")(tokens))


def target_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Each target's log-probability under `logits` [..., vocab] (computed in float32)."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    # A one-hot product instead of a gather: it works whatever the vocabulary's sharding (ep-tp splits it).
    return jnp.sum(log_probs * jax.nn.one_hot(targets, logits.shape[-1], dtype=log_probs.dtype), axis=-1)


# MaxText's train step places each token's cross-entropy on these axes (the batch split as the logits' is,
# the stage axis included).
_TOKEN_LOSS = ("activation_embed_and_logits_batch", "activation_length")


def next_token_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of `targets` under `logits`."""
    log_probs = target_log_probs(logits, targets)
    context = current_context()
    if context is not None:
        log_probs = place(context, log_probs, context.resolve(_TOKEN_LOSS))
    return -jnp.mean(log_probs)
