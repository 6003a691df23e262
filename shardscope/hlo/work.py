"""Per-device work of a compiled step, counted from its HLO: FLOPs and bytes of HBM accessed per step.

XLA's own figure (`compiled.cost_analysis()`) counts each instruction once, so a model whose layers are a
scanned loop reports one layer's work whatever the number of layers. Here every instruction is counted as
XLA's `HloCostAnalysis` counts one execution of it, times how many times its computation runs per step
(`shardscope.hlo.executions`: loop trips, calls, fusions):

- FLOPs: a dot or convolution as `shardscope.cost.flops` counts it (two per multiply-add), and so a GPU
  program's cuBLAS call the dot it stands for (`shardscope.hlo.gemms`); an elementwise
  arithmetic op one per element of its result; a reduce one per element folded away. Transcendental ops
  (exp, log, tanh, …) are not FLOPs, as in XLA. Ops inside fused computations count: a fusion runs them.
- Bytes accessed: what each instruction of a computation that runs on its own (not a fused one) reads and
  writes: its operands and its result. A fusion reads its operands and writes its result once, whatever it
  does inside, which is why fusion exists. Ops that move no data (parameters, bitcasts, loop and call
  boundaries, the `-done` halves of async pairs) access nothing; a tuple writes its pointers; a slice
  reads only the slice and an in-place dynamic update writes only the update. An asynchronous start of
  a copy, slice or update (`copy-start`, `slice-start`, …) accesses what the op it starts would.
- Only HBM counts: an array whose layout puts it in another memory space (a TPU program's prefetches
  into vector memory, `S(1)`, its host offloads, `S(5)`) is not HBM traffic.

A computation whose executions are unknown (a loop whose trip count cannot be derived) is left out and
counted in `unknown_computations`, so a caller can tell a complete figure from a floor.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from shardscope.hlo.executions import Program
from shardscope.hlo.flops import convolution_flops, dot_flops, parse_window
from shardscope.hlo.gemms import library_gemm_flops
from shardscope.hlo.metadata import split_outside_brackets
from shardscope.hlo.records import ASYNC_ENDS, Instruction, Module, parameter_index, users_of
from shardscope.hlo.shapes import async_start_output, hbm_bytes, shape_info

__all__ = ["StepWork", "instruction_flops", "materialised_scatter_bytes", "step_work"]

# One FLOP per result element: XLA's HandleElementwiseOp, for every opcode it does not call transcendental.
ELEMENTWISE = frozenset(
    {"add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder", "negate", "abs", "sign"}
    | {"compare", "select", "clamp", "and", "or", "xor", "not", "floor", "ceil", "round-nearest-afz"}
    | {"round-nearest-even", "shift-left", "shift-right-arithmetic", "shift-right-logical", "is-finite"}
    | {"convert", "reduce-precision", "popcnt", "count-leading-zeros", "real", "imag", "complex"}
)
# Ops that move no bytes of their own: names, views and boundaries whose callees do the work.
NO_ACCESS = frozenset(
    {"parameter", "constant", "get-tuple-element", "bitcast", "while", "call", "conditional"}
    | {"after-all", "add-dependency", "partition-id", "replica-id", "opt-barrier", "domain"}
)

# A tuple holds pointers to its elements: building one writes only those.
POINTER_BYTES = 8


@dataclass(frozen=True)
class StepWork:
    """FLOPs and HBM bytes accessed by one device in one step."""

    flops: int
    bytes_accessed: int
    # Computations whose executions per step are unknown: left out, so the figures are a floor.
    unknown_computations: int = 0
    matmul_flops: int = 0  # the part of `flops` in dots and convolutions (the matrix units' share)

    def as_compute(self) -> tuple[tuple[str, int], ...]:
        """The plan's `compute` section: sorted (name, value) pairs."""
        return (("bytes_accessed", self.bytes_accessed), ("flops", self.flops))


def _dims(shape: str) -> tuple[int, ...]:
    return shape_info(shape)[1]


def _elements(shape: str) -> int:
    count = 1
    for d in _dims(shape):
        count *= d
    return count


def _int_list(text: str | None) -> list[int]:
    return [int(v) for v in (text or "").strip("{} ").split(",") if v.strip()]


