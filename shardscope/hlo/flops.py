"""FLOPs of one dot or convolution instruction, from its shapes and attributes, as XLA's cost analysis
counts them (`HloCostAnalysis::HandleDot`, `GetConvolutionFlops`): two FLOPs per multiply-add.

The TPU compiler rewrites many dots as convolutions with padded, dilated or reversed windows (a batched
matmul becomes a convolution whose batch dimension is a spatial one); only the kernel positions that land
on a real input element count, as XLA counts them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_WINDOW_FIELD = re.compile(r"(size|stride|pad|lhs_dilate|rhs_dilate|rhs_reversal)=([\w\-]+)")


@dataclass(frozen=True)
class WindowDim:
    """One spatial dimension of a convolution window (XLA's `WindowDimension`)."""

    size: int
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    base_dilation: int = 1  # lhs_dilate
    window_dilation: int = 1  # rhs_dilate


def parse_window(text: str) -> tuple[WindowDim, ...]:
    """`size=1x4 pad=0_0x3_3 rhs_reversal=0x1` → one WindowDim per spatial dimension ("" → none)."""
    fields = dict(_WINDOW_FIELD.findall(text))
    if "size" not in fields:
        return ()
    sizes = [int(v) for v in fields["size"].split("x")]
    count = len(sizes)

    def ints(key: str, default: int) -> list[int]:
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * count

    pads = [tuple(int(p) for p in v.split("_")) for v in fields["pad"].split("x")] if "pad" in fields else []
    pads = pads or [(0, 0)] * count
    strides, lhs, rhs = ints("stride", 1), ints("lhs_dilate", 1), ints("rhs_dilate", 1)
    return tuple(WindowDim(sizes[i], strides[i], pads[i][0], pads[i][1], lhs[i], rhs[i]) for i in range(count))


def dot_flops(result_shape: Sequence[int], lhs_shape: Sequence[int], lhs_contracting: Sequence[int]) -> int:
    """2 × every output element × the contracted size."""
    return 2 * math.prod(result_shape) * math.prod(lhs_shape[d] for d in lhs_contracting)


def valid_positions(input_size: int, kernel_size: int, output_size: int, window: WindowDim) -> int:
    """How many (output position, kernel position) pairs read a real input element along one dimension."""
    outputs = np.arange(output_size, dtype=np.int64)
    total = 0
    for kernel in range(kernel_size):
        undilated = outputs * window.stride - window.padding_low + kernel * window.window_dilation
        if window.base_dilation > 1:
            on_element = undilated % window.base_dilation == 0
            index = undilated // window.base_dilation
        else:
            on_element = np.ones(output_size, dtype=bool)
            index = undilated
        total += int(np.count_nonzero(on_element & (index >= 0) & (index < input_size)))
    return total


@dataclass(frozen=True)
class DimLabels:
    """`0bf1_i1o0->0b1f`: where batch, features and each spatial dimension sit in lhs, rhs and output."""

    lhs: str
    rhs: str
    out: str

    @staticmethod
    def parse(text: str) -> DimLabels:
        operands, _, out = text.partition("->")
        lhs, _, rhs = operands.partition("_")
        return DimLabels(lhs, rhs, out)

    def spatial(self, labels: str, index: int) -> int:
        """The position of spatial dimension `index` (its digit) in `labels`."""
        return labels.index(str(index))


def convolution_flops(
    lhs_shape: Sequence[int],
    rhs_shape: Sequence[int],
    result_shape: Sequence[int],
    window: Sequence[WindowDim],
    dim_labels: str,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
) -> int:
    """2 × (input features / groups) × output features × (batch / batch groups) × Π valid positions."""
    labels = DimLabels.parse(dim_labels)
    batch = lhs_shape[labels.lhs.index("b")]
    input_features = lhs_shape[labels.lhs.index("f")]
    output_features = rhs_shape[labels.rhs.index("o")]
    positions = 1
    for index, dim in enumerate(window):
        positions *= valid_positions(
            lhs_shape[labels.spatial(labels.lhs, index)],
            rhs_shape[labels.spatial(labels.rhs, index)],
            result_shape[labels.spatial(labels.out, index)],
            dim,
        )
    multiply_adds = (input_features // feature_group_count) * output_features * (batch // batch_group_count) * positions
    return 2 * multiply_adds
