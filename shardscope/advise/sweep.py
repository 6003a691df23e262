"""The whole search: enumerate, screen, compile what is left (once per program), rank — with progress,
resumable.

Compiles go through the runner (`dump_cases`): local processes or a Ray cluster, and the plan cache, in
which every compiled candidate is stored as soon as it finishes. An interrupted sweep run again therefore
compiles only what it had not finished (with `use_cache=False` it starts over).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from shardscope.advise.advice import DEFAULT_HARDWARE, DEFAULT_MARGIN, Advice, SweepProgress, SweepRequest
from shardscope.advise.predicted import predicted_entry, safe_prediction, to_confirm
from shardscope.advise.programs import ProgramGroup, group_same_programs
from shardscope.advise.prune import COMPILE, INVALID, Screening, Target, screen, target_of
from shardscope.advise.rank import Ranked, rank, rank_confirmed, ranked_of
from shardscope.advise.space import Candidate, live_axes, preset_meshes
from shardscope.advise.template import Template, load_template, template_case
from shardscope.case.hardware import load_hardware
from shardscope.case.presets import builtin_preset_names, get_preset
from shardscope.case.resolve import get_model, parse_overrides
from shardscope.case.topology import format_mesh, get_topology, parse_mesh_arg, resolve_mesh
from shardscope.cost.price import target_for
from shardscope.errors import ShardscopeError, unknown_name
from shardscope.golden.cases import GoldenCase
from shardscope.golden.runner import dump_cases
from shardscope.plan.json import plan_from_json
from shardscope.stages.compiler_log import prepare_compiler_log


def make_request(
    model: str,
    topology: str,
    presets: Sequence[str] | None,
    mesh: Mapping[str, int] | str | None,
    settings: Mapping[str, str] | Sequence[str] | None,
    hardware: str | None,
    efficiency: float | None,
    confirm: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> SweepRequest:
    """A request from what users type: all built-in presets when none, `--mesh` text or a mapping of held
    axes, `--set` strings or a mapping, `--confirm` (0: compile every candidate screened in) (raises
    ShardscopeError on malformed text)."""
    if confirm < 0:
        raise ShardscopeError(f"--confirm must be 0 (compile every candidate) or more, found {confirm}")

    pinned = parse_mesh_arg(mesh) if isinstance(mesh, str) else dict(mesh or {})
    overrides = dict(settings) if isinstance(settings, Mapping) else parse_overrides(settings or [])
    return SweepRequest(
        model=model,
        topology=topology,
        presets=tuple(presets or builtin_preset_names()),
        overrides=tuple(sorted(overrides.items())),
        pinned=tuple(pinned.items()),
        hardware=hardware,
        efficiency=efficiency,
        confirm=confirm or None,
        margin=margin,
    )


def preset_label(preset: str) -> str:
    """A built-in preset's name, or a preset file's stem."""
    return Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset


def validate(request: SweepRequest) -> Target:
    """Every user input of the request, checked before anything traces (raises ShardscopeError, one line)."""

    get_model(request.model)
    topology = get_topology(request.topology)
    if not request.presets:
        raise ShardscopeError("advise needs at least one preset")
    if len(set(request.presets)) != len(request.presets):
        raise ShardscopeError(f"--preset: each preset once, found {', '.join(request.presets)}")
    presets = [get_preset(p) for p in request.presets]
    parse_overrides([f"{k}={v}" for k, v in request.overrides])
    axes = {axis for preset in presets for axis in preset.mesh_axes}
    for axis, size in request.pinned:
        if axis not in axes:
            raise ShardscopeError(
                f"--mesh names a missing mesh axis: {unknown_name('axis', axis, sorted(axes)).args[0]}"
            )
        if size < 1 or topology.num_devices % size:
            raise ShardscopeError(
                f"--mesh {axis}={size}: a held axis needs a size that divides {topology.num_devices} devices"
            )
    if request.confirm is not None and request.confirm < 1:
        raise ShardscopeError(f"--confirm must be at least 1, found {request.confirm}")
    if not request.margin >= 0:
        raise ShardscopeError(f"--margin must be 0 or more (a fraction of the best step), found {request.margin}")
    if request.predict_only and request.exhaustive:
        raise ShardscopeError("--predict-only compiles nothing; an exhaustive search compiles every candidate")
    return pricing_target(request.topology, request.hardware, request.efficiency)


def pricing_target(topology: str, hardware_name: str | None, efficiency: float | None) -> Target:
    """What a search's plans are priced on: a TPU topology as itself unless a generation is named, anything else
    as the named generation or DEFAULT_HARDWARE (raises ShardscopeError on a wrong name or efficiency)."""
    own = target_for(topology, None)
    if hardware_name is None and own is not None:
        hardware = own.hardware  # a TPU topology prices as itself
    else:
        hardware_name = hardware_name or DEFAULT_HARDWARE
        hardware = load_hardware(hardware_name)
    if efficiency is not None and not 0 < efficiency <= 1:
        raise ShardscopeError(f"--efficiency must be in (0, 1], found {efficiency}")
    return target_of(topology, hardware, hardware_name, efficiency)


def enumerate_candidates(request: SweepRequest, templates: Mapping[str, Template]) -> list[Candidate]:
    """Every (preset, mesh) of the search, in a fixed order: presets as given, meshes lexicographically."""

    devices = get_topology(request.topology).num_devices
    candidates: list[Candidate] = []
    for name in request.presets:
        preset = get_preset(name)
        template = templates[name]
        live = live_axes(preset, template.logical_names)
        pinned = {a: s for a, s in request.pinned if a in preset.mesh_axes}
        for mesh in preset_meshes(preset, live, devices, pinned):
            candidates.append(Candidate(len(candidates), name, preset_label(name), mesh))
    return candidates


def reproduce_command(request: SweepRequest, candidate: Candidate, hardware: str | None) -> list[str]:
    """The `shardscope dump` command line that makes this candidate's plan (as short as it can be)."""

    preset = get_preset(candidate.preset)
    devices = get_topology(request.topology).num_devices
    wanted = dict(candidate.mesh)
    # The axes that split devices, and those the preset sizes itself (which would otherwise keep its sizes).
    spelled = {axis: size for axis, size in candidate.mesh if size != 1 or axis in dict(preset.mesh)}
    try:
        same = dict(resolve_mesh(preset, devices, spelled)) == wanted
    except ShardscopeError:
        same = False
    if not same:
        spelled = wanted
    order = [axis for axis, _ in candidate.mesh]
    command = ["shardscope", "dump", request.model, "--preset", candidate.preset, "--topology", request.topology]
    command += ["--mesh", format_mesh(sorted(spelled.items(), key=lambda kv: order.index(kv[0])))]
    for key, value in request.overrides:
        command += ["--set", f"{key}={value}"]
    if hardware is not None:
        command += ["--hardware", hardware]
    if request.efficiency is not None:
        command += ["--efficiency", f"{request.efficiency:g}"]
    return command


