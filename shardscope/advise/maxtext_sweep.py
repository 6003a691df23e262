"""`advise maxtext:MODEL`: MaxText's own program searched over the sizes of its mesh axes.

A candidate is MaxText's command line with its `ici_*_parallelism` keys set: the devices of one slice (one
NVLink domain on a GPU cluster) factored over data, fsdp and tensor parallelism, and expert parallelism for
a model with experts. An axis the command line sizes itself is held at that size; the rules are the command
line's (`custom_mesh_and_rule`), as every other key is.

Nothing is screened or predicted: the prediction reads the reference models' blocks, and MaxText's program is
not one of them (`benchmarks/prediction.py` names such plans "unresolved"). So every candidate is compiled,
each a MaxText build and compile in a process of its own, and MaxText's own refusals (a head count an axis
does not divide, …) are the candidates' refusals, in MaxText's words. Hold axes to keep the search small.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from shardscope.advise.advice import Advice, SweepProgress, SweepRequest
from shardscope.advise.prune import COMPILE, Screening, Target
from shardscope.advise.rank import Ranked, rank, ranked_of
from shardscope.advise.space import Candidate, factorizations
from shardscope.advise.sweep import target_label
from shardscope.case.maxtext_model import MaxTextCase, resolve_maxtext_model
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import get_topology
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import GoldenCase
from shardscope.golden.runner import dump_cases
from shardscope.plan.json import plan_from_json

# The axes searched, in MaxText's mesh order; expert only for a model with experts.
SEARCHED = ("data", "fsdp", "tensor", "expert")
_KEY = "ici_{}_parallelism"


@dataclass(frozen=True)
class MaxTextSpace:
    """A `maxtext:` search: the case its command line names, and how many devices its ici axes share."""

    case: MaxTextCase
    maxtext: str  # the command line as given
    held: tuple[tuple[str, int], ...]  # the ici axes the command line sizes (not -1), in its order
    free: tuple[str, ...]  # the searched axes it leaves to the search
    devices: int  # one slice's devices (one NVLink domain's on a GPU cluster)


def maxtext_space(model: str, topology: str, maxtext: str, maxtext_path: Path | None) -> MaxTextSpace:
    """What to search, checked before anything compiles.

    Raises:
      ShardscopeError: a wrong MaxText model, tree or key; held axes that leave no device to search, or leave
        nothing to search.
    """
    target = get_topology(topology)
    case = resolve_maxtext_model(model, target, parse_maxtext_args(maxtext), maxtext_path)
    held = tuple(
        (key.removeprefix("ici_").removesuffix("_parallelism"), _size(key, value))
        for key, value in case.args
        if key.startswith("ici_") and key.endswith("_parallelism") and value.strip() != "-1"
    )
    devices = target.num_devices // target.slices
    fixed = math.prod(size for _, size in held)
    if fixed < 1 or devices % fixed:
        sizes = ", ".join(f"{_KEY.format(axis)}={size}" for axis, size in held)
        raise ShardscopeError(f"--maxtext {sizes}: the held axes do not divide a slice's {devices} devices")
    searched = SEARCHED if _has_experts(case) else SEARCHED[:-1]
    free = tuple(axis for axis in searched if axis not in dict(held))
    if not free:
        raise ShardscopeError(
            f"--maxtext sizes every searched axis ({', '.join(searched)}): leave one to the search (or use dump)"
        )
    return MaxTextSpace(case, maxtext, held, free, devices)


def _size(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ShardscopeError(f"--maxtext {key}={value}: expected a whole number of devices (or -1)") from None


def _has_experts(case: MaxTextCase) -> bool:
    """Whether the model routes over experts: its config's `num_experts` (or the command line's) above 1."""
    given = dict(case.args).get("num_experts")
    if given is None:
        given = (yaml.safe_load(case.tree.model_config(case.model).read_text()) or {}).get("num_experts", 1)
    return int(given) > 1


def maxtext_candidates(space: MaxTextSpace) -> list[Candidate]:
    """Every factorization of the free devices over the free axes, held axes as given, in lexicographic order."""
    rule = space.case.rule
    candidates: list[Candidate] = []
    for sizes in factorizations(space.devices // math.prod(size for _, size in space.held), space.free):
        mesh = (*zip(space.free, sizes, strict=True), *space.held)
        candidates.append(Candidate(len(candidates), rule, rule, mesh))
    return candidates


def candidate_line(space: MaxTextSpace, candidate: Candidate) -> str:
    """MaxText's command line of a candidate: the user's, then the searched axes' sizes (the last key wins)."""
    sizes = " ".join(f"{_KEY.format(axis)}={size}" for axis, size in candidate.mesh if axis in space.free)
    return " ".join(part for part in (space.maxtext, sizes) if part)


def advise_maxtext(
    request: SweepRequest,
    space: MaxTextSpace,
    target: Target,
    jobs: int,
    use_cache: bool = True,
    progress: Callable[[SweepProgress], None] | None = None,
) -> Advice:
    """Compiles every candidate (in parallel, each in a process of its own) and ranks those that fit."""
    started = time.perf_counter()
    candidates = maxtext_candidates(space)
    hardware = target.hardware_name
    path = str(space.case.tree.src) if space.case.tree.checkout else ""
    lines = [candidate_line(space, c) for c in candidates]
    cases = [
        GoldenCase(
            request.model,
            "",
            request.topology,
            name=str(c.index),
            hardware=hardware,
            efficiency=request.efficiency,
            maxtext=line,
            maxtext_path=path,
        )
        for c, line in zip(candidates, lines, strict=True)
    ]
    entries: list[Ranked] = []
    failed: list[tuple[Candidate, str]] = []
    best: Ranked | None = None
    cached = 0
    for done, result in enumerate(dump_cases(cases, jobs, use_cache), start=1):
        candidate = candidates[int(result.case.name)]
        cached += result.cached
        if result.plan_json is None:
            failed.append((candidate, result.error or "failed"))
        else:
            plan = plan_from_json(result.plan_json, candidate.key)
            entry = ranked_of(candidate, plan, _command(request, lines[candidate.index], path, hardware))
            entries.append(entry)
            if entry.fits and (best is None or entry.sort_key() < best.sort_key()):
                best = entry
        if progress is not None:
            progress(SweepProgress(done, len(cases), cached, best, candidate.key))
    ranking, over = rank(entries)
    return Advice(
        request=request,
        target=target_label(request.topology, target),
        hardware=target.hardware.name,
        efficiency=request.efficiency if request.efficiency is not None else target.hardware.efficiency,
        enumerated=len(candidates),
        screenings=tuple(Screening(c, COMPILE) for c in candidates),
        ranking=ranking,
        over_capacity=over,
        failed=tuple(sorted(failed, key=lambda f: f[0].index)),
        compiled=len(cases) - cached,
        cached=cached,
        seconds=time.perf_counter() - started,
    )


def _command(request: SweepRequest, line: str, path: str, hardware: str | None) -> Sequence[str]:
    """The `shardscope dump` that makes a candidate's plan."""
    command = ["shardscope", "dump", request.model, "--topology", request.topology, "--maxtext", line]
    if path:
        command += ["--maxtext-path", path]
    if hardware is not None and request.topology.startswith("cpu-"):
        command += ["--hardware", hardware]
    if request.efficiency is not None:
        command += ["--efficiency", f"{request.efficiency:g}"]
    return command
