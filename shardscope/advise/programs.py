"""Candidates that are one program, told apart before compiling: only one of each is compiled.

Many presets place a model alike on a mesh (on `data=8`, every preset whose other axes are 1 does), and
compiling each of them again only repeats the same program. A candidate's *program key* is a digest of
everything its compile reads; candidates with one key form a group whose first candidate in search order is
compiled, and the others share its plan (`rank` then folds them into its row, as it folds any candidates
whose compiled programs agree).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from shardscope.advise.space import Candidate
from shardscope.advise.template import MeshTensors, Template
from shardscope.case.resolve import Case, compiler_options_for

# No program key: the candidate is compiled on its own.
UNKNOWN = ""


@dataclass(frozen=True)
class ProgramGroup:
    """Candidates of one program: the one compiled, and those that share its plan without compiling."""

    representative: Candidate  # the first in search order
    members: tuple[Candidate, ...] = ()

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return (self.representative, *self.members)


def program_key(case: Case, template: Template, placed: MeshTensors) -> str:
    """A digest of everything the compiled program of `case` depends on (`placed`: the template on its mesh),
    or UNKNOWN when that cannot be told without compiling.

    Equal placement alone is not the same program: the model, its settings (remat, batch, `--set` of any
    kind), the compiler options (XLA flags), the topology, the axis types (shard mode) and the MoE strategy
    all change what is compiled, so each is part of the key. The MoE strategy counts even where it changes
    nothing (a ring over one expert shard is no ring): telling when would mean reading the model's code.

    Not in the key, because the compile never reads them: the preset's name, description and lint settings,
    the MaxText fields `data_sharding` and `context_sharding`, and the rules themselves, which reach the
    program only through what they place — every tensor, and every tuple the model resolves without recording
    it (`Template.resolved_specs`). The mesh counts by the axes that split devices: a size-1 axis shards
    nothing and moves no device (the grid is a reshape of the device list on CPU; on TPU `mesh_utils` gives a
    size-1 axis no physical axis), so `data=8` is one mesh whatever size-1 axes a preset also names.

    An active pipeline is UNKNOWN: its activations are not the template's (microbatches change their shapes)
    and its stages resolve tuples the template's trace never reached.
    """
    if not placed.activations_known:
        return UNKNOWN
    material = (
        case.model_name,
        case.model,
        case.overrides,
        sorted(compiler_options_for(case).items()),
        case.topology,
        tuple((axis, size) for axis, size in case.mesh if size != 1),
        case.axis_types,
        case.preset.moe,
        tuple((path, t.kind, t.shape, t.dtype, t.spec) for path, t in placed.tensors),
        template.resolved_specs(case.mesh),
    )
    return hashlib.sha256(repr(material).encode()).hexdigest()[:16]


def group_same_programs(keyed: Sequence[tuple[Candidate, str]]) -> tuple[ProgramGroup, ...]:
    """(candidate, program key) pairs, in search order, as groups of one program each, in the order of their
    representatives. A candidate whose key is UNKNOWN is a group of its own."""
    groups: dict[str, list[Candidate]] = {}
    for candidate, key in keyed:
        groups.setdefault(key if key != UNKNOWN else f"#{candidate.index}", []).append(candidate)
    return tuple(ProgramGroup(first, tuple(rest)) for first, *rest in groups.values())