def advise(
    request: SweepRequest,
    jobs: int,
    use_cache: bool = True,
    ray: str | None = None,
    progress: Callable[[SweepProgress], None] | None = None,
) -> Advice:
    """Runs the search (see the package docstring). Raises ShardscopeError on a wrong input, before compiling."""

    started = time.perf_counter()
    prepare_compiler_log()  # before the templates start JAX: compiler warnings are captured, not printed
    target = validate(request)
    overrides = dict(request.overrides)
    pool = get_topology(request.topology)
    templates = {
        name: load_template(template_case(request.model, name, request.topology, overrides), pool, use_cache)
        for name in request.presets
    }
    candidates = enumerate_candidates(request, templates)
    screenings = tuple(
        screen(c, templates[c.preset], request.model, request.topology, overrides, target) for c in candidates
    )
    # A CPU plan names the generation it is priced on; a TPU topology prices as itself unless told otherwise.
    hardware = target.hardware_name
    predicting = time.perf_counter()
    predictions = _predict(request, screenings, templates, target, hardware)
    predict_seconds = time.perf_counter() - predicting
    chosen = _chosen(request, predictions)
    wanted = [
        (s.candidate, s.program)
        for s in screenings
        if _wanted(s, request) and (chosen is None or s.candidate.index in chosen)
    ]
    groups = group_same_programs(wanted)
    cases = [_golden_case(request, g.representative, hardware) for g in groups]
    by_index = {g.representative.index: g for g in groups}
    entries: list[Ranked] = []
    failed: list[tuple[Candidate, str]] = []
    cached = 0
    best: Ranked | None = None
    for done, result in enumerate(dump_cases(cases, jobs, use_cache, ray), start=1):
        group = by_index[int(result.case.name)]
        cached += result.cached
        if result.plan_json is None:
            failed += _refused(group, result.error or "failed")
        else:
            plan = plan_from_json(result.plan_json, group.representative.key)
            # Every candidate of the group is this program: each gets its figures, under its own command.
            fresh = [
                _with_prediction(ranked_of(c, plan, reproduce_command(request, c, hardware)), predictions)
                for c in group.candidates
            ]
            entries += fresh
            # The representative stands for the group here: the same figures, and first in search order.
            if fresh[0].fits and (best is None or fresh[0].sort_key() < best.sort_key()):
                best = fresh[0]
        if progress is not None:
            progress(SweepProgress(done, len(cases), cached, best, group.representative.key))
    compiled = {e.candidate.index for e in entries} | {c.index for c, _ in failed}
    only_predicted = [p for index, p in sorted(predictions.items()) if index not in compiled]
    ranking, over = rank_confirmed(entries, only_predicted) if only_predicted else rank(entries)
    estimate_target = target_label(request.topology, target)
    return Advice(
        request=request,
        target=estimate_target,
        hardware=target.hardware.name,
        efficiency=request.efficiency if request.efficiency is not None else target.hardware.efficiency,
        enumerated=len(candidates),
        screenings=screenings,
        ranking=ranking,
        over_capacity=over,
        failed=tuple(sorted(failed, key=lambda f: f[0].index)),
        compiled=len(cases) - cached,
        cached=cached,
        seconds=time.perf_counter() - started,
        same_program=sum(len(g.members) for g in groups),
        predicted=len(predictions),
        predict_seconds=predict_seconds,
    )


