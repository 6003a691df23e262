"""`advise`'s prediction held to the compiler on one real case: DeepSeek2-16B on v5p-128, every built-in
preset.

`advise --predict-only` ranks every mesh of every preset that fits by a predicted step (tensors placed, no
compile). This study compiles, on the TPU route, the predicted top five and three candidates of each kind
of mesh (FSDP only, FSDP with expert parallelism, context, tensor, pipeline: the best, the median and the
worst of each kind by prediction), and sets the compiled plans' expected steps beside the predicted ones:

- the rank correlation (Spearman) of predicted against compiled expected steps;
- the regret of the predicted pick: its compiled step over the best compiled step;
- each candidate's prediction error, by kind of mesh (where the prediction is blind).

The compiled plans are kept in `benchmarks/plans/advise/` (minutes each to compile, milliseconds to price),
with the chosen candidates and the ranking's counts in `benchmarks/plans/advise/chosen.json` (`--rank`
re-ranks: the prediction is deterministic, so it chooses the same candidates until the prediction changes).

  python benchmarks/advise_study.py --rank        # run advise --predict-only and keep its ranking
  python benchmarks/advise_study.py --compile     # compile the chosen candidates not compiled yet
  python benchmarks/advise_study.py               # the comparison (Markdown)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent
STUDY = ROOT / "plans" / "advise"
CHOSEN = STUDY / "chosen.json"
MODEL, TOPOLOGY = "deepseek2-16b", "v5p-128"
TOP = 5  # the predicted top five programs (twin meshes with the same prediction count once) ...
TWINS = 3  # ... and up to three twins of the pick: equal predictions, different meshes (Ulysses or not)
PER_KIND = 3
CONTEXT_AXES = ("context", "context_usp_ulysses", "context_autoregressive")
TENSOR_AXES = ("tensor", "tensor_sequence", "tensor_transpose")


@dataclass(frozen=True)
class Candidate:
    """One ranked plan of the prediction."""

    rank: int
    preset: str
    mesh: str
    predicted: float
    command: str

    @property
    def axes(self) -> dict[str, int]:
        return {name: int(size) for name, size in (part.split("=") for part in self.mesh.split(","))}

    @property
    def kind(self) -> str:
        """What splits the step: pipeline, context, tensor, FSDP with experts, or FSDP alone."""
        axes = self.axes
        if axes.get("stage", 1) > 1:
            return "pipeline"
        if any(axes.get(a, 1) > 1 for a in CONTEXT_AXES):
            return "context"
        if any(axes.get(a, 1) > 1 for a in TENSOR_AXES):
            return "tensor"
        if axes.get("expert", 1) > 1:
            return "fsdp+expert"
        return "fsdp"

    @property
    def name(self) -> str:
        return f"{self.preset}__{self.mesh.replace(',', '_').replace('=', '')}"

    @property
    def plan_path(self) -> Path:
        return STUDY / f"{self.name}.tpu.json"


def ranked_by_advise() -> tuple[dict[str, object], list[Candidate]]:
    """advise --predict-only's counts and ranking (every built-in preset: advise searches them all)."""
    command = ["shardscope", "advise", MODEL, "--topology", TOPOLOGY, "--predict-only", "--json", "--top", "100000"]
    data = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    ranked = [
        Candidate(r["rank"], r["preset"], r["mesh"], r["step_expected_s"], r["command"])
        for r in data["ranking"]
        if r["source"] == "predicted"
    ]
    return data["counts"], ranked


