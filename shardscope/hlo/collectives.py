"""Every collective of a read module, counted per call site and loop trip, in the user's mesh axes.

Conventions of each row (`Collective`):
  bytes   per device per execution. The RESULT size for all-gather, all-reduce, all-to-all,
          collective-permute and collective-broadcast; the OPERAND size (before the scatter, = result x
          group size) for reduce-scatter. Tuple results (combined collectives) are summed; an async `-start`
          is counted once, with the shape its `-done` gives (or the output part of the start's tuple).
  shift   collective-permute along one axis only: the coordinate shift, normalised into (-n/2, n/2].
  pass_   "backward" if the op_name contains `transpose(` anywhere (autodiff transpose), else "forward" if
          it contains `jvp(`, else "optimizer" if it is inside some `jit(...)`, else "other" (no metadata).
  source  the Flax module path, e.g. "decoder/layers/moe": see `metadata.module_path`.
  loop_trips  product of the trip counts of the enclosing while loops (a loop condition counts trips + 1);
          None if one is unknown, or if the text ends before the computation's callers (a truncated file).
          Every branch of a conditional is counted, as if it always ran.
  tpu_bytes  (only when asked, for a CPU program) `bytes` with the float32 values of bfloat16 precision
          counted in bfloat16, as a TPU moves them (`shardscope.hlo.narrowing`); None when none narrow.
  handoff  the collective hands a loop iteration's result to the next iteration's matrix work (a pipeline
          stage's output to the next stage): nothing can hide it (`shardscope.hlo.handoffs`).
  origins, consumer, line  (only when asked) what the row's instructions move (`shardscope.hlo.origins`),
          the op_name of its first instruction (the op that needs the moved value in the other layout: the
          partitioner names a collective after the op it reshards for) and that op's source (file, line).
          They describe a row and never split one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shardscope.errors import MeshError
from shardscope.hlo.accumulation import loop_accumulations
from shardscope.hlo.callgraph import expand_calls
from shardscope.hlo.executions import Program
from shardscope.hlo.frames import source_frames
from shardscope.hlo.groups import (
    MeshLayout,
    format_groups,
    format_pairs,
    groups_to_axes,
    pairs_to_shift,
    parse_replica_groups,
)
from shardscope.hlo.handoffs import Handoffs
from shardscope.hlo.metadata import module_path, op_name_in, pass_of
from shardscope.hlo.module import gc_paused, read_module
from shardscope.hlo.narrowing import Narrowing
from shardscope.hlo.notices import module_notices
from shardscope.hlo.origins import Origin, Origins, op_name_of
from shardscope.hlo.records import COLLECTIVE_LIKE, COLLECTIVE_OPS, Instruction, Module, base_opcode
from shardscope.hlo.shapes import async_start_output, shape_info
from shardscope.hlo.trips import LoopTrips

__all__ = [
    "COLLECTIVE_OPS",
    "Collective",
    "HloCollectives",
    "UnknownOp",
    "check_mesh",
    "collectives_of",
    "parse_collectives",
]

PASSES = ("forward", "backward", "optimizer", "other")
_PAIRS_RE = re.compile(r"source_target_pairs=(\{(?:\s*\{[^{}]*\}\s*,?)*\s*\})")
_PAIR_RE = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


@dataclass(frozen=True)
class Collective:
    """One aggregated row: identical collective instructions counted together (see the module docstring).

    `count` is the number of instruction instances (an instruction in a computation called from two sites
    counts twice); it does not include `loop_trips`, so executions per step = count x loop_trips.
    """

    op: str
    axes: tuple[str, ...] | None
    groups: str | None
    shift: int | None
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    count: int
    loop_trips: int | None
    pass_: str
    source: str
    tpu_bytes: int | None = None
    handoff: bool = False  # hands a loop iteration's result to the next (`shardscope.hlo.handoffs`)
    tpu_moved_out: int | None = None  # what a TPU sums once after the loop instead (`moved_out`)
    origins: tuple[Origin, ...] = field(default=(), compare=False)
    consumer: str = field(default="", compare=False)
    line: tuple[str, int] | None = field(default=None, compare=False)
    stack: tuple[tuple[str, int], ...] = field(default=(), compare=False)  # `line`'s stack, innermost first

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict in field order; `pass_` is emitted as "pass", tuples as lists; `tpu_bytes`
        only when set."""
        out = {f.name.rstrip("_"): getattr(self, f.name) for f in fields(self) if f.compare}
        if self.tpu_bytes is None:
            del out["tpu_bytes"]
        if not self.handoff:
            del out["handoff"]
        if self.tpu_moved_out is None:
            del out["tpu_moved_out"]
        return {**out, "axes": None if self.axes is None else list(self.axes), "shape": list(self.shape)}


