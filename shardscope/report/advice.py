"""An `Advice` for people: a ranked table for the terminal, and one self-contained HTML page with the
time and memory of every ranked plan drawn (inline CSS and SVG, no script, every value escaped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardscope.advise.export import counts
from shardscope.advise.rank import Ranked
from shardscope.advise.sweep import Advice
from shardscope.case.maxtext_model import is_maxtext_model
from shardscope.plan.units import compact_bytes, human_bytes, human_seconds
from shardscope.report.html import environment
from shardscope.report.layout import FitToWidth
from shardscope.report.svg import stacked_against_capacity, stacked_bars


def headline(advice: Advice) -> str:
    """What was searched and on what it is priced."""
    request = advice.request
    searched = f"presets: {', '.join(request.presets)}"
    if is_maxtext_model(request.model):
        # MaxText's own program: its rules are its command line's; the search is over its ici_* sizes.
        searched = f"ici_*_parallelism searched under rules {request.presets[0]}"
        if request.maxtext:
            searched += f", --maxtext '{request.maxtext}'"
    return (
        f"{request.model} on {request.topology}, priced on {advice.target}, efficiency {advice.efficiency:g}; "
        f"{searched}"
    )


def counts_line(advice: Advice) -> str:
    """ "448 candidates: 13 pruned (10 indivisible, 1 invalid, 2 over HBM), 435 compiled (12 from cache) …" """
    data = counts(advice)
    pruned = data["pruned"]
    why = ", ".join(f"{n} {'over HBM' if verdict == 'memory' else verdict}" for verdict, n in pruned.items() if n)
    total_pruned = sum(pruned.values())
    done = data["compiled"] + data["cached"]
    parts = [
        f"{data['enumerated']} candidates",
        f"{total_pruned} pruned without compiling" + (f" ({why})" if why else ""),
        f"{done} planned ({data['compiled']} compiled, {data['cached']} from the plan cache)"
        + (f", {data['same_program']} sharing another's compile" if data.get("same_program") else ""),
        f"{data['fit']} fit",
    ]
    if data["over_capacity"]:
        parts.append(f"{data['over_capacity']} over HBM")
    if advice.predicted:
        parts.insert(2, f"{advice.predicted} priced by prediction in {advice.predict_seconds:.1f} s")
    if data["failed"]:
        parts.append(f"{data['failed']} refused by the compiler")
    return ", ".join(parts) + f"; {advice.seconds:.1f} s"


def step_text(entry: Ranked) -> str:
    """ "≈70.1 µs (65.7–88.8)": expected, then fully overlapped – nothing overlapped."""
    low, high = human_seconds(entry.step_full_overlap), human_seconds(entry.step_no_overlap)
    bounds = high if low == high else f"{low}–{high}"
    return f"≈{human_seconds(entry.step_expected)} ({bounds})"


def prediction_text(entry: Ranked) -> str:
    """ "predicted ≈1.20 s before compiling (-4% from the compiled estimate)" for a compiled row."""
    predicted = entry.predicted_step
    if predicted is None:
        return ""
    off = f" ({predicted / entry.step_expected - 1:+.0%} from the compiled estimate)" if entry.step_expected else ""
    return f"predicted ≈{human_seconds(predicted)} before compiling{off}"


def hbm_text(entry: Ranked) -> str:
    return f"{compact_bytes(entry.hbm_need)}{'' if entry.hbm_exact else '~'}"


def advice_renderable(advice: Advice, top: int) -> Group:
    """The headline, the counts, the top `top` plans that fit, and how to reproduce each."""
    shown = advice.ranking[:top]

    def build(width: int) -> Table:
        mesh = max(len(_mesh(e)) for e in shown)
        preset = max(len(e.candidate.preset_label) for e in shown)
        fixed = {"#": 3, "step": 26, "comm": 8, "compute": 8, "HBM": 9, "from": 9}
        # Preset and mesh share what is left, each unfolded when it fits (why is said below the table).
        left = max(20, width - sum(fixed.values()) - 3 * 8 + 1)
        preset = min(preset, max(8, left // 3))
        widths = fixed | {"preset": preset, "mesh": max(10, min(mesh, left - preset - 3))}
        table = Table(show_edge=False, title_justify="left")
        for name in ("#", "preset", "mesh", "step", "comm", "compute", "HBM", "from"):
            right = name in ("#", "step", "comm", "compute", "HBM")
            table.add_column(name, width=widths[name], overflow="fold", justify="right" if right else "left")
        for entry in shown:
            style = "bold green" if entry.rank == 1 else ""
            table.add_row(
                Text(str(entry.rank), style),
                Text(entry.candidate.preset_label, style),
                Text(_mesh(entry)),
                Text(step_text(entry), style),
                human_seconds(entry.communication),
                human_seconds(entry.compute),
                hbm_text(entry),
                Text(entry.source, "" if entry.source == "compiled" else "cyan"),
            )
        return table

    parts: list[Any] = [Text(headline(advice), "bold"), Text(counts_line(advice))]
    if shown:
        parts.append(FitToWidth(build))
        parts.append(
            Text(
                "step: ≈ expected (ranked by it), then the bounds: communication fully hidden – nothing hidden; all "
                "estimates; comm, compute: per device per step; HBM need per device (~ estimated from the tensors); "
                "from: a compiled plan's figures, or a prediction's (placement only, no compile)",
                "dim",
            )
        )
        for entry in shown:
            parts.append(Text(f"#{entry.rank} {entry.reason}"))
            if entry.source == "compiled" and entry.predicted_step is not None:
                parts.append(Text(f"   {prediction_text(entry)}", "dim"))
            if entry.same_program:
                parts.append(Text(f"   the same compiled program under {', '.join(entry.same_program)}"))
            parts.append(Text(f"   {entry.command}", "dim"))
    else:
        parts.append(Text("no candidate fits in HBM", "bold red"))
    if advice.over_capacity:
        nearest = advice.over_capacity[0]
        parts.append(
            Text(
                f"{len(advice.over_capacity)} plans do not fit; nearest: {nearest.candidate.key} ({nearest.source}) "
                f"needs {human_bytes(nearest.hbm_need)} of {human_bytes(nearest.hbm_capacity)}",
                "yellow",
            )
        )
    for candidate, error in advice.failed[:3]:
        parts.append(Text(f"refused: {candidate.key}: {error}", "yellow"))
    if len(advice.failed) > 3:
        parts.append(Text(f"… and {len(advice.failed) - 3} more refused (see --json)", "yellow"))
    return Group(*parts)


def _mesh(entry: Ranked) -> str:
    """The axes that split devices ("fsdp=4,expert=2")."""
    return entry.candidate.mesh_label.split(" (+")[0]


def _entry_view(entry: Ranked) -> dict[str, Any]:
    dominant = entry.dominant
    return {
        "rank": entry.rank,
        "key": entry.candidate.key,
        "preset": entry.candidate.preset_label,
        "mesh": _mesh(entry),
        "step": step_text(entry),
        "communication": human_seconds(entry.communication),
        "compute": human_seconds(entry.compute),
        "compute_bound": entry.compute_bound,
        "hbm": human_bytes(entry.hbm_need) + ("" if entry.hbm_exact else " (estimated)"),
        "dominant": f"{dominant[1]} over {dominant[0]}" if dominant else "none",
        "reason": entry.reason,
        "same_program": ", ".join(entry.same_program),
        "command": entry.command,
        "source": entry.source,
        "prediction": prediction_text(entry) if entry.source == "compiled" else "",
    }


def _picture_label(entry: Ranked) -> str:
    """ "#1 fsdp=8" — short enough for the picture's label column (the table says the rest)."""
    label = f"#{entry.rank} {_mesh(entry)}"
    return label if len(label) <= 24 else label[:23] + "…"