def choose(ranked: list[Candidate]) -> list[Candidate]:
    """The predicted top five (told apart by program), the pick's twins, then the best, median and worst of
    each kind of mesh."""
    picks: list[Candidate] = []
    seen_steps: set[float] = set()
    for candidate in ranked:
        if len(seen_steps) == TOP:
            break
        if round(candidate.predicted, 6) not in seen_steps:
            seen_steps.add(round(candidate.predicted, 6))
            picks.append(candidate)
    twins = [c for c in ranked[1:] if round(c.predicted, 6) == round(ranked[0].predicted, 6)]
    picks += twins[:TWINS]
    for kind in ("fsdp", "fsdp+expert", "context", "tensor", "pipeline"):
        theirs = [c for c in ranked if c.kind == kind]
        for index in sorted({0, len(theirs) // 2, len(theirs) - 1})[:PER_KIND] if theirs else []:
            if theirs[index] not in picks:
                picks.append(theirs[index])
    return sorted(picks, key=lambda c: c.rank)


def rank() -> int:
    counts, ranked = ranked_by_advise()
    STUDY.mkdir(parents=True, exist_ok=True)
    record = {
        "model": MODEL,
        "topology": TOPOLOGY,
        "counts": counts,
        "ranked": len(ranked),
        "chosen": [dataclasses.asdict(c) for c in choose(ranked)],
    }
    CHOSEN.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


def chosen() -> tuple[int, list[Candidate]]:
    """(how many plans the prediction ranked, the chosen candidates)."""
    record = json.loads(CHOSEN.read_text())
    return record["ranked"], [Candidate(**c) for c in record["chosen"]]


def compile_order(candidates: list[Candidate]) -> list[Candidate]:
    """The pick first, then round by round one of each kind (its best, then its median, then its worst), the
    rest of the top last: a study cut short still spans every kind."""
    kinds = ("fsdp", "fsdp+expert", "tensor", "pipeline", "context")
    by_kind = {kind: [c for c in candidates[1:] if c.kind == kind] for kind in kinds}
    ordered = candidates[:1]
    while any(by_kind.values()):
        for kind in kinds:
            if by_kind[kind]:
                ordered.append(by_kind[kind].pop(0))
    return ordered


def compile_missing() -> int:
    for candidate in compile_order(chosen()[1]):
        if candidate.plan_path.exists():
            continue
        print(f"compiling #{candidate.rank} {candidate.preset} {candidate.mesh}", flush=True)
        words = candidate.command.split()[1:]  # "shardscope dump …"
        done = subprocess.run(["shardscope", *words, "-o", str(candidate.plan_path)], check=False)
        if done.returncode != 0:
            print(f"  not compiled (exit {done.returncode})", flush=True)
    return 0


def compiled_step(candidate: Candidate) -> float | None:
    import shardscope
    from shardscope.cost.price import price_plan

    if not candidate.plan_path.exists():
        return None
    estimate = price_plan(shardscope.load_plan(candidate.plan_path)).estimate
    return None if estimate is None else estimate.expected


def report() -> str:
    ranked, candidates = chosen()
    rows = []
    for candidate in candidates:
        rows.append(
            {
                "predicted rank": candidate.rank,
                "kind": candidate.kind,
                "preset": candidate.preset,
                "mesh": ",".join(f"{k}={v}" for k, v in candidate.axes.items() if v > 1) or "(one device per axis)",
                "predicted": candidate.predicted,
                "compiled": compiled_step(candidate),
            }
        )
    frame = pd.DataFrame(rows)
    done = frame.dropna(subset=["compiled"])
    lines = [
        f"`advise {MODEL} --topology {TOPOLOGY} --predict-only` over every built-in preset: {ranked} plans that",
        f"fit, ranked by predicted step; {len(frame)} chosen, {len(done)} compiled on the TPU route. Every step is",
        "an estimate (the prediction's from placement alone, the compiled one's from the TPU compile).",
        "",
    ]
    if len(done) >= 2:
        rho = done["predicted"].rank().corr(done["compiled"].rank())
        pick = done.sort_values(["predicted", "predicted rank"]).iloc[0]
        best = done.sort_values("compiled").iloc[0]
        regret = pick["compiled"] / best["compiled"] - 1
        lines += [
            f"- Rank correlation (Spearman), predicted against compiled: {rho:.2f} over {len(done)} plans",
            f"- The predicted pick (#{pick['predicted rank']}, {pick['preset']} {pick['mesh']}) compiles to "
            f"{pick['compiled']:.2f} s; the best compiled is #{best['predicted rank']} ({best['preset']} "
            f"{best['mesh']}) at {best['compiled']:.2f} s: regret {100 * regret:+.1f}%",
        ]
        for kind, group in done.groupby("kind", sort=True):
            errors = group["predicted"] / group["compiled"] - 1
            lines.append(
                f"- {kind}: prediction error {100 * errors.min():+.1f}% to {100 * errors.max():+.1f}% over {len(group)}"
            )
    header = "| predicted rank | kind | preset | mesh | predicted | compiled | error |"
    lines += ["", header, "|---|---|---|---|---|---|---|"]
    for row in rows:
        compiled = row["compiled"]
        error = "–" if compiled is None else f"{100 * (row['predicted'] / compiled - 1):+.1f}%"
        shown = "not compiled" if compiled is None else f"{compiled:.2f} s"
        lines.append(
            f"| {row['predicted rank']} | {row['kind']} | {row['preset']} | {row['mesh']} | "
            f"{row['predicted']:.2f} s | {shown} | {error} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", action="store_true", help="run advise --predict-only and keep its ranking")
    parser.add_argument("--compile", action="store_true", help="compile the chosen candidates not compiled yet")
    args = parser.parse_args(argv)
    if args.rank:
        return rank()
    if args.compile:
        return compile_missing()
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
