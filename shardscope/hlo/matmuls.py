"""The matmuls an op runs (a dot or convolution, a GPU program's cuBLAS call, or those inside a fusion): their
FLOPs, and the precision class their inputs put the matrix units at (`WorkBin.precision`): a chip's peak
differs between bfloat16 (and wider) inputs and 8-bit ones (a quantized step's float8 or int8)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from shardscope.hlo.executions import Program
from shardscope.hlo.gemms import is_library_gemm
from shardscope.hlo.records import Instruction
from shardscope.hlo.shapes import shape_info
from shardscope.hlo.work import instruction_flops

MATRIX_PRECISIONS = ("", "fp8", "int8")  # "": bfloat16 and wider
_MATRIX_OPS = frozenset({"dot", "convolution"})


def matrix_precision(program: Program, instruction: Instruction, operand_shapes: Sequence[str]) -> str:
    """The precision class its matrix units run an op's matmul at (see `WorkBin.precision`): that of a dot's
    or convolution's two inputs, of the largest matmul a fusion runs inside, or of a kernel call's two
    largest inputs (its integer group sizes and its scales aside)."""
    if instruction.opcode in _MATRIX_OPS or is_library_gemm(instruction):  # a cuBLAS call's scales follow
        return _precision_of(operand_shapes[:2])
    if instruction.opcode == "custom-call":
        return _precision_of(_matrices(operand_shapes))
    largest: tuple[int, str] = (0, "")
    for inner, inner_shapes in _called_matmuls(program, instruction):
        flops = matrix_flops(program, inner, inner_shapes)
        largest = max(largest, (flops, matrix_precision(program, inner, inner_shapes)))
    return largest[1]


def _matrices(operand_shapes: Sequence[str]) -> list[str]:
    """A kernel call's two largest operands other than its int32 ones (group sizes, offsets): the matrices it
    multiplies. A quantized kernel's scales (a bfloat16 [16, 128] beside a float8 [4096, 2048]) are small."""
    candidates = [s for s in operand_shapes if not shape_info(s)[0].startswith("int32")]
    return sorted(candidates, key=lambda s: -shape_info(s)[2])[:2]


def _precision_of(shapes: Sequence[str]) -> str:
    dtypes = [shape_info(s)[0] for s in shapes]
    if dtypes and all(d.startswith("float8") for d in dtypes):
        return "fp8"
    if dtypes and all(d in ("int8", "uint8") for d in dtypes):
        return "int8"
    return ""


def matrix_flops(program: Program, instruction: Instruction, operand_shapes: Sequence[str]) -> int:
    """Matrix-unit FLOPs of one execution: a dot or convolution (or a GPU program's cuBLAS call standing for
    one), or those a fusion runs inside."""
    if instruction.opcode in _MATRIX_OPS or is_library_gemm(instruction):
        return instruction_flops(instruction, operand_shapes)
    return sum(matrix_flops(program, inner, shapes) for inner, shapes in _called_matmuls(program, instruction))


def _called_matmuls(program: Program, instruction: Instruction) -> Iterator[tuple[Instruction, list[str]]]:
    """The dots, convolutions and nested fusions a fusion (or an async wrapper) calls, with their operands'
    shapes; nothing for any other op."""
    if instruction.opcode not in ("fusion", "async-start"):
        return
    for attribute, callee in instruction.callees():
        if attribute != "calls":
            continue
        shapes = program.shapes(callee)
        for inner in program.instructions(callee):
            if inner.opcode in _MATRIX_OPS or inner.opcode == "fusion":
                yield inner, [shapes.get(o, "") for o in inner.operands]
