"""FLOPs of MaxText's Pallas attention kernels (splash/flash `tpu_custom_call`s of a TPU program), counted
from their operands' shapes and block grid, and the fraction of a causal grid such a kernel visits."""

from __future__ import annotations

import re
from collections.abc import Sequence

from shardscope.hlo.origins import op_name_of
from shardscope.hlo.records import Instruction
from shardscope.hlo.shapes import shape_info, tuple_elements

__all__ = ["attention_kernel_flops", "causal_block_fraction"]


# A Pallas attention kernel's pass, from its name, and the [L × S] matmuls it runs per block, as (those
# over the query/key head dimension, those over the value head dimension): the forward pass (scores;
# values), the query gradient (scores again, the queries' gradient; the probabilities' gradient), the
# key/value gradient (scores, the keys' gradient; the probabilities' and the values' gradients), a fused
# backward kernel all of them once. MLA's value heads are narrower than its query/key heads (128 and 192).
_ATTENTION_KERNEL = re.compile(r"(?:splash|flash)\w*?_(fwd|dq|dkv|bwd)(?:_|$)")
_KERNEL_MATMULS = {"fwd": (1, 1), "dq": (2, 1), "dkv": (2, 2), "bwd": (3, 2)}


def attention_kernel_flops(instruction: Instruction, operand_shapes: Sequence[str]) -> int | None:
    """FLOPs of one run of a Pallas attention kernel (None: not one). q, k and v are its first three float
    operands of rank 4 ([batch, heads, length, head dim]; rank 3 where the compiler dropped a batch of one);
    its block mask (an int8 [.., query blocks, key blocks] operand) says how many blocks it visits: a
    causal mask's lower triangle, as a language model's training kernel has (the mask's contents are not
    in the program, only its grid), on a grid of any [query blocks × key blocks] over a sequence attending
    to itself. Queries split along the sequence (context parallelism: a fraction of the keys' length)
    visit the lower triangle of the whole grid on average over the shards, as MaxText's load-balanced
    token order makes every shard do. An operand the kernel's recorded configuration lays out sequence-minor
    ([.., head dim, length]) is read so."""
    if instruction.opcode != "custom-call" or "tpu_custom_call" not in (
        instruction.attribute("custom_call_target") or ""
    ):
        return None
    match = _kernel_pass(instruction)
    if match is None:
        return None
    arrays = [shape_info(shape) for shape in operand_shapes]
    floats = [dims for dtype, dims, _ in arrays if len(dims) in (3, 4) and dtype.startswith(("bfloat16", "float"))]
    qk = [dims if len(dims) == 4 else (1, *dims) for dims in floats if len(dims) == len(floats[0])] if floats else []
    transposed = seq_minor(instruction)
    qk = [(*d[:2], d[3], d[2]) if name in transposed else d for name, d in zip(("q", "k", "v"), qk, strict=False)]
    if len(qk) < 2:
        return None
    (batch, heads, queries, dim), keys = qk[0], qk[1][2]
    value_dim = qk[2][3] if len(qk) > 2 else dim
    kind = match.group(1)
    if kind == "dkv" and _gradient_outputs(instruction.shape, floats) >= 3:
        kind = "bwd"  # a key/value kernel that returns the queries' gradient too: the fused backward kernel
    grid = next((dims[-2:] for dtype, dims, _ in arrays if dtype == "int8" and len(dims) >= 2), None)
    grid = grid or recorded_grid(instruction, kind, queries, keys)
    visited = 1.0
    if grid is not None and keys % queries == 0 and min(grid) > 0:
        visited = causal_block_fraction(grid[0] * keys // queries, grid[1])
    over_qk, over_v = _KERNEL_MATMULS[kind]
    return round(2 * batch * heads * queries * keys * (over_qk * dim + over_v * value_dim) * visited)


# The splash kernels record their configuration in the program (`frontend_attributes={kernel_metadata=…}`, a
# JSON object of whole numbers and flags): the layout of each of q, k and v, MaxText's and tokamax's
# `QKVLayout`, HEAD_DIM_MINOR = 1 ([.., length, head dim], what the shapes are read as) or SEQ_MINOR = 2
# ([.., head dim, length]), as `sa_q_layout=SEQ_MINOR` and the like choose; and each pass's block sizes, from
# which a kernel that takes its block mask as a list of the blocks it visits (tokamax's static sparsity: an
# int8 [visited] operand, no [query × key] grid in its shapes) has its grid.
_RECORDED = re.compile(r'\\?"(\w+)\\?":\s*(\d+)')
_SEQ_MINOR = 2
_PASS_BLOCKS = {
    "fwd": ("block_q", "block_kv"),
    "dq": ("block_q_dq", "block_kv_dq"),
    "dkv": ("block_q_dkv", "block_kv_dkv"),
    "bwd": ("block_q_dkv", "block_kv_dkv"),
}


def _recorded(instruction: Instruction) -> dict[str, int]:
    """The whole numbers of a kernel's recorded configuration, by name (empty when it records none)."""
    return {name: int(value) for name, value in _RECORDED.findall(instruction.attribute("frontend_attributes") or "")}


def recorded_grid(instruction: Instruction, kind: str, queries: int, keys: int) -> tuple[int, int] | None:
    """[query blocks, key blocks] of a kernel pass from the block sizes it records (None: it records none)."""
    recorded = _recorded(instruction)
    rows, columns = (recorded.get(name) for name in _PASS_BLOCKS[kind])
    if not rows or not columns:
        return None
    return -(-queries // rows), -(-keys // columns)


def seq_minor(instruction: Instruction) -> frozenset[str]:
    """Which of q, k, v an attention kernel takes head dimension first, length last (SEQ_MINOR), as its
    recorded configuration says; none when it records none."""
    recorded = _recorded(instruction)
    return frozenset(name for name in "qkv" if recorded.get(f"{name}_layout") == _SEQ_MINOR)


def _kernel_pass(instruction: Instruction) -> re.Match[str] | None:
    """The kernel's pass, from the instruction's name or else from its op_name: a kernel called inside a
    `vmap` (a pipeline's stages with Explicit axes) is named after the `shard_map` around it
    (`shard_map.1554`), its own name only in its op_name (`…/splash_mha_fwd_residuals/…/pallas_call`)."""
    return _ATTENTION_KERNEL.search(instruction.name) or _ATTENTION_KERNEL.search(op_name_of(instruction))


def causal_block_fraction(query_blocks: int, key_blocks: int | None = None) -> float:
    """The fraction of a grid of [query × key] blocks over one sequence that a causal kernel visits: every
    block holding a key at or before one of its queries. A query block i of n sees the key blocks up to its
    last row, ceil((i + 1) · keys / n) of them; on a square n × n grid that is (n + 1) / 2n. (A kernel of
    2048-row query blocks against 512-key blocks visits 3/4 of its grid, not all of it.)"""
    keys = query_blocks if key_blocks is None else key_blocks
    seen = sum(min(keys, -(-(i + 1) * keys // query_blocks)) for i in range(query_blocks))
    return seen / (query_blocks * keys)


def _gradient_outputs(shape: str, inputs: Sequence[tuple[int, ...]]) -> int:
    """How many of a kernel's results are gradients of its `inputs` (q, k, v): float arrays ending in an
    input's [heads, length, head dim] (with or without a batch, or partial sums stacked in front); the
    rest, [.., block, head dim], is scratch."""
    parts = tuple_elements(shape.strip()) if shape.strip().startswith("(") else [shape]
    arrays = [shape_info(part) for part in parts]
    ends = {tuple(dims[-3:]) for dims in inputs}
    return sum(
        1
        for dtype, dims, _ in arrays
        if len(dims) >= 3 and tuple(dims[-3:]) in ends and dtype.startswith(("bfloat16", "float"))
    )
