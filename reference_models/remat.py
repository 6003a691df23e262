"""MaxText's rematerialisation policies by name (`layers/decoders.py: get_remat_policy`).

A policy says which named intermediate values of a layer the backward pass keeps on the device, which it
moves to host memory, and (everything else) which it recomputes. The values carry MaxText's names
(`checkpoint_name`), tagged where MaxText tags them: the q/k/v projections (`query_proj`, `key_proj`,
`value_proj`), the attention result (`context`) and its output projection (`out_proj`), MLA's low-rank
projections (`query_wa_proj`, `mla_q`, `kv_wa_proj`, `mla_kv`), the MLP's (`mlpwi_0`, `mlpwi_1`, `mlpwo`)
and the experts' (`moe_mlpwi_0`, `moe_mlpwi_1`, `moe_mlpwo`, which are also `mlpwi_0`/`mlpwi_1`/`mlpwo`), and a
layer's input (`decoder_layer_input`).

`none` is shardscope's own: no remat at all (every activation kept). MaxText's `none` runs as `full`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

_QKV = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj")
_MINIMAL = (*_QKV, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")

# Policy name → names saved on the device (save_only_these_names).
SAVED: dict[str, tuple[str, ...]] = {
    "minimal": _MINIMAL,
    "minimal_with_context": (*_MINIMAL, "context"),
    "minimal_flash": (*_MINIMAL, "context"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_qkv_proj": _QKV,
    "save_out_proj": ("out_proj",),
}
# Policy name → names moved to host memory (save_and_offload_only_these_names; nothing kept on the device).
OFFLOADED: dict[str, tuple[str, ...]] = {
    "qkv_proj_offloaded": ("query_proj", "value_proj", "key_proj", "kv_proj"),
    "minimal_offloaded": _MINIMAL,
}


def remat_policy(name: str, custom: Sequence[tuple[str, str]] = ()) -> Callable[..., Any] | None:
    """The `jax.checkpoint` policy of a MaxText remat policy (None: save nothing but the layer's input).

    Args:
      name: one of `config.REMAT_POLICIES` other than "none".
      custom: for "custom", (tensor name, "device" | "offload" | "remat") pairs (MaxText's per-tensor keys).
    """
    if name in SAVED:
        return jax.checkpoint_policies.save_only_these_names(*SAVED[name])
    if name in OFFLOADED or name == "custom":
        if name == "custom":
            saved = [tensor for tensor, where in custom if where == "device"]
            offloaded = [tensor for tensor, where in custom if where == "offload"]
        else:
            saved, offloaded = [], list(OFFLOADED[name])
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=saved,
            names_which_can_be_offloaded=offloaded,
            offload_src="device",
            offload_dst="pinned_host",
        )
    if name == "full":
        return None
    raise ValueError(f"unknown remat policy {name!r}")


def pipeline_remat_policy(name: str, custom: Sequence[tuple[str, str]] = ()) -> Callable[..., Any]:
    """The policy a pipeline's iterations are rematerialised under (MaxText's `get_pipeline_remat_policy`;
    `name` one of `config.REMAT_POLICIES` other than "none"): a custom policy as it is (it says itself where
    each layer's input goes); any other keeps, besides what the model's policy keeps, each iteration's
    input (`iteration_input`) and each layer's (`decoder_layer_input`)."""
    model = remat_policy(name, custom)
    if name == "custom":
        assert model is not None
        return model
    inputs = jax.checkpoint_policies.save_only_these_names("iteration_input", "decoder_layer_input")
    return inputs if model is None else jax.checkpoint_policies.save_from_both_policies(model, inputs)
