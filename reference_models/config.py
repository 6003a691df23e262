"""The one config record every model family is built from (flavors fill it in, see deepseek.py, mixtral.py,
llama.py).

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
# MaxText's `attention` values that shardscope models (see DecoderConfig.attention_kernel).
ATTENTION_KERNELS = ("dot_product", "flash", "autoselected")
# The splash kernel's blocks besides the query block (MaxText's sa_block_<name>), and their default size.
SPLASH_BLOCKS = ("kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")
SPLASH_BLOCK_DEFAULT = 512
# How the experts' matmuls run (DecoderConfig.expert_matmul).
EXPERT_MATMULS = ("dense", "grouped")
# The named scopes that mark a stand-in for a TPU kernel in the compiled program: shardscope's kernel-marker
# protocol (`shardscope.kernels`, docs/concepts/pricing.md), spelled here by name as any program may, so that
# the models need nothing of shardscope. Around the experts' matmuls when they run grouped:
GROUPED_SCOPE = "shardscope.kernel.grouped_matmul"
# around an attention kernel's stand-in (reference_models/flash_stand_in.py):
ATTENTION_KERNEL_SCOPE = "shardscope.kernel.attention"
# and, inside it, around the matmuls a load-balanced kernel visits half of (flash_stand_in.py):
HALF_VISITED_SCOPE = "shardscope.kernel.half_visited"
# Where MaxText's `custom` remat policy puts a named value: recomputed, kept on the device, or offloaded.
REMAT_LOCATIONS = ("remat", "device", "offload")
# MaxText's remat policies by name (`remat.py` builds them), and shardscope's "none" (no remat).
REMAT_POLICIES = (
    "full",
    "none",
    "minimal",
    "minimal_with_context",
    "minimal_flash",
    "save_dot_with_context_except_mlp",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_qkv_proj",
    "save_out_proj",
    "qkv_proj_offloaded",
    "minimal_offloaded",
    "custom",
)


# MaxText's FSDP mesh axes (its `FSDP_MESH_AXES`): what its gather-once options gather weights over.
FSDP_AXES = ("fsdp", "fsdp_transpose")


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """Pipeline parallelism: layers split over the `stage_axis` mesh axis, the batch into `microbatches`, the
    stages visited `repeats` times (circular schedules, see reference_models.pipeline). The one record for presets and
    models alike (a preset file spells the axis `stages_axis`).

    `fsdp_gather_once`: MaxText's `pipeline_fsdp_ag_once`: the stack's weights are gathered over the
    `fsdp` and `fsdp_transpose` axes once, before the schedule, instead of at every step."""

    stage_axis: str = "stage"
    microbatches: int = 1
    repeats: int = 1
    fsdp_gather_once: bool = False

    @property
    def gathered_once(self) -> tuple[str, ...]:
        """The mesh axes the stack's weights are gathered over once, before the schedule (MaxText's names)."""
        return FSDP_AXES if self.fsdp_gather_once else ()


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Shapes and choices of a decoder-only transformer, MoE or dense.

    Attention is "mla" (DeepSeek: low-rank q/kv with rope and no-rope parts) or "gqa" (Mixtral, Llama).
    The first `first_dense_layers` layers use a dense MLP, the rest a MoE block; Llama has no MoE block
    (every layer is dense, `num_experts` is 0).
    """

    family: str  # "deepseek" | "mixtral" | "llama"
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
    num_experts: int = 0  # 0: no MoE block (Llama)
    num_experts_per_token: int = 0
    moe_mlp_dim: int = 0
    num_shared_experts: int = 0
    router: str = "softmax_topk"  # one of ROUTERS
    capacity_factor: float | None = None  # None = dropless (capacity = local tokens)
    # MaxText's expert matmuls: "dense" (sparse_matmul=false: einsums over capacity slots) or "grouped"
    # (sparse_matmul: one grouped-matmul kernel over the tokens sorted by expert, megablox on TPU). The
    # program computes the same slots either way; "grouped" marks them `GROUPED_SCOPE` so that the cost
    # model prices them as the kernel runs.
    expert_matmul: str = "dense"
    # MaxText's `shard_exp_on_fsdp`: the expert weights keep their expert dimension on the FSDP axes
    # (("embed_moe", -, "mlp_moe") instead of ("exp", "embed_moe", "mlp_moe")), so that gathering them for the
    # expert matmuls concatenates whole experts instead of interleaving rows of each.
    shard_experts_on_fsdp: bool = False
    # MaxText's `use_2d_fsdp_sharding`: every expert weight stored as (embed_moe, mlp_moe, -), its experts on
    # fsdp and its first matrix dimension on fsdp_transpose (both FSDP axes, one per dimension), and gathered
    # whole for the expert matmuls. `shard_experts_on_fsdp` wins when both are set, as in MaxText.
    experts_2d_fsdp: bool = False
    # MaxText's `use_iota_embed`: the token embedding as a one-hot matmul instead of a gather (layers.Embed).
    iota_embed: bool = False
    # MaxText's `num_vocab_tiling`: the loss runs over this many chunks of the batch's tokens, one chunk's
    # logits at a time, recomputed in the backward pass (vocab_tiling.py); 1: the whole batch's logits.
    vocab_tiles: int = 1
    # The batch a train step sees: `global_batch` sequences if set, else `per_device_batch` per device
    # (MaxText's per_device_batch_size; fractional when the sequence is split over devices).
    seq_len: int
    per_device_batch: float = 1.0
    global_batch: int = 0
    dtype: str = "float32"  # activation dtype
    # MaxText's `weight_dtype`: the parameters' dtype (and so the optimizer state's, which follows them).
    weight_dtype: str = "float32"
    # MaxText's `grad_dtype`: float32 gradients are cast to it before the optimizer (and so are summed over
    # devices in it); `mu_dtype`: AdamW's first moment's dtype ("": the parameters').
    grad_dtype: str = "float32"
    mu_dtype: str = ""
    # MaxText's `remat_policy` (one of REMAT_POLICIES; see remat.py): "full" recomputes each layer in the
    # backward pass (its default); "none" (shardscope's) keeps every activation.
    remat: str = "full"
    # For remat "custom": MaxText's per-tensor keys, (tensor name, "device" | "offload" | "remat").
    remat_custom: tuple[tuple[str, str], ...] = ()
    # MaxText's `attention`: "dot_product" materialises [seq × seq] scores; "flash" runs as its TPU kernel
    # does (query blocks of `attention_block` rows against the keys up to the diagonal, recomputed in the
    # backward pass: flash_stand_in.py); "autoselected" is flash from 128 tokens on, as
    # MaxText selects it on TPU.
    attention_kernel: str = "dot_product"
    attention_block: int = 512
    # On a TPU, flash attention is MaxText's splash kernel (splash.py), tiled as MaxText's `sa_block_*` say:
    # (kernel block name, size) pairs for the blocks other than the query block, which is `attention_block`
    # (`sa_block_q`); unnamed blocks are MaxText's default 512. `attention_fused_backward`:
    # `sa_use_fused_bwd_kernel` (one backward kernel for queries, keys and values instead of two).
    attention_blocks: tuple[tuple[str, int], ...] = ()
    attention_fused_backward: bool = False
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6
    # The model's own `logical_axis_rules` in MaxText's model yml (llama2-7b: `[['norm', 'fsdp']]`). MaxText
    # merges them into base.yml's rules (each replaces base.yml's rules of its logical name and goes last);
    # a `custom_mesh_and_rule` file replaces the rules wholesale, these included.
    logical_axis_rules: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # A pipelined case's stages (> 1) and repeats: the main stack's parameters are then laid out as MaxText's
    # pipeline lays them out (decoder.PipelineLayout); 0 stages: stacked as a scan stacks them.
    pipeline_stages: int = 0
    pipeline_repeats: int = 1

    @property
    def num_moe_layers(self) -> int:
        """Layers that use the MoE block (none in Llama, whose every layer is dense)."""
        if self.family == "llama":
            return 0
        return self.num_layers - self.first_dense_layers

    @property
    def main_stack_layers(self) -> int:
        """Layers of the last layer stack, the one a pipeline splits over stages (decoder.layer_stacks)."""
        return self.num_layers if self.family == "llama" else self.num_moe_layers

    @property
    def uses_flash_attention(self) -> bool:
        """Whether attention runs as the flash/splash kernel does (see `attention_kernel`)."""
        return self.attention_kernel == "flash" or (self.attention_kernel == "autoselected" and self.seq_len >= 128)

    @property
    def splash_block_sizes(self) -> dict[str, int]:
        """The splash kernel's block sizes by its names (`q`, `kv`, `kv_compute`, `q_dkv`, …)."""
        sizes = dict.fromkeys(SPLASH_BLOCKS, SPLASH_BLOCK_DEFAULT) | dict(self.attention_blocks)
        return {"q": self.attention_block, **sizes}

    @property
    def routed_bias(self) -> bool:
        """Whether the router has a learned per-expert bias (a `gate/bias` parameter)."""
        return self.router == "sigmoid_bias"

    def batch_for(self, num_devices: int) -> int:
        """Sequences per step on `num_devices` devices (what `global_batch`/`per_device_batch` say)."""
        if self.global_batch:
            return self.global_batch
        return int(self.per_device_batch * num_devices)
