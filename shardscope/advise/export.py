"""An `Advice` as plain data: JSON (the whole search) and a CSV table (one row per priced candidate; its
`source` says whether the figures are a compiled plan's or a prediction's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardscope.advise.prune import INDIVISIBLE, INVALID, MEMORY
from shardscope.advise.rank import Ranked, compiled_candidates

if TYPE_CHECKING:
    from shardscope.advise.advice import Advice

# The columns of the CSV, in order (seconds and bytes per device per step).
CSV_COLUMNS = (
    "rank",
    "preset",
    "mesh",
    "source",
    "fits",
    "step_expected_s",
    "predicted_step_s",
    "step_no_overlap_s",
    "step_full_overlap_s",
    "communication_s",
    "compute_s",
    "compute_bound",
    "hbm_need_bytes",
    "hbm_capacity_bytes",
    "hbm_exact",
    "dominant_axes",
    "dominant_op",
    "dominant_s",
    "reason",
    "same_program",
    "command",
)


def ranked_row(entry: Ranked) -> dict[str, Any]:
    """One compiled candidate as a flat record (rank 0: does not fit)."""
    axes, op, seconds = entry.dominant or ("", "", 0.0)
    return {
        "rank": entry.rank,
        "preset": entry.candidate.preset_label,
        "mesh": entry.candidate.mesh_text,
        "source": entry.source,
        "fits": entry.fits,
        "step_expected_s": entry.step_expected,
        "predicted_step_s": entry.predicted_step,
        "step_no_overlap_s": entry.step_no_overlap,
        "step_full_overlap_s": entry.step_full_overlap,
        "communication_s": entry.communication,
        "compute_s": entry.compute,
        "compute_bound": entry.compute_bound,
        "hbm_need_bytes": entry.hbm_need,
        "hbm_capacity_bytes": entry.hbm_capacity,
        "hbm_exact": entry.hbm_exact,
        "dominant_axes": axes,
        "dominant_op": op,
        "dominant_s": seconds,
        "reason": entry.reason,
        "same_program": " ".join(entry.same_program),
        "command": entry.command,
    }


def counts(advice: Advice) -> dict[str, Any]:
    """How many candidates met which fate."""
    return {
        "enumerated": advice.enumerated,
        "pruned": {v: advice.pruned_by(v) for v in (INVALID, INDIVISIBLE, MEMORY)},
        "compiled": advice.compiled,
        "cached": advice.cached,
        "same_program": advice.same_program,
        "predicted": advice.predicted,
        "failed": len(advice.failed),
        "fit": len(advice.ranking),
        "over_capacity": len(advice.over_capacity),
    }


def advice_to_json(advice: Advice) -> dict[str, Any]:
    """The whole search: the request, the target, the counts, every compiled candidate, every pruned one."""
    request = advice.request
    return {
        "model": request.model,
        "topology": request.topology,
        "presets": list(request.presets),
        "pinned": dict(request.pinned),
        "settings": dict(request.overrides),
        "maxtext": request.maxtext,
        "target": advice.target,
        "hardware": advice.hardware,
        "efficiency": advice.efficiency,
        "counts": counts(advice),
        "wall_seconds": round(advice.seconds, 3),
        "predict_seconds": round(advice.predict_seconds, 3),
        "ranking": [ranked_row(e) for e in advice.ranking],
        "over_capacity": [ranked_row(e) for e in advice.over_capacity],
        "failed": [{"preset": c.preset_label, "mesh": c.mesh_text, "error": e} for c, e in advice.failed],
        "pruned": [
            {
                "preset": s.candidate.preset_label,
                "mesh": s.candidate.mesh_text,
                "verdict": s.verdict,
                "reason": s.reason,
            }
            for s in advice.pruned
        ],
    }


def advice_frame(advice: Advice):
    """Every compiled candidate, ranked ones first, as a pandas DataFrame (the CSV's columns)."""
    import pandas as pd  # lazy: pandas loads on first use

    return pd.DataFrame([ranked_row(e) for e in compiled_candidates(advice)], columns=list(CSV_COLUMNS))


def advice_to_csv(advice: Advice) -> str:
    """Every compiled candidate, ranked ones first, as CSV text."""
    return advice_frame(advice).to_csv(index=False, lineterminator="\n")
