"""Parsed HLO collectives → the plan's collective rows, from a compiled step or any HLO text file (no JAX)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from shardscope.case.rules import Rule
from shardscope.case.topology import parse_mesh_arg
from shardscope.errors import MeshError, ShardscopeError
from shardscope.extract.causes import collective_cause
from shardscope.hlo.collectives import HloCollectives, check_mesh, collectives_of
from shardscope.hlo.executions import Program
from shardscope.hlo.groups import MeshLayout
from shardscope.hlo.module import HloParseError, read_module
from shardscope.hlo.records import Module
from shardscope.plan.records import Cause, CollectiveRow, TensorRecord


def collective_rows(parsed: HloCollectives, causes: Sequence[Cause | None] | None = None) -> tuple[CollectiveRow, ...]:
    """The plan rows of a parsed module, in the parser's deterministic order (with `causes`, one a row)."""
    causes = causes if causes is not None else [None] * len(parsed.collectives)
    return tuple(
        CollectiveRow(
            op=c.op,
            axes=c.axes,
            dtype=c.dtype,
            shape=c.shape,
            bytes=c.bytes,
            count=c.count,
            loop_trips=c.loop_trips,
            pass_=c.pass_,
            source=c.source,
            groups=c.groups,
            shift=c.shift,
            tpu_bytes=c.tpu_bytes,
            handoff=c.handoff,
            tpu_moved_out=c.tpu_moved_out,
            cause=cause,
        )
        for c, cause in zip(parsed.collectives, causes, strict=True)
    )


def extract_collectives(
    hlo: str | Module,
    mesh: Sequence[tuple[str, int]],
    narrow: bool = False,
    explain: tuple[Mapping[str, TensorRecord], Sequence[Rule]] | None = None,
    moved_out: bool = False,
    program: Program | None = None,
) -> tuple[CollectiveRow, ...]:
    """Collective rows of a compiled module (its text, or the module read from it), in the case's mesh axes;
    `narrow` (a CPU program): with the bytes a TPU would move (`tpu_bytes`); `explain` (the plan's tensors
    and the preset's rules): with each row's cause; `moved_out` (a CPU program of Auto axes): with what a TPU
    sums after the loop for an all-reduce the loop only accumulates (`tpu_moved_out`). `program`: the module's
    `Program` when the caller has read one (its loop counts are then counted once)."""
    layout = MeshLayout(axis_names=tuple(a for a, _ in mesh), axis_sizes=tuple(s for _, s in mesh))
    module = hlo if isinstance(hlo, Module) else read_module(hlo)
    parsed = collectives_of(module, layout, narrow, trace=explain is not None, moved_out=moved_out, program=program)
    causes = collective_cause(parsed.collectives, *explain) if explain is not None else None
    return collective_rows(parsed, causes)


def module_layout(text: str, num_devices: int | None) -> MeshLayout:
    """`collectives --mesh` as a layout: each axis once, a -1 filled from the module's devices.

    Raises:
      MeshError: an axis given twice, no axes, or a -1 the module's device count cannot fill.
    """
    sizes = parse_mesh_arg(text)
    names = [part.partition("=")[0].strip() for part in text.split(",") if part.strip()]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise MeshError(f"--mesh {text!r}: axis {repeated[0]!r} is given twice; name each mesh axis once")
    if not sizes:
        raise MeshError(f"--mesh {text!r}: expected axis=size pairs like 'fsdp=4,expert=2'")
    fill = [axis for axis, size in sizes.items() if size == -1]
    if fill:
        known = 1
        for size in sizes.values():
            known *= size if size > 0 else 1
        if len(fill) > 1 or num_devices is None or num_devices % known:
            why = (
                "only one axis may be -1"
                if len(fill) > 1
                else "the module does not say how many devices it runs on; give every size"
                if num_devices is None
                else f"the module runs on {num_devices} devices, which the other axes ({known}) do not divide"
            )
            raise MeshError(f"--mesh {text!r}: cannot fill {fill[0]!r} (-1): {why}")
        sizes[fill[0]] = num_devices // known
    return MeshLayout(tuple(sizes), tuple(sizes.values()))


def hlo_file_collectives(path: Path, mesh: str | None) -> HloCollectives:
    """The collectives of an HLO text file (`Compiled.as_text()`, an `--xla_dump_to` module), in the mesh axes
    `mesh` names (`data=1,fsdp=4`; device groups as they are without it).

    Raises:
      ShardscopeError: an unreadable or unparsable file, or a mesh that does not fit the module.
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ShardscopeError(f"cannot read {path}: {err.strerror}") from None
    try:
        module = read_module(data)
    except HloParseError as err:
        raise ShardscopeError(f"{path}: {err}") from None
    layout = module_layout(mesh, module.num_devices) if mesh else None
    parsed = collectives_of(module, layout)
    if layout is not None:
        check_mesh(parsed, layout)
    return parsed
