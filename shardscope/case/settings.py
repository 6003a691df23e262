"""`--set model.<field>=<value>`: what each model setting accepts, checked where it enters (no JAX).

Each field has a parser that turns the text into a value of the right type and range, or says in one line
what it expected; `check_model` then checks the fields against each other (a model whose settings do not
fit together must never reach the tracer, whose errors would not name the setting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from reference_models import DecoderConfig
from reference_models.config import (
    ATTENTION_KERNELS,
    EXPERT_MATMULS,
    REMAT_LOCATIONS,
    REMAT_POLICIES,
    SPLASH_BLOCKS,
)
from shardscope.errors import ShardscopeError

# Activation dtypes, with the short names people type.
DTYPES = {"float32": "float32", "f32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
DTYPES |= {"float16": "float16", "f16": "float16", "fp16": "float16"}


def _whole(text: str, minimum: int, what: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"expected {what}") from None
    if number < minimum:
        raise ValueError(f"expected {what}")
    return number


def _positive_number(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ValueError("expected a positive number, e.g. 1.25") from None
    if not number > 0 or number == float("inf"):
        raise ValueError("expected a positive number, e.g. 1.25")
    return number


def _capacity_factor(text: str) -> float | None:
    if text.lower() in ("none", "dropless", ""):
        return None
    try:
        return _positive_number(text)
    except ValueError:
        raise ValueError("expected a positive number (e.g. 1.25) or none (dropless)") from None


def _dtype(text: str) -> str:
    if text.lower() not in DTYPES:
        raise ValueError(f"expected one of {', '.join(sorted(set(DTYPES.values())))} (or bf16, fp16, fp32)")
    return DTYPES[text.lower()]


def _remat(text: str) -> str:
    if text not in REMAT_POLICIES:
        raise ValueError(
            f"expected a MaxText remat policy ({', '.join(p for p in REMAT_POLICIES if p != 'none')}) or none "
            "(no remat)"
        )
    return text


def _remat_custom(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, where = part.partition(":")
        if not sep or where not in REMAT_LOCATIONS or not name:
            raise ValueError("expected name:where pairs, where is device, offload or remat (query_proj:offload,…)")
        pairs.append((name, where))
    return tuple(pairs)


def _attention_kernel(text: str) -> str:
    if text not in ATTENTION_KERNELS:
        raise ValueError(f"expected one of {', '.join(ATTENTION_KERNELS)}")
    return text


def _attention_blocks(text: str) -> tuple[tuple[str, int], ...]:
    expected = f"expected block:size pairs, block one of {', '.join(SPLASH_BLOCKS)} (kv:2048,q_dkv:2048,…)"
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = part.partition(":")
        if not sep or name not in SPLASH_BLOCKS or not size.isdigit() or int(size) < 1:
            raise ValueError(expected)
        sizes[name] = int(size)
    return tuple(sorted(sizes.items()))


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError("expected true or false")
    return text.lower() == "true"


def _expert_matmul(text: str) -> str:
    if text not in EXPERT_MATMULS:
        raise ValueError(f"expected one of {', '.join(EXPERT_MATMULS)}")
    return text


MODEL_FIELDS: dict[str, Callable[[str], Any]] = {
    "seq_len": lambda text: _whole(text, 1, "a positive integer (tokens per sequence)"),
    "global_batch": lambda text: _whole(text, 0, "a whole number of sequences (0: per_device_batch × devices)"),
    "per_device_batch": _positive_number,
    "capacity_factor": _capacity_factor,
    "num_layers": lambda text: _whole(text, 1, "a positive integer"),
    "first_dense_layers": lambda text: _whole(text, 0, "a whole number of layers"),
    "dtype": _dtype,
    "weight_dtype": _dtype,
    "grad_dtype": _dtype,
    "mu_dtype": _dtype,
    "remat": _remat,
    "remat_custom": _remat_custom,
    "attention_kernel": _attention_kernel,
    "expert_matmul": _expert_matmul,
    "shard_experts_on_fsdp": _boolean,
    "experts_2d_fsdp": _boolean,
    "iota_embed": _boolean,
    "vocab_tiles": lambda text: _whole(text, 1, "a positive integer (chunks of the batch's tokens)"),
    "attention_block": lambda text: _whole(text, 1, "a positive integer (query rows per block)"),
    "attention_blocks": _attention_blocks,
    "attention_fused_backward": _boolean,
}
MODEL_SETTABLE = tuple(MODEL_FIELDS)


def apply_model_settings(model: DecoderConfig, settings: Mapping[str, str]) -> DecoderConfig:
    """`model.<field>` settings applied to a flavor (keys without the `model.` prefix).

    Raises:
      ShardscopeError: a value of the wrong type or range.
    """
    changes: dict[str, Any] = {}
    for field, text in settings.items():
        try:
            changes[field] = MODEL_FIELDS[field](text)
        except ValueError as err:
            raise ShardscopeError(f"--set model.{field}={text}: {err}") from None
    return dataclasses.replace(model, **changes)


def check_model(name: str, model: DecoderConfig, num_devices: int) -> None:
    """Settings that do not fit together: more dense layers than layers, a batch that is not whole.

    Raises:
      ShardscopeError: with the settings to change.
    """
    if model.first_dense_layers > model.num_layers:
        raise ShardscopeError(
            f"{name}: first_dense_layers={model.first_dense_layers} exceeds num_layers={model.num_layers}; "
            "change --set model.first_dense_layers=… or model.num_layers=…"
        )
    if model.family == "mixtral" and model.first_dense_layers:
        raise ShardscopeError(f"{name}: Mixtral has no dense layers; --set model.first_dense_layers must be 0")
    if model.family == "llama" and model.first_dense_layers:
        raise ShardscopeError(f"{name}: every Llama layer is dense; --set model.first_dense_layers must be 0")
    if not model.global_batch:
        batch = model.per_device_batch * num_devices
        if batch < 1 or batch != int(batch):
            raise ShardscopeError(
                f"{name}: per_device_batch={model.per_device_batch:g} on {num_devices} devices is "
                f"{batch:g} sequences, not a whole number ≥ 1; change --set model.per_device_batch=… "
                "or set model.global_batch=…"
            )
