"""A GPU program's library matmuls: the cuBLAS calls XLA's GPU compiler rewrites dots into where Triton does not
compile them (`--xla_gpu_enable_triton_gemm=false`, as MaxText's GPU runs set it).

A call is a `custom-call` to `__cublas$gemm`, `__cublas$lt$matmul` or, for a dot of two float8 inputs,
`__cublas$lt$matmul$f8` (whose operands add the inputs' scales). Its result is a tuple (the product, then
cuBLAS's workspace); the dot it stands for is in its backend config, `gemm_backend_config.dot_dimension_numbers`
(`{"lhs_contracting_dimensions":["1"], …}`). Its FLOPs are that dot's, counted as a dot is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shardscope.hlo.flops import dot_flops
from shardscope.hlo.records import Instruction
from shardscope.hlo.shapes import shape_info

CUBLAS_PREFIX = "__cublas$"
_LHS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]')


def is_library_gemm(instruction: Instruction) -> bool:
    """Whether an op is a cuBLAS matmul call (any of its spellings)."""
    if instruction.opcode != "custom-call":
        return False
    return (instruction.attribute("custom_call_target") or "").strip('"').startswith(CUBLAS_PREFIX)


def _product_shape(shape: str) -> str:
    """The product of a call whose result is (product, workspace): its first element; a plain shape as it is."""
    text = shape.strip()
    if not text.startswith("("):
        return text
    depth = 0
    for i, char in enumerate(text[1:], start=1):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            return text[1:i].strip()
    return text[1:-1].strip()


def library_gemm_flops(instruction: Instruction, operand_shapes: Sequence[str]) -> int | None:
    """FLOPs of one cuBLAS matmul call (two per multiply-add, as a dot's), or None for any other op or a call
    whose backend config names no contracting dimensions."""
    if not is_library_gemm(instruction) or not operand_shapes:
        return None
    match = _LHS_CONTRACTING.search(instruction.attribute("backend_config") or "")
    if match is None:
        return None
    contracting = [int(v.strip().strip('"')) for v in match.group(1).split(",") if v.strip()]
    result = shape_info(_product_shape(instruction.shape))[1]
    return dot_flops(result, shape_info(operand_shapes[0])[1], contracting)
