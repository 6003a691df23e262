"""The one config record both model families are built from (flavors fill it in, see deepseek.py/mixtral.py).

Field names follow MaxText's model configs where one exists (`configs/models/*.yml`): `embed_dim` is
`base_emb_dim`, `num_heads` `base_num_query_heads`, `first_dense_layers` `first_num_dense_layers`,
`per_device_batch` `per_device_batch_size`, `seq_len` `max_target_length`.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a token picks its experts (MaxText's `routed_score_func` and `routed_bias`):
#   "softmax_topk": softmax over every expert, top-k of the probabilities (DeepSeek-V2);
#   "topk_softmax": top-k of the logits, softmax over those k (Mixtral);
#   "sigmoid_bias": sigmoid scores, top-k of scores + a learned bias, weights renormalised (DeepSeek-V3).
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_bias")


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """Pipeline parallelism: layers split over the `stage_axis` mesh axis, the batch into `microbatches`, the
    stages visited `repeats` times (circular schedules; the models run 1). The one record for presets and
    models alike (a preset file spells the axis `stages_axis`)."""

    stage_axis: str = "stage"
    microbatches: int = 1
    repeats: int = 1


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Shapes and choices of a decoder-only MoE transformer.

    Attention is "mla" (DeepSeek: low-rank q/kv with rope and no-rope parts) or "gqa" (Mixtral).
    The first `first_dense_layers` layers use a dense MLP, the rest a MoE block.
    """

    family: str  # "deepseek" | "mixtral"
    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    attention: str  # "mla" | "gqa"
    # GQA
    num_kv_heads: int = 0
    head_dim: int = 0
    # MLA
    q_lora_rank: int = 0  # 0 = no low-rank query projection (DeepSeek-V2-Lite)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MLPs
    first_dense_layers: int = 0
    mlp_dim: int = 0
    num_experts: int
    num_experts_per_token: int
    moe_mlp_dim: int
    num_shared_experts: int = 0
    router: str = "softmax_topk"  # one of ROUTERS
    capacity_factor: float | None = None  # None = dropless (capacity = local tokens)
    # The batch a train step sees: `global_batch` sequences if set, else `per_device_batch` per device
    # (MaxText's per_device_batch_size; fractional when the sequence is split over devices).
    seq_len: int
    per_device_batch: float = 1.0
    global_batch: int = 0
    dtype: str = "float32"  # activation dtype; parameters are float32
    # MaxText's `remat_policy`: "full" recomputes each layer in the backward pass (its default), "none"
    # keeps every activation.
    remat: str = "full"
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6

    @property
    def num_moe_layers(self) -> int:
        """Layers that use the MoE block."""
        return self.num_layers - self.first_dense_layers

    @property
    def routed_bias(self) -> bool:
        """Whether the router has a learned per-expert bias (a `gate/bias` parameter)."""
        return self.router == "sigmoid_bias"

    def batch_for(self, num_devices: int) -> int:
        """Sequences per step on `num_devices` devices (what `global_batch`/`per_device_batch` say)."""
        if self.global_batch:
            return self.global_batch
        return int(self.per_device_batch * num_devices)
