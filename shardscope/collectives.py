"""Parsed HLO collectives → the plan's collective rows (no JAX needed)."""

from __future__ import annotations

from collections.abc import Sequence

from shardscope.hlo import HloCollectives, MeshLayout
from shardscope.hlo.collectives import collectives_of
from shardscope.hlo.module import read_module
from shardscope.hlo.records import Module
from shardscope.plan import CollectiveRow


def collective_rows(parsed: HloCollectives) -> tuple[CollectiveRow, ...]:
    """The plan rows of a parsed module, in the parser's deterministic order."""
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
        )
        for c in parsed.collectives
    )


def extract_collectives(hlo: str | Module, mesh: Sequence[tuple[str, int]]) -> tuple[CollectiveRow, ...]:
    """Collective rows of a compiled module (its text, or the module read from it), in the case's mesh axes."""
    layout = MeshLayout(axis_names=tuple(a for a, _ in mesh), axis_sizes=tuple(s for _, s in mesh))
    module = hlo if isinstance(hlo, Module) else read_module(hlo)
    return collective_rows(collectives_of(module, layout))
