"""Words and numbers for an estimate, shared by the terminal, HTML and Markdown renderers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardscope.plan.estimate import GPU_COMPILER, Estimate
from shardscope.plan.units import human_bytes, human_flops, human_seconds, signed_seconds


def target_label(estimate: Estimate) -> str:
    """ "v5p 2x2x2" (chips per torus dimension), "2 × v5p 2x2x2" across slices."""
    one = f"{estimate.hardware} {'x'.join(map(str, estimate.slice_shape))}"
    return one if estimate.slices == 1 else f"{estimate.slices} × {one}"


def efficiency_label(estimate: Estimate) -> str:
    """ "efficiency 0.82 (hardware table)"."""
    return f"efficiency {estimate.efficiency:g} ({estimate.efficiency_source})"


def route_label(estimate: Estimate) -> str:
    """ "estimate from a TPU compile" (or "… from a CPU compile priced as v5p"): what every time printed is."""
    return f"estimate from a {estimate.route}" if estimate.route else "estimate"


def step_label(estimate: Estimate) -> str:
    """ "≈ 45.0 ms expected (estimate from a TPU compile); bounds 40.1 ms – 52.4 ms (communication hidden –
    not hidden)", or at least the communication."""
    if estimate.compute.flops is None:
        return (
            f"≥ {human_seconds(estimate.communication)} (communication alone: compute unknown; {route_label(estimate)})"
        )
    low, high = estimate.step_full_overlap, estimate.step_no_overlap
    bounds = f"{human_seconds(low)} – {human_seconds(high)} (communication hidden – not hidden)"
    if estimate.expected is None:
        return f"{bounds}; {route_label(estimate)}"
    return f"≈ {human_seconds(estimate.expected)} expected ({route_label(estimate)}); bounds {bounds}"


def compute_label(estimate: Estimate) -> str:
    """ "12.1 ms (compute-bound, 5.55 TFLOP / device)", or why it is unknown."""
    compute = estimate.compute
    if compute.flops is None:
        return "unknown (the plan records no compiled work: a tensors-only or older plan)"
    work = f"{human_flops(compute.flops)} and {human_bytes(int(compute.bytes_accessed or 0))} of HBM per device"
    return f"{human_seconds(compute.seconds)} ({compute.bound}-bound: {work})"


def memory_verdict(estimate: Estimate) -> str:
    """ "fits: 37.2 GiB of 95.0 GiB (39%)" or "does not fit: 1.2 TiB of 95.0 GiB, 1.1 TiB over"."""
    memory = estimate.memory
    share = f"{100 * memory.total / memory.capacity:.0f}%"
    if memory.exact and memory.total > memory.capacity:
        return (
            f"fits: the TPU compiler placed the step (the static sum of its figures, {human_bytes(memory.total)} "
            f"of {human_bytes(memory.capacity)}, counts buffers alive at different times together)"
        )
    if memory.fits:
        return f"fits: {human_bytes(memory.total)} of {human_bytes(memory.capacity)} ({share})"
    return (
        f"does not fit: {human_bytes(memory.total)} of {human_bytes(memory.capacity)} ({share}), "
        f"{human_bytes(memory.over)} over"
    )


def memory_source_label(estimate: Estimate) -> str:
    """Where the need comes from: the TPU compiler (exact), the GPU compiler (the sum of its figures: an upper
    bound) or the named tensors (a floor)."""
    if estimate.memory.source == GPU_COMPILER:
        return "GPU compiler: arguments + outputs + temporaries, an upper bound"
    return "TPU compiler, exact" if estimate.memory.exact else "estimated from named tensors: a floor"


# One line of a before/after cost table: section, name, and the value on each side (None: absent there).
CostRow = tuple[str, str, float | None, float | None]


def _paired(section: str, before: Sequence[tuple[str, float]], after: Sequence[tuple[str, float]]) -> list[CostRow]:
    old, new = dict(before), dict(after)
    names = sorted(old.keys() | new.keys(), key=lambda n: -max(old.get(n, 0.0), new.get(n, 0.0)))
    return [(section, name, old.get(name), new.get(name)) for name in names]


