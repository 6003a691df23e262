"""A circular pipeline with Explicit axes is MaxText's explicit pipeline: each step picks its visit's weights
out of all of a stage's layers, and when those weights are split over FSDP too, the step's gradient becomes a
buffer of every visit's weights, materialised and added into the gradient at every step (MaxText's compile of
seed 003 moves 2.7 TB more HBM traffic per step that way than its Auto twin; the published-runs benchmark
prices the TPU compile of that run). Weights split over the stage axis alone take the gradient in place."""

from __future__ import annotations

import re

import pytest

from shardscope.case import resolve_case
from shardscope.stages.compile import lower_case

FSDP = {"data": 1, "stage": 2, "fsdp": 2, "expert": 2}
STAGE_ONLY = {"data": 4, "stage": 2, "fsdp": 1, "expert": 1}
REPEATS = 2


def barrier_shapes(mode: str, mesh: dict[str, int]) -> list[str]:
    """The types of the single values the lowered step (StableHLO text) puts behind an optimization barrier
    (remat's barriers hold several values at once)."""
    overrides = {"pipeline.repeats": str(REPEATS), "pipeline.microbatches": "2", "shard_mode": mode}
    text = lower_case(resolve_case("llama-tiny", "explicit-pipeline", mesh=mesh, overrides=overrides)).lowered.as_text()
    return re.findall(r"= stablehlo\.optimization_barrier %[\w#.]+ : (tensor<[^>]*>)\n", text)


def test_fsdp_split_weights_take_every_visits_gradient_every_step():
    shapes = barrier_shapes("explicit", FSDP)
    # One materialised buffer per main-stack weight, each with every visit's copy (leading dimension).
    assert shapes and all(shape.startswith(f"tensor<{REPEATS}x") for shape in shapes)


@pytest.mark.parametrize(("mode", "mesh"), [("explicit", STAGE_ONLY), ("auto", FSDP)])
def test_otherwise_the_gradient_stays_in_place(mode, mesh):
    assert barrier_shapes(mode, mesh) == []