def instruction_flops(instruction: Instruction, operand_shapes: Sequence[str], reducer_flops: int = 1) -> int:
    """FLOPs of one execution of an instruction, given its operands' shapes (0 for ops that do none).

    `reducer_flops` is what one application of a reduce's `to_apply` computation costs (1 for a sum).
    """
    opcode = instruction.opcode
    if opcode == "custom-call":  # a GPU program's cuBLAS matmul counts as the dot it stands for
        return library_gemm_flops(instruction, operand_shapes) or 0
    if opcode == "dot" and operand_shapes:
        contracting = _int_list(instruction.attribute("lhs_contracting_dims"))
        return dot_flops(_dims(instruction.shape), _dims(operand_shapes[0]), contracting)
    if opcode == "convolution" and len(operand_shapes) >= 2:
        return convolution_flops(
            _dims(operand_shapes[0]),
            _dims(operand_shapes[1]),
            _dims(instruction.shape),
            parse_window(instruction.attribute("window") or ""),
            instruction.attribute("dim_labels") or "",
            int(instruction.attribute("feature_group_count") or 1),
            int(instruction.attribute("batch_group_count") or 1),
        )
    if opcode in ELEMENTWISE:
        return _elements(instruction.shape)
    if opcode == "reduce" and operand_shapes:
        # The reducer is applied once per element folded away (a variadic reduce's results share dims).
        return max(_elements(operand_shapes[0]) - _elements(instruction.shape), 0) * reducer_flops
    return 0


def instruction_bytes(instruction: Instruction, operand_shapes: Sequence[str], wrapped: str | None = None) -> int:
    """Bytes one execution of an instruction reads and writes in HBM (0 for ops that move none). `wrapped`:
    the op a generic `async-start` runs (its computation's root: `wrapped_opcode`), which it accesses as."""
    opcode = instruction.opcode
    if opcode in NO_ACCESS or opcode.endswith(ASYNC_ENDS):
        return 0
    if opcode == "tuple":
        return POINTER_BYTES * len(split_outside_brackets(instruction.shape.strip()[1:-1], ","))
    opcode, result_shape = started_op(instruction)
    if opcode == "async" and wrapped:
        opcode = wrapped
    result = hbm_bytes(result_shape)
    if opcode in ("dynamic-slice", "slice"):
        # Reads the slice (where the source is in HBM) and writes it (where the result is).
        source_in_hbm = bool(operand_shapes) and hbm_bytes(operand_shapes[0]) > 0
        return (shape_info(result_shape)[2] if source_in_hbm else 0) + result
    if opcode == "dynamic-update-slice" and len(operand_shapes) >= 2:
        # In place: reads the update and writes it (where the buffer is: not HBM when offloaded to host).
        update = hbm_bytes(operand_shapes[1])
        return update + (shape_info(operand_shapes[1])[2] if hbm_bytes(operand_shapes[0]) else 0)
    return result + sum(hbm_bytes(s) for s in operand_shapes)


def wrapped_opcode(program: Program, instruction: Instruction) -> str | None:
    """The op a generic `async-start` wraps (the root of the computation it calls: a TPU program's
    prefetching `slice`, an offload's `dynamic-update-slice`), or None for any other instruction."""
    if instruction.opcode != "async-start":
        return None
    for attribute, callee in instruction.callees():
        if attribute == "calls":
            root = next((i for i in program.instructions(callee) if i.is_root), None)
            return None if root is None else root.opcode
    return None


def started_op(instruction: Instruction) -> tuple[str, str]:
    """(opcode, result shape) of the op an instruction runs: an async start's shape is a tuple holding the
    result (`copy-start`: (destination, source, context); a wrapped op: ((operands), result, context))."""
    opcode = instruction.opcode
    if not opcode.endswith("-start") or not instruction.shape.lstrip().startswith("("):
        return opcode, instruction.shape
    base = opcode.removesuffix("-start")
    if base == "copy":
        return base, split_outside_brackets(instruction.shape.strip()[1:-1], ",")[0]
    return base, async_start_output(instruction.shape, base)


def fused_computations(program: Program, runs: Mapping[str, int | None]) -> set[str]:
    """Computations that run inside a fusion or a generic async wrapper (their bytes are the fusion's, the
    wrapper's: `wrapped_opcode`)."""
    fused: set[str] = set()
    for name in runs:
        for instruction in program.instructions(name):
            if instruction.opcode in ("fusion", "async-start"):
                fused.update(callee for attribute, callee in instruction.callees() if attribute == "calls")
    return fused


