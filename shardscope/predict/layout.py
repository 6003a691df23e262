"""The facts of a tensors-only plan a prediction reads: mesh order, data-parallel axes, each weight's layers.

A weight (kind "param") is stacked over layers by a dimension whose logical name ends in "layers"
(`layers`, `moe_layers`, `dense_layers`); the scan runs once per layer, so a per-layer collective executes
that dimension's size times. An expert dimension (logical `exp`) keeps its shards: tokens travel to the
experts, not the experts to the tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardscope.case.rules import entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import TensorRecord

EXPERT_LOGICAL = "exp"
# Flax's `nn.Embed` table: read by a gather of the looked-up rows, never gathered whole nor all-reduced (the
# compiled goldens move the token ids and the looked-up rows instead: activation traffic, not predicted).
LOOKUP_TABLE_LEAF = "embedding"
# Activation dimensions that split the tokens: a weight used by split tokens is gathered whole over those axes
# (FSDP), and its gradient is partial per device and summed over them.
_TOKEN_WORDS = ("batch", "length")


@dataclass(frozen=True)
class Weight:
    """One parameter as the scan sees it: the per-layer slice each layer gathers and differentiates."""

    path: str  # "params/decoder/layers/mlp/wi_0/kernel"
    module: str  # "decoder/layers/mlp/wi_0": the path without `params/` and the leaf, as compiled rows' source
    record: TensorRecord
    loop_trips: int  # layers of its stack (1 when not stacked)
    layer_shape: tuple[int, ...]  # per-layer shape: stack dims dropped, expert dims at their shard size
    gathered_axes: tuple[str, ...]  # mesh order: the axes (size > 1) each layer gathers it over
    kept_axes: tuple[str, ...]  # mesh order: the axes it stays split on where a layer uses it (experts, TP)
    stack_axes: tuple[str, ...]  # mesh order: the axes its layer dims are split on (pipeline stages)

    @property
    def is_expert(self) -> bool:
        """A MoE expert weight (it has an `exp` dimension)."""
        return self.record.logical is not None and EXPERT_LOGICAL in self.record.logical


def mesh_sizes(plan: Plan) -> dict[str, int]:
    """Mesh axis → size, in mesh order."""
    return dict(plan.case.mesh)


def in_mesh_order(plan: Plan, axes: set[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`axes` without size-1 axes (they split nothing, and compiled rows never name them), in mesh order."""
    return tuple(axis for axis, size in plan.case.mesh if axis in axes and size > 1)


def is_stack_dim(logical: str | None) -> bool:
    """The dimension a scan over layers slices (`layers`, `moe_layers`, `dense_layers`)."""
    return logical is not None and logical.endswith("layers")


def token_axes(plan: Plan) -> tuple[str, ...]:
    """The mesh axes the activations' batch and sequence dimensions are split on: the data- and
    context-parallel axes, over which each device computes a partial weight gradient that must be summed."""
    found: set[str] = set()
    for _, record in plan.tensors:
        if record.kind != "activation" or record.logical is None:
            continue
        for logical, entry in zip(record.logical, record.spec, strict=False):
            if logical is not None and any(word in logical for word in _TOKEN_WORDS):
                found.update(entry_axes(entry))
    return in_mesh_order(plan, found)


def _placed(plan: Plan, path: str) -> TensorRecord | None:
    """The layout the MoE body uses an expert weight in, as the plan records it (`activations/<module>/w0_kernel`
    for `wi_0`, `w1_kernel` for `wi_1`, `wo_kernel` for `wo`): its spec names the axes that stay split."""
    module, leaf = path.removeprefix("params/").rsplit("/", 1)
    name = {"wi_0": "w0_kernel", "wi_1": "w1_kernel", "wo": "wo_kernel"}.get(leaf)
    return None if name is None else plan.tensor_map.get(f"activations/{module}/{name}")


def weight(plan: Plan, path: str, record: TensorRecord, tokens: tuple[str, ...]) -> Weight:
    """The per-layer view of one parameter. Over the token axes it is gathered; over other axes (tensor
    parallelism) it stays split, as do expert dimensions: from the recorded MoE layout where there is one."""
    logical = record.logical or (None,) * len(record.shape)
    trips, layer_shape = 1, []
    split: set[str] = set()
    kept: set[str] = set()
    stack: set[str] = set()
    for name, size, entry, local in zip(logical, record.shape, record.spec, record.shard_shape, strict=False):
        axes = set(entry_axes(entry))
        if is_stack_dim(name):
            # A stage-sharded stack: each stage loops over its own layers only.
            trips *= local if axes else size
            stack |= axes
            continue
        split |= axes
        dim_kept = axes if name == EXPERT_LOGICAL else axes - set(tokens)
        kept |= dim_kept
        layer_shape.append(size if not dim_kept else local if dim_kept == axes else -1)
    placed = _placed(plan, path) if EXPERT_LOGICAL in logical else None
    if placed is not None and len(placed.shape) == len(layer_shape):
        kept = {axis for entry in placed.spec for axis in entry_axes(entry)}
        layer_shape = list(placed.shard_shape)
    elif -1 in layer_shape:
        sizes = dict(plan.case.mesh)
        dims = [d for d, name in enumerate(logical) if not is_stack_dim(name)]
        layer_shape = [
            -(-record.shape[d] // math.prod(sizes[a] for a in entry_axes(record.spec[d]) if a in kept)) for d in dims
        ]
    return Weight(
        path=path,
        module=path.removeprefix("params/").rsplit("/", 1)[0],
        record=record,
        loop_trips=trips,
        layer_shape=tuple(layer_shape),
        gathered_axes=in_mesh_order(plan, split - kept),
        kept_axes=in_mesh_order(plan, kept),
        stack_axes=in_mesh_order(plan, stack),
    )


def weights(plan: Plan) -> tuple[Weight, ...]:
    """Every parameter of the plan but lookup tables, in path order."""
    tokens = token_axes(plan)
    return tuple(
        weight(plan, path, record, tokens)
        for path, record in plan.tensors
        if record.kind == "param" and path.rsplit("/", 1)[-1] != LOOKUP_TABLE_LEAF
    )


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a dense array."""
    import ml_dtypes  # noqa: F401  # lazy: registers bfloat16 and the float8 types with numpy
    import numpy as np

    return math.prod(shape) * np.dtype(dtype).itemsize