def compiled(estimate: Estimate | None) -> bool:
    """Whether an estimate prices a compiled plan: a tensors-only plan has no collectives and no compiled
    work, so its communication is unknown (not zero)."""
    return estimate is not None and bool(estimate.rows or estimate.compute.flops is not None)


def cost_rows(before: Estimate | None, after: Estimate | None) -> list[CostRow]:
    """Seconds per step on each side: per mesh axis, per op, per pass, then the totals and step bounds (a
    side that holds tensors only has no figures: unknown, not zero)."""
    before = before if compiled(before) else None
    after = after if compiled(after) else None
    empty = ()
    rows = _paired("mesh axis", before.by_axes if before else empty, after.by_axes if after else empty)
    rows += _paired("op", before.by_op if before else empty, after.by_op if after else empty)
    rows += _paired("pass", before.by_pass if before else empty, after.by_pass if after else empty)

    def both(pick: Callable[[Estimate], float | None]) -> tuple[float | None, float | None]:
        return (pick(before) if before else None, pick(after) if after else None)

    def compute(e: Estimate) -> float | None:
        return e.compute.seconds if e.compute.flops is not None else None

    def bound(e: Estimate, full: bool) -> float | None:
        if e.compute.flops is None:
            return None
        return e.step_full_overlap if full else e.step_no_overlap

    rows.append(("total", "communication", *both(lambda e: e.communication)))
    rows.append(("total", "compute", *both(compute)))
    rows.append(("total", "step, expected", *both(lambda e: e.expected)))
    rows.append(("total", "step, not hidden", *both(lambda e: bound(e, False))))
    rows.append(("total", "step, hidden", *both(lambda e: bound(e, True))))
    return [row for row in rows if row[2] is not None or row[3] is not None]


def cost_headline(before: Estimate | None, after: Estimate | None, baseline: str) -> str | None:
    """ "+0.8 ms per step over default on v5p 2x2x2 (step, communication not hidden, +3%)", or None
    without both sides. The step is compared when both sides know their compute, else the communication."""
    if before is None or after is None:
        return None
    if not (compiled(before) and compiled(after)):
        # A tensors-only plan has neither collectives nor compiled work: there is no time to compare.
        return "communication unknown: nothing compiled (a tensors-only plan); time per step not compared"
    if before.expected is not None and after.expected is not None:
        old, new, what = before.expected, after.expected, f"expected step, {route_label(after)}"
    elif before.compute.flops is not None and after.compute.flops is not None:
        old, new, what = before.step_no_overlap, after.step_no_overlap, "step, communication not hidden"
    else:
        old, new, what = before.communication, after.communication, "communication"
    relative = f", {(new - old) / old:+.0%}".replace("-", "−") if old else ""
    where = target_label(after)
    if before.hardware != after.hardware:  # each side priced on its own hardware (a TPU plan and a GPU plan)
        where = f"{target_label(before)} → {where}"
    return f"{signed_seconds(new - old)} per step over {baseline} on {where} ({what}{relative})"


def memory_headline(before: Estimate | None, after: Estimate | None) -> str | None:
    """ "HBM need 37.2 GiB → 41.0 GiB of 95.0 GiB: fits" (or "no longer fits"), or None without both sides."""
    if before is None or after is None:
        return None
    old, new = before.memory, after.memory
    fits = {
        (True, True): "fits",
        (True, False): "no longer fits",
        (False, True): "now fits",
        (False, False): "does not fit",
    }[(old.fits, new.fits)]
    if old.capacity != new.capacity:  # each side held against its own hardware's capacity
        return (
            f"HBM need {human_bytes(old.total)} of {human_bytes(old.capacity)} → {human_bytes(new.total)} of "
            f"{human_bytes(new.capacity)}: {fits}"
        )
    return f"HBM need {human_bytes(old.total)} → {human_bytes(new.total)} of {human_bytes(new.capacity)}: {fits}"