@dataclass(frozen=True)
class UnknownOp:
    """An instruction that looks collective (send, recv, a new opcode, a malformed line) but is not read."""

    op: str
    line: int


@dataclass(frozen=True)
class HloCollectives:
    """What `parse_collectives` found.

    Attributes:
      collectives: aggregated rows, sorted by pass, source, op, axes, shape.
      unknown: collective-like instructions that are not counted.
      notices: one line each about what the text left out (it ends inside a computation, instructions that
        do not parse), for the user to read; empty for a complete, well-formed module.
      num_devices: the devices the module runs on (num_partitions x replica_count), if its header says.
      highest_device: the highest device id any replica group or permute pair names, if any does.
    """

    collectives: tuple[Collective, ...]
    unknown: tuple[UnknownOp, ...]
    notices: tuple[str, ...] = ()
    num_devices: int | None = None
    highest_device: int | None = None


class _Rows:
    """Row fields of collective instructions; repeated op_names and group spellings are worked out once."""

    def __init__(self, mesh: MeshLayout | None, num_devices: int | None) -> None:
        self.mesh = mesh
        self.num_devices = mesh.num_devices if mesh else num_devices
        self.memo: dict[tuple[str, str], Any] = {}
        self.highest: int | None = None

    def row(self, op: str, instruction: Instruction, is_start: bool) -> tuple[Collective, int]:
        """(row with count 0, group size) of a collective instruction."""
        op_name = op_name_in(instruction.attribute("metadata"))
        pass_, source = self._cached("op_name", op_name, lambda s: (pass_of(s) if s else "other", module_path(s)))
        if op == "collective-permute":
            spec = instruction.attribute("source_target_pairs") or "{}"
            axes, groups, shift = self._cached("pairs", spec, self._permute)
            size = 1
        else:
            spec = instruction.attribute("replica_groups") or "{}"
            axes, groups, size = self._cached("groups", spec, self._groups)
            shift = None
        shape = async_start_output(instruction.shape, op) if is_start else instruction.shape
        dtype, dims, nbytes = shape_info(shape)
        nbytes *= size if op == "reduce-scatter" else 1  # report the operand: the result is 1/size of it
        return Collective(op, axes, groups, shift, dtype, dims, nbytes, 0, None, pass_, source), size

    def _cached(self, kind: str, key: str, compute: Any) -> Any:
        if (kind, key) not in self.memo:
            self.memo[(kind, key)] = compute(key)
        return self.memo[(kind, key)]

    def _saw(self, devices: list[int]) -> None:
        if devices:
            self.highest = max(self.highest if self.highest is not None else -1, max(devices))

    def _groups(self, spec: str) -> tuple[tuple[str, ...] | None, str | None, int]:
        try:
            groups = parse_replica_groups(spec)
        except ValueError:
            return None, spec, 1  # an unknown spelling: keep it verbatim
        self._saw([d for g in groups for d in g])
        if not groups and self.num_devices:
            groups = [list(range(self.num_devices))]
        size = len(groups[0]) if groups else 1
        axes = groups_to_axes(groups, self.mesh) if self.mesh else None
        return axes, None if axes is not None else format_groups(groups), size

    def _permute(self, spec: str) -> tuple[tuple[str, ...] | None, str | None, int | None]:
        if not _PAIRS_RE.fullmatch("source_target_pairs=" + spec):
            return None, spec, None  # malformed: keep it verbatim
        pairs = [(int(s), int(t)) for s, t in _PAIR_RE.findall(spec)]
        self._saw([d for pair in pairs for d in pair])
        shifted = pairs_to_shift(pairs, self.mesh) if self.mesh else None
        return (shifted[0], None, shifted[1]) if shifted else (None, format_pairs(pairs), None)


