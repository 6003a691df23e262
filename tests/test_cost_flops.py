"""FLOPs of dots and convolutions from their shapes and attributes agree with XLA's own cost analysis of
programs made of that one instruction (and with the textbook count where one is simple to write)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from shardscope.hlo.flops import WindowDim, convolution_flops, dot_flops, parse_window


def xla_flops(fn, *args) -> float:
    return jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]


def only_instruction(fn, *args, opcode: str) -> str:
    text = jax.jit(fn).lower(*args).compile().as_text()
    (line,) = [line for line in text.splitlines() if f" {opcode}(" in line]
    return line


def shape_of(text: str) -> tuple[int, ...]:
    dims = re.search(r"\[([\d,]*)\]", text).group(1)
    return tuple(int(d) for d in dims.split(",") if d)


def test_a_matmul_is_two_flops_per_multiply_add():
    a, b = jnp.ones((64, 128)), jnp.ones((128, 32))
    assert dot_flops((64, 32), (64, 128), (1,)) == 2 * 64 * 32 * 128 == xla_flops(jnp.matmul, a, b)


def test_a_batched_contraction_counts_batch_and_every_contracted_dimension():
    a, b = jnp.ones((4, 8, 16, 32)), jnp.ones((4, 16, 32, 24))
    expected = 2 * 4 * 8 * 24 * 16 * 32
    assert dot_flops((4, 8, 24), (4, 8, 16, 32), (2, 3)) == expected
    assert xla_flops(lambda x, y: jnp.einsum("bmkc,bkcn->bmn", x, y), a, b) == expected


def tpu_compiled(fn, *shapes):
    """`fn` compiled ahead of time for one v5p device: XLA's TPU cost analysis and the TPU HLO."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardscope.case.tpu import libtpu_version, parse_tpu_slice
    from shardscope.stages.devices import quiet_libtpu, tpu_devices

    if libtpu_version() is None:
        pytest.skip("needs the TPU extra (libtpu)")
    quiet_libtpu()
    mesh = Mesh(np.array(tpu_devices(parse_tpu_slice("v5p-8")).devices[:1]), ("x",))
    args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P())) for shape in shapes]
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled.cost_analysis()["flops"], compiled.as_text()


def convolution_of(text: str) -> int:
    """Our count for the one convolution of a module, its operand shapes read from the instructions before it."""
    shapes = {m.group(1): shape_of(m.group(2)) for m in re.finditer(r"(%[\w.\-]+) = (\w+\[[\d,]*\])", text)}
    (line,) = [line for line in text.splitlines() if " convolution(" in line]
    lhs, rhs = re.search(r"convolution\((%[\w.\-]+), (%[\w.\-]+)\)", line).groups()
    window = parse_window(re.search(r"window=\{([^}]*)\}", line).group(1))
    labels = re.search(r"dim_labels=([^,\s]+)", line).group(1)
    groups = re.search(r"feature_group_count=(\d+)", line)
    return convolution_flops(
        shapes[lhs], shapes[rhs], shape_of(line.split("=", 1)[1]), window, labels, int(groups.group(1)) if groups else 1
    )


@pytest.mark.parametrize(
    "stride,padding,lhs_dilation,rhs_dilation,groups",
    [
        ((1, 1), "VALID", (1, 1), (1, 1), 1),
        ((2, 1), ((1, 2), (0, 3)), (1, 1), (1, 1), 1),
        ((1, 1), ((2, 2), (1, 1)), (2, 1), (1, 2), 1),
        ((1, 1), "SAME", (1, 1), (1, 1), 4),
    ],
)
def test_a_convolution_counts_only_kernel_positions_on_real_inputs(stride, padding, lhs_dilation, rhs_dilation, groups):
    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, stride, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation, feature_group_count=groups
        )

    flops, text = tpu_compiled(conv, (2, 8, 9, 11), (12, 8 // groups, 3, 4))
    assert convolution_of(text) == flops


def test_a_batched_matmul_the_tpu_compiler_writes_as_a_dilated_convolution():
    flops, text = tpu_compiled(lambda a, b: jnp.einsum("bqhd,bkhd->bhqk", a, b), (2, 16, 4, 24), (2, 16, 4, 24))
    assert "lhs_dilate" in text  # the rewrite this test is about
    assert convolution_of(text) == flops == 2 * 2 * 4 * 16 * 16 * 24


def test_a_window_without_padding_or_dilation_is_the_textbook_count():
    # 1-D: input 10, kernel 3, stride 1, no padding → 8 outputs, each reading 3 inputs.
    flops = convolution_flops((1, 1, 10), (1, 1, 3), (1, 1, 8), (WindowDim(3),), "bf0_oi0->bf0")
    assert flops == 2 * 8 * 3


def test_window_text_of_the_tpu_compiler():
    (dim0, dim1) = parse_window("size=2x4 stride=1x3 lhs_dilate=2x4")
    assert dim0 == WindowDim(2, 1, 0, 0, 2, 1) and dim1 == WindowDim(4, 3, 0, 0, 4, 1)
    (only,) = parse_window("size=1x4 pad=0_0x3_3 rhs_reversal=0x1")[1:]
    assert (only.padding_low, only.padding_high) == (3, 3)
