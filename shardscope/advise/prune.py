"""Screening a candidate without compiling it: can it work at all, and can it fit?

Three checks, cheapest first, each one the compile's own rule or a bound below the compiled figure:
  - invalid: `resolve_case` or the pricing layout refuses the mesh (a pipeline its stages do not divide,
    a mesh that is not a slice of the target) — exactly what `dump` would refuse;
  - indivisible: a parameter, optimizer-state, input or activation dimension its mesh axes do not divide
    (the compile raises ShardingError for the same dimension);
  - memory: a lower bound of the per-device HBM need is above capacity. On a target whose memory comes
    from the TPU compiler, the bound is the step's arguments (params, optimizer state, inputs), which the
    compiled program holds in full; where the cost model estimates memory from the tensors (a CPU plan
    priced as a TPU), the bound is that very estimate computed from the placed template.
Every candidate these checks pass is compiled, once per program (`advise.programs`: a candidate that places
everything as an earlier one does shares its plan); none they reject could have ranked (it fails or does not
fit), which the exhaustive-search test checks on the tiny models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardscope.advise.programs import UNKNOWN, program_key
from shardscope.advise.space import Candidate
from shardscope.advise.template import Template, placed_plan
from shardscope.case.hardware import Hardware
from shardscope.case.resolve import Case, resolve_case
from shardscope.cost.memory import memory_need
from shardscope.cost.price import check_pricing, tpu_of_topology
from shardscope.errors import ShardscopeError
from shardscope.plan.records import case_record
from shardscope.plan.units import human_bytes

COMPILE = "compile"
INVALID = "invalid"
INDIVISIBLE = "indivisible"
MEMORY = "memory"
PRUNED = (INVALID, INDIVISIBLE, MEMORY)


@dataclass(frozen=True)
class Screening:
    """What screening decided for one candidate, and why."""

    candidate: Candidate
    verdict: str  # COMPILE or one of PRUNED
    reason: str = ""
    memory_bound: int | None = None  # bytes per device (None: not reached)
    program: str = UNKNOWN  # its program key (`advise.programs`); UNKNOWN for an invalid candidate
    case: Case | None = None  # the candidate's case, resolved (None for an invalid candidate)


@dataclass(frozen=True)
class Target:
    """What the candidates are priced on: the generation, and whether its memory figures are the compiler's."""

    hardware: Hardware
    hardware_name: str | None  # as the user named it (None: the TPU topology's own)
    efficiency: float | None
    exact_memory: bool


def target_of(topology: str, hardware: Hardware, hardware_name: str | None, efficiency: float | None) -> Target:
    """The pricing target of a sweep on `topology`: a TPU topology priced as itself has the compiler's
    memory figures; anything else (a CPU plan, another generation) has the tensors' estimate."""
    own = tpu_of_topology(topology)
    return Target(hardware, hardware_name, efficiency, own is not None and own[0] == hardware.name)


def screen(
    candidate: Candidate,
    template: Template,
    model: str,
    topology: str,
    overrides: Mapping[str, str],
    target: Target,
) -> Screening:
    """Decides whether `candidate` is worth compiling (see the module docstring)."""
    try:
        case = resolve_case(model, candidate.preset, topology, dict(candidate.mesh), overrides)
        check_pricing(case.topology.name, case.mesh, target.hardware_name, target.efficiency, case.dcn_axis)
    except ShardscopeError as err:
        return Screening(candidate, INVALID, str(err))
    placed = template.place(case.mesh, pipelined=_pipelined(case))
    # Keyed whatever the verdict: an exhaustive search compiles the pruned candidates too.
    program = program_key(case, template, placed)
    if placed.indivisible:
        return Screening(candidate, INDIVISIBLE, placed.indivisible[0], program=program, case=case)
    bound = memory_bound(case, template, placed, target)
    capacity = target.hardware.hbm_bytes_per_device
    if bound > capacity:
        what = "arguments alone" if target.exact_memory else "the tensors' estimate"
        reason = f"needs at least {human_bytes(bound)} per device ({what}), over {human_bytes(capacity)}"
        return Screening(candidate, MEMORY, reason, bound, program, case)
    return Screening(candidate, COMPILE, "", bound, program, case)


def memory_bound(case: Case, template: Template, placed, target: Target) -> int:
    """A per-device HBM need no compiled plan of this case can be below (see the module docstring)."""
    if target.exact_memory:
        return sum(t.bytes_per_device for _, t in placed.tensors if t.kind in ("param", "opt_state", "input"))
    return memory_need(placed_plan(case_record(case), placed), target.hardware, exact=False).total


def _pipelined(case: Case) -> bool:
    pipeline = case.preset.pipeline
    return pipeline is not None and case.mesh_sizes.get(pipeline.stage_axis, 1) > 1