def _time_picture(entries: Sequence[Ranked]) -> str:

    rows = [(_picture_label(e), (("compute", e.compute), ("communication", e.communication))) for e in entries]
    return stacked_bars(rows, human_seconds, width=640)


def _memory_picture(entries: Sequence[Ranked]) -> str:

    sides = [(_picture_label(e), (("HBM need", e.hbm_need),)) for e in entries]
    capacity = entries[0].hbm_capacity if entries else 0
    return stacked_against_capacity(sides, capacity, lambda v: human_bytes(int(v)), width=640)


def render_advice_html(advice: Advice, top: int) -> str:
    """The search as one HTML page: headline, counts, the ranked table, its pictures, the plans over HBM."""

    shown = advice.ranking[:top]
    template = environment().get_template("advise.html.j2")
    return template.render(
        headline=headline(advice),
        counts=counts_line(advice),
        rows=[_entry_view(e) for e in shown],
        over=[_entry_view(e) | {"reason": e.reason} for e in advice.over_capacity[:top]],
        more_over=max(0, len(advice.over_capacity) - top),
        failed=[(c.key, e) for c, e in advice.failed],
        pruned=[(s.candidate.key, s.verdict, s.reason) for s in advice.pruned[:50]],
        more_pruned=max(0, len(advice.pruned) - 50),
        time_svg=_time_picture(shown) if shown else "",
        memory_svg=_memory_picture(shown) if shown else "",
        title=f"{advice.request.model} on {advice.request.topology}",
    )
