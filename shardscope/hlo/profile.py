"""The compiled step as the cost model prices it: every operation that runs on its own (a fusion, a dot, a
copy, a host transfer), with its matrix-unit FLOPs and HBM bytes, grouped so that a per-op roofline can be
summed on any hardware without the HLO.

An op's time on a chip is max(FLOPs / matrix rate, bytes / HBM rate): which side wins depends on the op's
arithmetic intensity (FLOPs per byte) and on the chip. Ops are therefore grouped by intensity in
quarter-octave bins (within a bin every op is on the same side of any chip's ridge but the one the ridge
falls in, so the sum of per-op maxima is kept to a few percent), and by where they run (pass and executions
per step, which is how the overlap model pairs them with the collectives of the same loop body).

Kinds:
- `matmul`: an op with matrix-unit work (a dot, a convolution, or a fusion containing one).
- `memory`: an op with none (elementwise fusions, copies, slices, reductions): bytes only. Vector-unit
  FLOPs are not counted: on TPU such ops are bound by HBM traffic.
- `gather`: a `memory` op that moves rows by index (a gather or a scatter, alone or fused: a dropless MoE's
  token permutation, an embedding lookup). Kept apart because a compiler's fusion barely changes its bytes
  (the rows it reads and writes), where it changes an elementwise op's many times over: a CPU compile's
  are priced as a TPU's with a factor of their own (`shardscope.cost.step`).
- `grouped`: an op whose matrix work is the experts' of a dropless MoE run as a grouped-matmul kernel (its
  dot in the program's grouped-matmul marker, `shardscope.hlo.markers.GROUPED_MATMUL`, or a TPU program's
  own kernel, MaxText's megablox `gmm`/`tgmm`, tokamax's `gmm_megablox`/`tgmm_megablox` or the TPU
  compiler's `ragged-dot-none`, its FLOPs counted from its shapes: `grouped_kernel_flops`): FLOPs and bytes
  as a matmul's, priced at the kernel's efficiency.
- `kernel`: an op in the program's attention-kernel marker (`shardscope.hlo.markers.ATTENTION`: a stand-in
  for a TPU kernel that a CPU compile cannot contain), or one the compiler added next to such ops without
  a name (`_kernel_ops`): its FLOPs are the kernel's; its bytes are not, since the kernel keeps
  each block's scores on chip where the stand-in writes them to HBM. A TPU program's own attention kernel
  (MaxText's splash kernels: a Pallas `tpu_custom_call` named `splash_…_fwd`, `_dq`, `_dkv`) is one too,
  its FLOPs counted from its shapes (`attention_kernel_flops`).
- `buffer`: bytes a CPU program's TPU compile moves as they are counted, priced as memory without a CPU
  compile's factor: the buffer a fusion's scatter into zeros needs on a TPU, beyond the fusion's own bytes
  (`materialised_scatter_bytes`: a pipeline's visit gradient, which the CPU compiler fuses away), and the
  adds of a sum the program asks for at every iteration of a loop that accumulates it
  (`shardscope.hlo.accumulation`), which the TPU runs on their own as the CPU does.
- `host`: a transfer between HBM and host memory (memory space S(5), a remat policy's offload): bytes over
  the host link, which overlaps compute as collectives do.
A scatter that XLA's CPU compiler expanded into a loop over its updates counts as the one scatter a TPU
runs (`_scatter_loops`).
Collectives are not here: the plan's collective rows price them.
No rule reads a module, parameter or scope name of the program: only its ops, shapes, dtypes, loops,
custom-call targets and the kernel markers it declares (`shardscope.hlo.markers`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from shardscope.hlo.accumulation import Accumulations, loop_accumulations
from shardscope.hlo.attention_kernels import attention_kernel_flops
from shardscope.hlo.executions import Program
from shardscope.hlo.fusion import conversions_into_matmuls, fused_opcodes, producers_into_matmuls
from shardscope.hlo.grouped_kernels import grouped_kernel_flops
from shardscope.hlo.kinds import KINDS, WorkKind
from shardscope.hlo.loops import expanded_scatters, loop_regions
from shardscope.hlo.markers import ATTENTION, GROUPED_MATMUL, HALF_VISITED, marked
from shardscope.hlo.matmuls import matrix_flops, matrix_precision
from shardscope.hlo.metadata import op_name_in, pass_of
from shardscope.hlo.narrowing import Narrowing
from shardscope.hlo.records import ASYNC_ENDS, COLLECTIVE_LIKE, Instruction, Module
from shardscope.hlo.shapes import async_start_output, shape_info
from shardscope.hlo.work import (
    NO_ACCESS,
    fused_computations,
    fusion_bytes,
    halved_shape,
    instruction_bytes,
    materialised_scatter_bytes,
    wrapped_opcode,
)

__all__ = [
    "KINDS",
    "WorkBin",
    "WorkKind",
    "work_profile",
]

BINS_PER_OCTAVE = 4
HOST_MEMORY = "S(5)"  # XLA's memory space of host memory in a TPU layout

_MATRIX_OPS = frozenset({"dot", "convolution"})
_ROW_OPS = frozenset({"gather", "scatter"})


@dataclass(frozen=True)
class WorkBin:
    """Ops of one kind, pass, loop depth and arithmetic intensity: their summed work per step."""

    kind: WorkKind
    pass_: str  # forward / backward / optimizer / other, as collective rows
    executions: int  # runs per step of each op here (1 outside loops, the trips inside one)
    intensity: int | None  # floor(BINS_PER_OCTAVE × log2(FLOPs / byte)); None: no FLOPs or no bytes
    ops: int  # op executions per step
    flops: int  # matrix-unit FLOPs per step
    bytes: int  # HBM (or host link) bytes per step
    # Runs per step of the outermost loop body the ops are in (1 outside loops): a loop nested in a layer
    # loop (a windowed matmul's) is part of the layer's step, which is what overlaps with its collectives.
    region: int = 0  # 0: not recorded (read as `executions`)
    # The element type class the matrix units multiply (`MATRIX_PRECISIONS`): "" for bfloat16 and wider,
    # "fp8" or "int8" where both inputs of the ops' matmuls are 8-bit (a quantized step's); a chip's peak
    # differs by it.
    precision: str = ""

    @property
    def key(self) -> tuple[WorkKind, str, int, int, int, str]:
        """Sort key: kind, pass, executions, region, intensity (None first), precision."""
        intensity = -(10**6) if self.intensity is None else self.intensity
        return (self.kind, self.pass_, self.executions, self.region, intensity, self.precision)


def _intensity(flops: int, nbytes: int) -> int | None:
    if flops <= 0 or nbytes <= 0:
        return None
    return math.floor(BINS_PER_OCTAVE * math.log2(flops / nbytes))


def _op_name(instruction: Instruction) -> str:
    return op_name_in(instruction.attribute("metadata"))


def _host_bytes(instruction: Instruction, operand_shapes: Sequence[str], wrapped: str | None = None) -> int | None:
    """Bytes an op moves between host memory and HBM, or None when it touches no host buffer (`wrapped`: the
    op a generic `async-start` runs)."""
    if HOST_MEMORY not in instruction.shape and not any(HOST_MEMORY in s for s in operand_shapes):
        return None
    opcode = wrapped or instruction.opcode.removesuffix("-start")
    if opcode == "dynamic-update-slice" and len(operand_shapes) >= 2:
        return shape_info(operand_shapes[1])[2]  # the update crosses, the host buffer stays
    if opcode in ("dynamic-slice", "slice"):
        result = instruction.shape
        if result.startswith("("):  # an async start's ((operands), result, context): the result
            result = async_start_output(result, opcode)
        return None if result.startswith("(") else shape_info(result)[2]
    if opcode == "copy":
        return shape_info(operand_shapes[0])[2] if operand_shapes else None
    return None


class _Graph(NamedTuple):
    """A computation's ops: each one's own op_name, its users and its operands (within the computation)."""

    own: dict[str, str]
    users: dict[str, list[str]]
    operands: dict[str, list[str]]


def operand_shapes_of(shapes: Mapping[str, str], instruction: Instruction) -> list[str]:
    return [shapes.get(operand, "") for operand in instruction.operands]


def _graph(instructions: Sequence[Instruction]) -> _Graph:
    own = {i.name: _op_name(i) for i in instructions}
    users: dict[str, list[str]] = defaultdict(list)
    operands: dict[str, list[str]] = {i.name: [o for o in i.operands if o in own] for i in instructions}
    for i in instructions:
        for operand in operands[i.name]:
            users[operand].append(i.name)
    return _Graph(own, users, operands)


def _nearest_named(start: str, own: Mapping[str, str], edges: Mapping[str, list[str]]) -> list[str]:
    """The op_names of the nearest ops with one, following `edges` (users or operands) through ops without."""
    seen, frontier = {start}, [start]
    while frontier:
        frontier = [n for op in frontier for n in edges.get(op, ()) if n not in seen]
        seen.update(frontier)
        named = [own[n] for n in frontier if own[n]]
        if named:
            return named
        frontier = [n for n in frontier if not own[n]]
    return []


def _op_names(graph: _Graph) -> dict[str, str]:
    """Each op's op_name. An op without one takes its nearest named user's: XLA's CPU compiler writes some
    dots out anew (between relayouts, or wrapped in a library fusion) without the metadata of the dot they
    replace, and the op that reads the result carries the pass and the scopes the dot had."""
    return {
        name: op_name or next(iter(_nearest_named(name, graph.own, graph.users)), "")
        for name, op_name in graph.own.items()
    }


def _half_visited(program: Program, instruction: Instruction, op_name: str, graph: _Graph) -> bool:
    """Whether an op is the attention stand-in's against the other sequence shards' keys: in the
    half-visited marker (`HALF_VISITED`: each shard sees the keys before it wholly and the rest not at all,
    which a stand-in writes as a masked matmul against all of them) by its op_name (its own or, see
    `_op_names`, its nearest named reader's), that of a dot it fuses, or, for an op without a name of its
    own, that of the nearest named op it reads (a matmul of the marked probabilities whose result leaves
    the marker). The load-balanced kernel visits half of those
    blocks on average over the shards, so its FLOPs count half."""
    names = [op_name]
    if not graph.own[instruction.name]:
        names += _nearest_named(instruction.name, graph.own, graph.operands)
    names += [
        _op_name(inner)
        for attribute, callee in instruction.callees()
        if attribute == "calls"
        for inner in program.instructions(callee)
        if inner.opcode in _MATRIX_OPS
    ]
    return any(marked(name, HALF_VISITED) for name in names)


def _grouped(program: Program, instruction: Instruction) -> bool:
    """Whether the op's matrix work is the grouped experts': its own op_name, or a dot it fuses, in the
    grouped-matmul marker."""
    if marked(_op_name(instruction), GROUPED_MATMUL):
        return True
    if instruction.opcode != "fusion":
        return False
    for attribute, callee in instruction.callees():
        if attribute == "calls":
            for inner in program.instructions(callee):
                if (inner.opcode in _MATRIX_OPS or inner.opcode == "fusion") and _grouped(program, inner):
                    return True
    return False


def _moves_rows(program: Program, instruction: Instruction) -> bool:
    """Whether an op gathers or scatters rows by index: it is a gather or scatter, or a fusion running one."""
    return bool(fused_opcodes(program, instruction) & _ROW_OPS)


def _kernel_ops(
    program: Program, instructions: Sequence[Instruction], graph: _Graph, names: Mapping[str, str]
) -> set[str]:
    """The ops of a computation that belong to the attention kernel: those in its marker, and the ops the
    compiler added around them without a name of their own (the CPU compiler's layout copies and
    conversions of the scores carry no metadata), found through their operands and users. An unnamed
    matmul is the kernel's only when it is batched (over heads, as attention's are) or it lies within the
    kernel (`_within_kernel`). The CPU compiler's library fusions of a vmapped layer's projections, plain
    matrix products, carry no metadata either and sit next to the kernel's copies: the query projection's
    reader is the kernel's, but what it multiplies is the layer's normalised input."""
    kernel = {i.name for i in instructions if marked(_op_name(i), ATTENTION)}
    if not kernel:
        return kernel
    unnamed = {
        i.name
        for i in instructions
        if not _op_name(i)
        and i.opcode not in NO_ACCESS
        and (not _unbatched_matmul(program, i) or _within_kernel(i.name, graph, names))
    }
    neighbours: dict[str, set[str]] = defaultdict(set)
    for i in instructions:
        for operand in i.operands:
            neighbours[i.name].add(operand)
            neighbours[operand].add(i.name)
    pending = list(kernel)
    while pending:
        for other in neighbours[pending.pop()]:
            if other in unnamed and other not in kernel:
                kernel.add(other)
                pending.append(other)
    # A constant broadcast to a block of scores only kernel ops read (the TPU compiler names it after the
    # rematerialised call it sank out of, not the kernel) is the kernel's too: a flash kernel has no such buffer.
    users: dict[str, list[str]] = defaultdict(list)
    for i in instructions:
        for operand in i.operands:
            users[operand].append(i.name)
    for i in instructions:
        if i.opcode == "broadcast" and users[i.name] and all(u in kernel for u in users[i.name]):
            kernel.add(i.name)
    return kernel


def _within_kernel(name: str, graph: _Graph, names: Mapping[str, str]) -> bool:
    """Whether an unnamed op is the attention kernel's by its neighbours: the op that reads it is the
    kernel's (`names`: each op's name, see `_op_names`), and the nearest named ops it reads, if any, are
    not all outside the kernel (a projection reads the layer's own ops)."""
    read = _nearest_named(name, graph.own, graph.operands)
    return marked(names[name], ATTENTION) and (not read or any(marked(op_name, ATTENTION) for op_name in read))


def _unbatched_matmul(program: Program, instruction: Instruction) -> bool:
    """Whether an op is, or fuses, a dot without batch dimensions."""
    if instruction.opcode == "dot":
        return instruction.attribute("lhs_batch_dims") is None
    return any(
        _unbatched_matmul(program, inner)
        for attribute, callee in instruction.callees()
        if attribute == "calls"
        for inner in program.instructions(callee)
        if inner.opcode in ("dot", "fusion")
    )


def _classify(
    program: Program,
    instruction: Instruction,
    operand_shapes: Sequence[str],
    in_kernel: bool = False,
    halves: tuple[frozenset[int], bool] = (frozenset(), False),
) -> tuple[WorkKind, int, int] | None:
    """(kind, matrix FLOPs, bytes) of one execution of a top-level op, or None for ops that cost nothing
    here (names, boundaries, collectives, the second half of an async pair). `halves`: the positions of
    its float32 operands, and whether its float32 result, have bfloat16 precision (a CPU program's: counted
    at two bytes an element, as the TPU holds them)."""
    opcode = instruction.opcode
    if opcode in NO_ACCESS or opcode.endswith(ASYNC_ENDS) or opcode == "tuple":
        return None
    wrapped = wrapped_opcode(program, instruction)
    host = _host_bytes(instruction, operand_shapes, wrapped)
    if host is not None:
        return WorkKind.HOST, 0, host
    if COLLECTIVE_LIKE.match(opcode) is not None:
        return None
    kernel_flops = attention_kernel_flops(instruction, operand_shapes)
    if kernel_flops is not None:
        return WorkKind.KERNEL, kernel_flops, 0
    grouped_flops = grouped_kernel_flops(instruction, operand_shapes)
    if grouped_flops is not None:  # its bytes are its operands' and result's, as any op's
        return WorkKind.GROUPED, grouped_flops, instruction_bytes(instruction, operand_shapes, wrapped)
    flops = matrix_flops(program, instruction, operand_shapes)
    if in_kernel:
        return WorkKind.KERNEL, flops, 0
    halved, half_result = halves
    if opcode == "fusion":
        nbytes = fusion_bytes(program, instruction, operand_shapes, halved, half_result)
    else:
        if half_result:
            instruction = dataclasses.replace(instruction, shape=halved_shape(instruction.shape))
        narrowed = [halved_shape(s) if i in halved else s for i, s in enumerate(operand_shapes)]
        nbytes = instruction_bytes(instruction, narrowed, wrapped)
    if not flops:
        return (WorkKind.GATHER if _moves_rows(program, instruction) else WorkKind.MEMORY), 0, nbytes
    return (WorkKind.GROUPED if _grouped(program, instruction) else WorkKind.MATMUL), flops, nbytes


def _halves(narrowing: Narrowing | None, computation: str, instruction: Instruction) -> tuple[frozenset[int], bool]:
    """Which of an op's float32 operands, and whether its result, a TPU holds in bfloat16 (none without
    `narrowing`: a TPU program's values are in the types they have)."""
    if narrowing is None or instruction.opcode in NO_ACCESS:
        return frozenset(), False
    return narrowing.half_operands(computation, instruction), narrowing.half_result(computation, instruction)


def work_profile(
    module: Module, cpu_program: bool = False, explicit_reductions: bool = False, program: Program | None = None
) -> tuple[WorkBin, ...]:
    """Every top-level op of the step that runs a known number of times, binned (see the module doc).
    Ops of computations whose executions are unknown are left out, as in `step_work`.

    `cpu_program`: the module is a CPU compile's, counted as the TPU would run it: its float32 values of
    bfloat16 precision at two bytes an element (`shardscope.hlo.narrowing`), and the conversions,
    relayouts and elementwise ops it writes out around its matmuls, which a TPU's matmuls do inside
    themselves, moving nothing (`shardscope.hlo.fusion`); and the adds of a loop-accumulated reduction
    (`shardscope.hlo.accumulation`) as the TPU runs them: inside the matmuls that make the partial sums (a
    sum added into a slot, moved out of the loop), or, for `explicit_reductions` (a program of Explicit axes,
    which keeps every one in its loop), at the bytes counted: a `buffer`."""
    program = program or Program(module)  # the caller's, where it read the module's tables already
    runs = program.executions_per_step()
    fused = fused_computations(program, runs)
    scatters, expanded = expanded_scatters(program, runs)
    narrowing = Narrowing(module, program.instructions) if cpu_program else None
    regions = loop_regions(program, runs)
    accumulations = loop_accumulations(program) if cpu_program else Accumulations()
    # Explicit axes: every accumulated sum is taken in the loop, its adds on their own; Auto: a sum added into
    # a slot is moved out of the loop, its adds done inside the matmuls (`shardscope.hlo.accumulation`).
    accumulating = accumulations.adds if explicit_reductions else accumulations.slot_adds
    sums: dict[tuple[WorkKind, str, int, int, int | None, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for name, count in runs.items():
        if not count or name in fused or name in expanded:
            continue
        shapes = program.shapes(name)
        instructions = program.instructions(name)
        graph = _graph(instructions)
        names = _op_names(graph)
        kernel = _kernel_ops(program, instructions, graph, names)
        classified: dict[str, tuple[WorkKind, int, int]] = {}
        for instruction in instructions:
            operand_shapes = [shapes.get(operand, "") for operand in instruction.operands]
            scatter = scatters.get(f"{name}/{instruction.name}")
            if scatter is not None:
                found: tuple[WorkKind, int, int] | None = (WorkKind.GATHER, 0, scatter)
            else:
                halves = _halves(narrowing, name, instruction)
                found = _classify(program, instruction, operand_shapes, instruction.name in kernel, halves)
            if found is not None:
                classified[instruction.name] = found
        kinds = {op: kind for op, (kind, _, _) in classified.items()}
        in_matmuls = conversions_into_matmuls(program, instructions, kinds) if cpu_program else set()
        producers = producers_into_matmuls(program, instructions, kinds, in_matmuls) if cpu_program else set()
        for instruction in instructions:
            if instruction.name not in classified:
                continue
            kind, flops, nbytes = classified[instruction.name]
            nbytes = 0 if instruction.name in in_matmuls or instruction.name in producers else nbytes
            if f"{name}/{instruction.name}" in accumulating:
                kind, nbytes = (WorkKind.BUFFER, nbytes) if explicit_reductions else (kind, 0)
            op_name = names[instruction.name]
            if kind == WorkKind.KERNEL and flops and _half_visited(program, instruction, op_name, graph):
                flops //= 2
            pass_ = pass_of(op_name) if op_name else "other"
            region = regions.get(name, count)
            matrix = kind in (WorkKind.MATMUL, WorkKind.GROUPED) and flops
            precision = matrix_precision(program, instruction, operand_shapes_of(shapes, instruction)) if matrix else ""
            entries = [(kind, flops, nbytes)]
            scattering = instruction.opcode == "fusion" and kind != WorkKind.KERNEL
            buffer = materialised_scatter_bytes(program, instruction) if scattering else 0
            entries += [(WorkKind.BUFFER, 0, buffer)] if buffer else []
            for entry_kind, entry_flops, entry_bytes in entries:
                entry_precision = precision if entry_kind == kind else ""
                intensity = _intensity(entry_flops, entry_bytes)
                total = sums[(entry_kind, pass_, count, region, intensity, entry_precision)]
                total[0] += count
                total[1] += count * entry_flops
                total[2] += count * entry_bytes
    bins = (
        WorkBin(kind, pass_, executions, intensity, ops, flops, nbytes, region, precision)
        for (kind, pass_, executions, region, intensity, precision), (ops, flops, nbytes) in sums.items()
    )
    return tuple(sorted(bins, key=lambda b: b.key))
