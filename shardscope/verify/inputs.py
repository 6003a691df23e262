"""The numbers both sides start from: the model's parameters initialised for real from a fixed key, and one
batch of tokens per step from a fixed seed, on the host (each side places them with its own shardings)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from reference_models.config import DecoderConfig
from shardscope.case.resolve import Case
from shardscope.errors import ShardscopeError
from shardscope.stages.initial import initial_params
from shardscope.stages.state import unplaced_state
from shardscope.verify.layout import stacked_config

SEED = 0
# Real parameters and optimizer state live in host memory, three copies a side: a tiny model's few
# megabytes, never a real model's gigabytes.
MAX_PARAMETERS = 50_000_000


@dataclass(frozen=True)
class StartingPoint:
    """Parameters (stacked as a scan stacks them, host arrays) and one batch per step (tokens and next-token
    targets), the same for both sides."""

    params: Any
    batches: tuple[dict[str, np.ndarray], ...]


def check_small_enough(case: Case) -> None:
    """Refuses a model too large to run for real on the host.

    Raises:
      ShardscopeError: more parameters than `MAX_PARAMETERS`.
    """
    state, _ = unplaced_state(case)
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state["params"]))
    if count > MAX_PARAMETERS:
        raise ShardscopeError(
            f"verify runs real steps on the host: {case.model_name} has {count:,} parameters (at most "
            f"{MAX_PARAMETERS:,}); verify a tiny flavor of it (deepseek-tiny, mixtral-tiny, llama-tiny)"
        )


def starting_point(config: DecoderConfig, global_batch: int, steps: int, seed: int = SEED) -> StartingPoint:
    """Parameters of the stacked model from `seed`, and `steps` batches of `global_batch` sequences."""
    shape = (global_batch, config.seq_len)
    params = initial_params(stacked_config(config), shape, seed)
    generator = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        tokens = generator.integers(0, config.vocab_size, size=shape, dtype=np.int32)
        batches.append({"tokens": tokens, "targets": np.roll(tokens, -1, axis=1)})
    return StartingPoint(params, tuple(batches))