def _parameter_read_bytes(program: Program, users: Mapping[str, Sequence[Instruction]], parameter: Instruction) -> int:
    """Bytes a fusion reads of one operand, from how its fused code uses the parameter (XLA's
    `FusionParameterReadBytes`): a slice reads its slice; a dynamic update never reads the buffer it updates;
    a broadcast or reshape reads the whole operand each; every other use shares one read of it.

    Views are seen through: a bitcast, and a nested fusion that works in place on it (a TPU fusion nests a
    layout-changing copy that way: `output_to_operand_aliasing`), are the same buffer, read as their users
    read them. A nested fusion otherwise reads its operand as its own fused code does (so a dynamic slice
    two fusions deep reads its slice, not the stack of every layer it is taken from). `users`: each value's
    users in the fused computation."""
    whole = hbm_bytes(parameter.shape)
    size = 0
    shared_read = False
    pending = [parameter.name]
    while pending:
        value = pending.pop()
        for user in users.get(value, []):
            first = user.operands[:1] == (value,)
            if user.opcode == "slice" or (user.opcode == "dynamic-slice" and first):
                size += min(whole, shape_info(user.shape)[2])
            elif _updates_in_place(user, value, users):
                continue
            elif user.opcode == "bitcast" or _works_in_place_on(user, value):
                pending.append(user.name)
            elif user.opcode == "fusion":
                size += _nested_read_bytes(program, user, value, whole)
            elif user.opcode in ("broadcast", "reshape"):
                size += whole
            elif not shared_read:
                shared_read = True
                size += whole
    return size


def _works_in_place_on(fusion: Instruction, operand: str) -> bool:
    """Whether a (nested) fusion's result is its operand's buffer, changed in place."""
    aliasing = fusion.attribute("output_to_operand_aliasing")
    if fusion.opcode != "fusion" or not aliasing:
        return False
    indices = {int(index) for index in re.findall(r"\(\s*(\d+)\s*,", aliasing)}
    return any(fusion.operands[index] == operand for index in indices if index < len(fusion.operands))


def _nested_read_bytes(program: Program, fusion: Instruction, operand: str, whole: int) -> int:
    """Bytes a nested fusion reads of one of its operands (each position it takes it at), at most `whole`."""
    called = [callee for attribute, callee in fusion.callees() if attribute == "calls"]
    if not called:
        return whole
    inner = program.instructions(called[0])
    parameters = {parameter_index(i): i for i in inner if i.opcode == "parameter"}
    users = users_of(inner)
    total = 0
    for index, name in enumerate(fusion.operands):
        if name == operand and index in parameters:
            total += _parameter_read_bytes(program, users, parameters[index])
    return min(whole, total)


def _updated_in_place(convert: Instruction, users: Mapping[str, Sequence[Instruction]]) -> bool:
    """Whether a conversion only widens a buffer that a dynamic update then changes (XLA's CPU compiler runs
    a bfloat16 update in float32: convert, update, convert back; the TPU updates the bfloat16 buffer in
    place, reading none of it)."""
    readers = users.get(convert.name, [])
    return bool(readers) and all(_updates_in_place(r, convert.name, users) for r in readers)


def _updates_in_place(user: Instruction, value: str, users: Mapping[str, Sequence[Instruction]]) -> bool:
    """Whether `user` changes `value` in place, reading none of it: a dynamic update of it, or a conversion
    of it that only a dynamic update reads (`_updated_in_place`)."""
    if user.opcode == "dynamic-update-slice":
        return user.operands[:1] == (value,)
    return user.opcode == "convert" and _updated_in_place(user, users)


def _written_bytes(result: Instruction, by_name: Mapping[str, Instruction]) -> int:
    """Bytes a fusion writes for one result: an in-place dynamic update writes only its update (also when
    the CPU compiler's float normalisation converts the updated buffer back: `_updated_in_place`)."""
    update = by_name.get(result.operands[0]) if result.opcode == "convert" and result.operands else None
    if update is not None and update.opcode == "dynamic-update-slice":
        element = shape_info(result.shape)[2] / max(shape_info(update.shape)[2], 1)
        return int(_written_bytes(update, by_name) * element)
    if result.opcode == "dynamic-update-slice" and len(result.operands) > 1 and result.operands[1] in by_name:
        return hbm_bytes(by_name[result.operands[1]].shape)
    return hbm_bytes(result.shape)