def _predict(
    request: SweepRequest,
    screenings: Sequence[Screening],
    templates: Mapping[str, Template],
    target: Target,
    hardware: str | None,
) -> dict[int, Ranked]:
    """Every candidate screening passed, priced by prediction (milliseconds each: a search that compiles
    them all still shows each prediction beside its compiled figures)."""
    found: dict[int, Ranked] = {}
    for screening in screenings:
        if screening.verdict != COMPILE or screening.case is None:
            continue
        candidate = screening.candidate
        plan = safe_prediction(templates[candidate.preset], screening.case, target)
        if isinstance(plan, str):
            continue  # the compile would refuse it too: screening's own checks passed, pricing did not
        found[candidate.index] = predicted_entry(plan, candidate, reproduce_command(request, candidate, hardware))
    return found


def _chosen(request: SweepRequest, predictions: Mapping[int, Ranked]) -> frozenset[int] | None:
    """The candidates to compile: None for every one (no confirming asked, or an exhaustive search), none
    (`predict_only`), or the confirmed few."""
    if request.predict_only:
        return frozenset()
    if request.confirm is None or request.exhaustive:
        return None
    return to_confirm(list(predictions.values()), request.confirm, request.margin)


def _with_prediction(entry: Ranked, predictions: Mapping[int, Ranked]) -> Ranked:
    """A compiled row with its prediction beside it (when the search predicted)."""
    predicted = predictions.get(entry.candidate.index)
    if predicted is None:
        return entry
    return dataclasses.replace(entry, predicted_step=predicted.step_expected)


def _wanted(screening: Screening, request: SweepRequest) -> bool:
    """Whether a screened candidate is planned: it passed, or the search is exhaustive and it is valid."""
    return screening.verdict == COMPILE or (request.exhaustive and screening.verdict != INVALID)


def _golden_case(request: SweepRequest, candidate: Candidate, hardware: str | None) -> GoldenCase:
    """The case that compiles `candidate`, named by its index (how results find their candidate again)."""
    return GoldenCase(
        request.model,
        candidate.preset,
        request.topology,
        candidate.mesh_text,
        tuple(f"{k}={v}" for k, v in request.overrides),
        name=str(candidate.index),
        hardware=hardware,
        efficiency=request.efficiency,
    )


def _refused(group: ProgramGroup, error: str) -> list[tuple[Candidate, str]]:
    """A refused compile refuses every candidate of its program; the others say whose compile it was."""
    shared = f"same program as {group.representative.key}: {error}"
    return [(group.representative, error), *((c, shared) for c in group.members)]


def target_label(topology: str, target: Target) -> str:
    """What the estimates are of: the TPU topology itself, or a generation a plan was priced as."""
    if target.exact_memory:
        return f"{topology} ({target.hardware.name})"
    return f"{target.hardware.name} (a {topology} plan priced as {target.hardware.name})"