def collectives_of(
    module: Module,
    mesh: MeshLayout | None = None,
    narrow: bool = False,
    trace: bool = False,
    moved_out: bool = False,
    program: Program | None = None,
) -> HloCollectives:
    """The collectives of a read module (see `parse_collectives`); `narrow`: also each row's `tpu_bytes`
    (for a CPU program priced as a TPU); `trace`: also each row's origins, consumer and line; `moved_out`
    (a CPU program of Auto axes): the `tpu_moved_out` of an all-reduce its loop only adds into slots of a
    carried buffer, the buffers a TPU sums once after the loop instead (`shardscope.hlo.accumulation`), in the
    types `narrow` gives. `program`: the module's `Program`, when the caller has one to share."""
    rows = _Rows(mesh, module.num_devices)
    narrowing = Narrowing(module) if narrow else None
    accumulated = loop_accumulations(program or Program(module)).buffer_bytes if moved_out else {}
    handoffs = Handoffs(module)
    origins = Origins(module) if trace else None
    frames = source_frames(module.text) if trace else None
    traced: list[tuple[tuple[Origin, ...], str, tuple[tuple[str, int], ...]]] = []
    raws: list[Collective] = []
    sizes: list[int] = []
    per_computation: dict[str, list[int]] = {}
    unknown: list[tuple[str, int]] = []
    for comp in module.computations:
        if not (comp.instructions or comp.malformed):
            continue
        unknown += [(m.opcode, m.offset) for m in comp.malformed if m.opcode and COLLECTIVE_LIKE.match(m.opcode)]
        starts: dict[str, int] = {}
        mine = per_computation.setdefault(comp.name, [])
        for instruction in comp.instructions:
            opcode = instruction.opcode
            base = base_opcode(opcode)
            if opcode.endswith(("-done", "-update")):
                r = starts.pop(instruction.operands[0], None) if instruction.operands else None
                if r is not None and base in COLLECTIVE_OPS:
                    dtype, dims, nbytes = shape_info(instruction.shape)
                    nbytes *= sizes[r] if raws[r].op == "reduce-scatter" else 1
                    raws[r] = replace(raws[r], dtype=dtype, shape=dims, bytes=nbytes)
            elif base in COLLECTIVE_OPS:
                row, size = rows.row(base, instruction, opcode != base)
                moved = narrowing.tpu_bytes(comp.name, instruction) if narrowing is not None else None
                if moved is not None:  # scaled like `bytes` (a reduce-scatter reports its operand)
                    row = replace(row, tpu_bytes=row.bytes * moved // max(shape_info(instruction.shape)[2], 1))
                buffers = accumulated.get(f"{comp.name}/{instruction.name}")
                if buffers is not None:
                    row = replace(row, tpu_moved_out=buffers * (row.tpu_bytes or row.bytes) // max(row.bytes, 1))
                if instruction.name in handoffs.of(comp.name):
                    row = replace(row, handoff=True)
                if origins is not None and frames is not None:
                    stack = frames.chain_of(instruction.attribute("metadata"))
                    traced.append((origins.of(comp.name, instruction), op_name_of(instruction), stack))
                mine.append(len(raws))
                if opcode != base:
                    starts[instruction.name] = len(raws)
                raws.append(row)
                sizes.append(size)
            elif COLLECTIVE_LIKE.match(opcode):
                unknown.append((opcode, instruction.offset))
    counted = expand_calls(module, per_computation, LoopTrips(module))
    totals: Counter[tuple[Collective, int | None]] = Counter()
    members: dict[tuple[Collective, int | None], list[int]] = {}
    for (r, trips), n in counted.items():
        totals[(raws[r], trips)] += n
        members.setdefault((raws[r], trips), []).append(r)
    collectives = sorted(
        (
            replace(row, count=n, loop_trips=trips, **_traced(traced, members[(row, trips)]))
            for (row, trips), n in totals.items()
        ),
        key=_sort_key,
    )
    return HloCollectives(
        tuple(collectives),
        tuple(UnknownOp(op, line) for op, line in _lines(module.text, unknown)),
        module_notices(module),
        module.num_devices,
        rows.highest,
    )


def _traced(
    traced: list[tuple[tuple[Origin, ...], str, tuple[tuple[str, int], ...]]], members: list[int]
) -> dict[str, Any]:
    """A row's origins (of all its instructions, in instruction order), consumer, line and stack (its first
    instruction's); nothing when the module was not traced."""
    if not traced:
        return {}
    first = min(members)
    moved = dict.fromkeys(origin for r in sorted(members) for origin in traced[r][0])
    stack = traced[first][2]
    return {"origins": tuple(moved), "consumer": traced[first][1], "line": stack[0] if stack else None, "stack": stack}


def parse_collectives(hlo_text: str | bytes, mesh: MeshLayout | None = None) -> HloCollectives:
    """Finds every collective in an HLO module and aggregates them per (op, axes, shape, pass, source, ...).

    Args:
      hlo_text: HLO module text (compiled `as_text()` or an XLA dump); bytes of any encoding are read too.
      mesh: the user's mesh; without it, `axes` is None and `groups` spells the device groups.

    Returns:
      Aggregated collectives, sorted by pass, source, op, axes, shape; unhandled collective-like ops; and
      notices about what the text left out.

    Raises:
      HloParseError: if the text is no HLO module, or one XLA's parser rejects as a whole (a computation
        defined twice, two ENTRY computations, two modules).
    """
    with gc_paused():
        return collectives_of(read_module(hlo_text), mesh)


def check_mesh(parsed: HloCollectives, mesh: MeshLayout) -> None:
    """Raises MeshError unless `mesh` covers exactly the module's devices (as far as the module says)."""
    spelled = ",".join(f"{a}={s}" for a, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    if parsed.num_devices is not None and parsed.num_devices != mesh.num_devices:
        raise MeshError(
            f"--mesh {spelled} has {mesh.num_devices} devices but the module runs on {parsed.num_devices}"
            " (num_partitions x replica_count in its HloModule line); give sizes whose product is that"
        )
    if parsed.highest_device is not None and parsed.highest_device >= mesh.num_devices:
        raise MeshError(
            f"--mesh {spelled} has {mesh.num_devices} devices but the module's replica groups name device"
            f" {parsed.highest_device}; give sizes whose product covers every device"
        )


def _lines(text: str, found: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(opcode, offset) → (opcode, 1-based line), in text order, counting line breaks once."""
    out, line, last = [], 1, 0
    for opcode, at in sorted(found, key=lambda u: u[1]):
        line, last = line + text.count("\n", last, at), at
        out.append((opcode, line))
    return out


def _sort_key(c: Collective) -> tuple[Any, ...]:
    first = (PASSES.index(c.pass_), c.source, c.op, c.axes is None, c.axes or (), c.groups or "", c.shift or 0)
    return (*first, c.shape, c.dtype, c.loop_trips is None, c.loop_trips or 0, c.bytes)
