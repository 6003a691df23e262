"""HLO shapes as numbers: element type, dimensions and bytes, whatever layout, tiling or dynamic bound.

`f32[8,16]{1,0:T(8,128)S(1)}` is 512 bytes of float32 [8, 16]; a tuple `(bf16[8]{0}, f32[4]{0})` is the sum
of its buffers (a combiner's merged collective moves all of them); `token[]` and `opaque[]` carry no data;
a dynamic dimension `<=8` counts at its bound (the buffer is allocated at the bound).
"""

from __future__ import annotations

import functools
import re

from shardscope.hlo.metadata import matching_bracket, split_outside_brackets

__all__ = ["async_start_output", "hbm_bytes", "shape_info"]

_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_DTYPE_RE = re.compile(r"([sufc])(\d+)(.*)$")
_COMMENT_RE = re.compile(r"/\*.*?\*/")
# An array with its layout, `f32[8,16]{1,0:T(8,128)S(1)}`: S(n) with n > 0 puts it outside HBM (1: the
# core's vector memory, 2: scalar memory, 5: host memory).
_LAID_OUT_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
_MEMORY_SPACE_RE = re.compile(r"S\((\d+)\)")
_DTYPES = {"pred": "bool", "bf16": "bfloat16", "s": "int", "u": "uint", "f": "float", "c": "complex"}


def _dtype(hlo_type: str) -> str:
    """numpy-style dtype name of an HLO element type: bf16 -> bfloat16, s32 -> int32, f8e4m3fn -> float8_e4m3fn."""
    if hlo_type in _DTYPES:
        return _DTYPES[hlo_type]
    m = _DTYPE_RE.match(hlo_type)
    if not m:
        return hlo_type
    return _DTYPES[m.group(1)] + m.group(2) + (f"_{m.group(3)}" if m.group(3) else "")


def _bits(hlo_type: str) -> int:
    m = re.search(r"\d+", hlo_type)
    return 8 if hlo_type == "pred" else int(m.group()) if m else 0


def _dim(text: str) -> int:
    text = text.strip().lstrip("<=")  # dynamic dims print as their bound, "<=8"
    return int(text) if text.isdigit() else 0


@functools.lru_cache(maxsize=4096)
def shape_info(shape: str) -> tuple[str, tuple[int, ...], int]:
    """(dtype, first array's dims, total bytes) of an HLO shape; layouts, tiling and dynamic dims are ignored.

    The dtype of a tuple of several element types joins them sorted, e.g. "bfloat16+float32".
    """
    arrays = [(t, d) for t, d in _ARRAY_RE.findall(shape) if t not in ("token", "opaque")]
    total = 0
    dims_of_first: tuple[int, ...] = ()
    for i, (hlo_type, dims_text) in enumerate(arrays):
        dims = tuple(_dim(d) for d in dims_text.split(",") if d.strip())
        elements = 1
        for d in dims:
            elements *= d
        total += (elements * _bits(hlo_type) + 7) // 8
        dims_of_first = dims if i == 0 else dims_of_first
    return "+".join(sorted({_dtype(t) for t, _ in arrays})), dims_of_first, total


@functools.lru_cache(maxsize=4096)
def hbm_bytes(shape: str) -> int:
    """Bytes of a shape's arrays that live in HBM: those whose layout names no other memory space (a
    TPU program prefetches into vector memory, S(1), and offloads to host memory, S(5))."""
    total = 0
    for hlo_type, dims_text, layout in _LAID_OUT_RE.findall(_COMMENT_RE.sub("", shape)):
        if hlo_type in ("token", "opaque"):
            continue
        space = _MEMORY_SPACE_RE.search(layout)
        if space is not None and space.group(1) != "0":
            continue
        elements = 1
        for d in dims_text.split(","):
            if d.strip():
                elements *= _dim(d)
        total += (elements * _bits(hlo_type) + 7) // 8
    return total


def tuple_elements(text: str) -> list[str]:
    """Elements of the bracketed list that `text` starts with (a tuple shape's top-level shapes)."""
    return [p.strip() for p in split_outside_brackets(text[1 : matching_bracket(text, 0)], ",") if p.strip()]


def async_start_output(shape: str, op: str) -> str:
    """The output part of an async start's shape, for when no `-done` says it better.

    all-reduce-start returns its result; all-gather/collective-permute-start return (operand, result, ...);
    async wrappers return ((operands...), result, context...).
    """
    text = _COMMENT_RE.sub("", shape).strip()
    if not text.startswith("("):
        return shape
    parts = tuple_elements(text)
    if len(parts) >= 2 and (parts[0].startswith("(") or op != "all-reduce"):
        return parts[1]
    return shape