def fusion_bytes(
    program: Program,
    fusion: Instruction,
    operand_shapes: Sequence[str],
    halved: Collection[int] = (),
    half_result: bool = False,
) -> int:
    """Bytes a fusion reads and writes: each operand as far as the fused code reads it, and its results.
    `halved`: positions of float32 operands to count at two bytes an element, and `half_result` its
    float32 result (a CPU program's values of bfloat16 precision: `shardscope.hlo.narrowing`)."""
    inner = program.fused(fusion)
    if not inner:
        return instruction_bytes(fusion, operand_shapes)
    by_name = {i.name: i for i in inner}
    users = users_of(inner)
    read = 0
    for parameter in (i for i in inner if i.opcode == "parameter"):
        size = _parameter_read_bytes(program, users, parameter)
        read += size // 2 if parameter_index(parameter) in halved and _is_f32(parameter.shape) else size
    root = next((i for i in inner if i.is_root), inner[-1])
    if root.opcode == "tuple":
        return read + sum(_written_bytes(by_name[o], by_name) for o in root.operands if o in by_name)
    written = _written_bytes(root, by_name)
    return read + (written // 2 if half_result and _is_f32(root.shape) else written)


def materialised_scatter_bytes(program: Program, fusion: Instruction) -> int:
    """Bytes of the buffers a fusion's scatter into a broadcast (a dynamic-update-slice of it that is not
    the fusion's result) needs on a TPU, beyond the fusion's own reads and writes (`fusion_bytes`): the CPU
    compiler fuses a value scattered into zeros and then sliced (a pipeline's visit gradient, then this
    device's share of it) into one loop, where the TPU writes the zeros out, updates them in place and
    reads the share back from memory. A scatter into zeros that is only added to a buffer of its shape (the
    gradient of a pipeline's loop state) is none: the TPU adds the update into that buffer in place."""
    inner = program.fused(fusion)
    by_name = {i.name: i for i in inner}
    broadcasts = {i.name for i in inner if i.opcode == "broadcast"}
    scatters = [
        i
        for i in inner
        if i.opcode == "dynamic-update-slice" and not i.is_root and i.operands and i.operands[0] in broadcasts
    ]
    if not scatters:
        return 0
    users = users_of(inner)
    extra = 0
    for instruction in scatters:
        update = by_name.get(instruction.operands[1]) if len(instruction.operands) > 1 else None
        slices = [user for user in users.get(instruction.name, ()) if user.opcode == "dynamic-slice"]
        if not slices:
            continue
        extra += hbm_bytes(instruction.shape) + (hbm_bytes(update.shape) if update is not None else 0)
        extra += sum(hbm_bytes(user.shape) for user in slices)
    return extra


def halved_shape(shape: str) -> str:
    """A float32 array shape as the same array of bfloat16 (a CPU program's value of bfloat16 precision)."""
    return "bf16" + shape.strip()[3:] if _is_f32(shape) else shape


def _is_f32(shape: str) -> bool:
    return shape.strip().startswith("f32[")


def _reducer_flops(program: Program, reduce: Instruction) -> int:
    """FLOPs of one application of a reduce's `to_apply` computation (scalar ops: one each)."""
    applied = [callee for attribute, callee in reduce.callees() if attribute == "to_apply"]
    if not applied:
        return 1
    instructions = program.instructions(applied[0])
    shapes = {i.name: i.shape for i in instructions}
    return max(1, sum(instruction_flops(i, [shapes.get(o, "") for o in i.operands]) for i in instructions))


def step_work(module: Module, program: Program | None = None) -> StepWork:
    """FLOPs and bytes accessed per step by one device running `module` (see the module docstring).
    `program`: the module's `Program` where the caller has one (its tables and executions are read once)."""
    program = program or Program(module)
    runs = program.executions_per_step()
    fused = fused_computations(program, runs)
    flops = 0
    matmul = 0
    accessed = 0
    unknown = 0
    for name, count in runs.items():
        if count is None:
            unknown += 1
            continue
        if count == 0:
            continue
        shapes = program.shapes(name)
        one_flops = 0
        one_matmul = 0
        one_bytes = 0
        for instruction in program.instructions(name):
            operand_shapes = [shapes.get(operand, "") for operand in instruction.operands]
            reducer = _reducer_flops(program, instruction) if instruction.opcode == "reduce" else 1
            flops_here = instruction_flops(instruction, operand_shapes, reducer)
            one_flops += flops_here
            if instruction.opcode in ("dot", "convolution"):
                one_matmul += flops_here
            if name in fused:
                continue
            if instruction.opcode == "fusion":
                one_bytes += fusion_bytes(program, instruction, operand_shapes)
            else:
                one_bytes += instruction_bytes(instruction, operand_shapes, wrapped_opcode(program, instruction))
        flops += count * one_flops
        matmul += count * one_matmul
        accessed += count * one_bytes
    return StepWork(flops=flops, bytes_accessed=accessed, unknown_computations=unknown, matmul_flops=matmul)
