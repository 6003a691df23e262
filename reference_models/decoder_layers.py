"""The decoder layers of each family as MaxText writes them (`models/deepseek.py`, `models/mixtral.py`,
`models/llama2.py`).

Each layer takes and returns the carry of an `nn.scan` (hidden, None). Its activation constraints carry
the names of the variables MaxText constrains, so a plan's `activations/…/pre_attention_norm` is the
value MaxText's sharding dump calls `deepseek/pre_attention_norm`.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from reference_models.attention import MLA, Attention
from reference_models.config import DecoderConfig
from reference_models.layers import MlpBlock, RMSNorm
from reference_models.moe import RoutedAndSharedMoE, RoutedMoE
from reference_models.sharding import constrain

# The residual stream between and inside layers (every family).
RESIDUAL = ("activation_batch", "activation_norm_length", "activation_embed")


class DeepSeekLayer(nn.Module):
    """MLA attention, then a dense MLP (`mlp`) or the routed + shared MoE (`DeepSeekMoeBlock_0`)."""

    config: DecoderConfig
    use_moe: bool

    @nn.compact
    def __call__(self, inputs: jax.Array, _: None) -> tuple[jax.Array, None]:
        cfg = self.config

        def named(name: str, value: jax.Array) -> jax.Array:
            return constrain(self.path, name, value, RESIDUAL)

        # Named as MaxText names it, so a remat policy can keep it on the device or move it to the host.
        x = checkpoint_name(named("inputs", inputs), "decoder_layer_input")
        lnx = named("pre_attention_norm", RMSNorm(cfg.norm_epsilon, name="pre_self_attention_layer_norm")(x))
        attention_result = named("attention_result", MLA(cfg, name="self_attention")(lnx, lnx))
        intermediate_inputs = x + attention_result
        hidden_states = named(
            "post_attention_norm", RMSNorm(cfg.norm_epsilon, name="post_self_attention_layer_norm")(intermediate_inputs)
        )
        if self.use_moe:
            mlp_out = named("mlp_lnx", RoutedAndSharedMoE(cfg, name="DeepSeekMoeBlock_0")(hidden_states))
        else:
            mlp_out = named("mlp", MlpBlock(cfg, cfg.mlp_dim, name="mlp")(hidden_states))
        # MaxText constrains the layer output after its (identity) dropout, under the name `x`.
        return named("x", mlp_out + intermediate_inputs), None


class GqaLayer(nn.Module):
    """Grouped-query attention, then the routed MoE (`MoeBlock_0`, MixtralLayer) or a dense SwiGLU MLP
    (`mlp`, LlamaLayer).

    Both constrain the same six values on the residual stream's axes. Llama's go through
    `maybe_shard_with_logical`, so MaxText's sharding dump records them, but cannot name them (the variable
    name is looked up one frame too far up): it writes each as `Unknown`, one entry per distinct type and spec.
    """

    config: DecoderConfig
    use_moe: ClassVar[bool]

    @nn.compact
    def __call__(self, inputs: jax.Array, _: None) -> tuple[jax.Array, None]:
        cfg = self.config

        def named(name: str, value: jax.Array) -> jax.Array:
            return constrain(self.path, name, value, RESIDUAL)

        inputs = checkpoint_name(named("inputs", inputs), "decoder_layer_input")
        lnx = named("lnx", RMSNorm(cfg.norm_epsilon, name="pre_self_attention_layer_norm")(inputs))
        attention_lnx = named("attention_lnx", Attention(cfg, name="self_attention")(lnx, lnx))
        intermediate_inputs = inputs + attention_lnx
        hidden_states = named(
            "hidden_states", RMSNorm(cfg.norm_epsilon, name="post_self_attention_layer_norm")(intermediate_inputs)
        )
        if self.use_moe:
            mlp: nn.Module = RoutedMoE(cfg, ("embed", None), cfg.moe_mlp_dim, name="MoeBlock_0")
        else:
            mlp = MlpBlock(cfg, cfg.mlp_dim, name="mlp")
        mlp_lnx = named("mlp_lnx", mlp(hidden_states))
        # MaxText constrains the layer output after its (identity) dropout.
        return named("layer_output", mlp_lnx + intermediate_inputs), None


# Two classes, not one with a flag: the class name is part of every op's name in the compiled program (its
# metadata), which is where a plan's collective rows say they come from.
class MixtralLayer(GqaLayer):
    """Mixtral's `MixtralDecoderLayer`: every layer a routed MoE."""

    use_moe = True


class LlamaLayer(GqaLayer):
    """MaxText's `LlamaDecoderLayer` (Llama 2, 3 and 3.1): every layer a dense MLP."""

    use_moe = False
