"""The decoder-only transformer both families share (MaxText's `Decoder`): token embedding → scanned layer
stacks → `decoder_norm` → `logits_dense`, and its loss.

Layers are stacked with `nn.scan` as MaxText stacks them: the stacked dimension sits at index 1 of every
parameter (MaxText's `param_scan_axis`) and carries the stack's name as its logical axis. DeepSeek has a
`dense_layers` stack then a `moe_layers` stack; Mixtral one `layers` stack. The last stack is the main
one, the one a pipeline splits over stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from reference_models.config import DecoderConfig
from reference_models.decoder_layers import RESIDUAL, DeepSeekLayer, LlamaLayer, MixtralLayer
from reference_models.layers import DenseGeneral, Embed, RMSNorm, explicit_spec, weights_in
from reference_models.pipeline import PipelineRemat, run_pipeline
from reference_models.remat import pipeline_remat_policy, remat_policy
from reference_models.sharding import ShardingContext, current_context, path_prefix, unsharded

# MaxText's `param_scan_axis`: where a stack's layer dimension sits in each of its parameters.
PARAM_SCAN_AXIS = 1
_LOGITS = ("activation_embed_and_logits_batch", "activation_length", "activation_vocab")


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


def _stored_specs(config: DecoderConfig, stack: LayerStack, x: jax.Array, context: ShardingContext) -> Any:
    """The rules' sharding of each of the stack's parameters, from their logical axes (an abstract init of the
    stack, traced unsharded so that it records nothing): with Auto axes a traced parameter does not carry it."""
    module = _scanned(stack.layer, stack)(config, **stack.options)
    hidden = jax.ShapeDtypeStruct(x.shape, x.dtype)
    with unsharded():
        boxed = jax.eval_shape(lambda h: module.init(jax.random.key(0), h, None), hidden)["params"]
    logical = nn.get_partition_spec(boxed)
    return jax.tree.map(
        lambda spec: context.resolve(tuple(spec)), logical, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)
    )


class Decoder(nn.Module):
    """Layer stacks, then the final norm and the vocabulary projection."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        stacks = layer_stacks(cfg)
        context = current_context()
        for stack in stacks:
            if context is not None and context.explicit:
                # A scan's carry keeps its type: enter each stack on the residual stream's sharding.
                x = jax.sharding.reshard(x, context.resolve(RESIDUAL))
            main = stack is stacks[-1]
            if main and context is not None and context.pipeline is not None and not self.is_initializing():
                x = self._pipelined(x, stack, context)
                continue
            # MaxText's `remat_policy` (default `full`: each layer saves only its input and recomputes the rest
            # in the backward pass, which is where its gathers run a second time); shardscope's `none` keeps all.
            layer = stack.layer
            if cfg.remat != "none":
                policy = remat_policy(cfg.remat, cfg.remat_custom)
                layer = nn.remat(stack.layer, prevent_cse=False, policy=policy)
            x, _ = _scanned(layer, stack)(cfg, **stack.options, name=stack.name)(x, None)
        x = RMSNorm(cfg.norm_epsilon, name="decoder_norm")(x)
        logits = DenseGeneral((cfg.vocab_size,), ("embed_vocab", "vocab"), dtype=cfg.dtype, name="logits_dense")(x)
        out = explicit_spec(_LOGITS)
        return logits if out is None else jax.sharding.reshard(logits, out)

    def _pipelined(self, x: jax.Array, stack: LayerStack, context: ShardingContext) -> jax.Array:
        """The main stack run by the pipeline, one layer at a time on the parameters its scan created."""
        layer = stack.layer_module(self.config, parent=None)

        def apply_layer(params, hidden):
            return layer.apply({"params": params}, hidden, None)[0]

        # MaxText rematerialises a pipeline's iterations under the model's policy with each layer's input
        # kept (its pipeline remat policy). Here the layers inside a stage are rematerialised under the
        # model's policy as outside a pipeline, and the schedule around them keeps each layer's input, so the
        # backward pass recomputes each layer once from its kept input, as MaxText's does (a schedule that
        # kept nothing would be recomputed whole first: every layer's forward twice).
        cfg = self.config
        remat = None
        if cfg.remat != "none":
            layer_policy = remat_policy(cfg.remat, cfg.remat_custom)
            remat = PipelineRemat(layer=layer_policy, schedule=pipeline_remat_policy(cfg.remat, cfg.remat_custom))
        gather_once = context.pipeline is not None and context.pipeline.fsdp_gather_once
        specs = _stored_specs(cfg, stack, x, context) if gather_once else None
        with path_prefix((*self.path, stack.name)):
            params = self.variables["params"][stack.name]
            return run_pipeline(
                apply_layer, params, x, context, PARAM_SCAN_AXIS, context.resolve(RESIDUAL), remat, specs
            )


class Transformer(nn.Module):
    """Token embedding (`token_embedder`) + decoder; returns logits [batch, seq, vocab]."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        with weights_in(self.config.weight_dtype):
            return Decoder(self.config, name="decoder")(Embed(self.config, name="token_embedder")(tokens))


def next_token_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of `targets` under `logits` (computed in float32)."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    # A one-hot product instead of a gather: it works whatever the vocabulary's sharding (ep-tp splits it).
    picked = jnp.sum(log_probs * jax.nn.one_hot(targets, logits.shape[-1], dtype=log_probs.dtype), axis=-1)
    return -jnp.mean(picked)
