"""The records of a search: what was asked (`SweepRequest`), where it stands (`SweepProgress`), and what it
found (`Advice`: every candidate's fate and the ranking)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardscope.advise.export import advice_frame
from shardscope.advise.prune import COMPILE, Screening
from shardscope.advise.rank import Ranked
from shardscope.advise.space import Candidate

if TYPE_CHECKING:
    import pandas as pd

# The generation a CPU topology is priced on when the user names none (as the golden set's cases are).
DEFAULT_HARDWARE = "v5p"
# How many of the best predicted candidates `shardscope advise` compiles to confirm the prediction.
DEFAULT_CONFIRM = 3
# How far behind the predicted best a candidate may be and still be compiled: the prediction's step time
# is within 5% of the compiler's on dense published runs and 13–36% below it on MoE ones, with the same
# bias within one model (benchmarks/prediction.py), so a tenth keeps what the prediction's error could
# put first.
DEFAULT_MARGIN = 0.10


@dataclass(frozen=True)
class SweepRequest:
    """What to search: a model on a topology, over presets, priced on a generation."""

    model: str
    topology: str
    presets: tuple[str, ...]
    overrides: tuple[tuple[str, str], ...] = ()
    pinned: tuple[tuple[str, int], ...] = ()  # axes held at a size (`--mesh`); the others are searched
    hardware: str | None = None  # None: a TPU topology's own generation, else DEFAULT_HARDWARE
    efficiency: float | None = None
    exhaustive: bool = False  # compile every valid candidate, prune nothing (to audit the pruning)
    # Compile only the `confirm` best predicted candidates (and those within `margin` of the best); None:
    # compile every candidate screening passes. `predict_only`: compile nothing, rank by prediction.
    confirm: int | None = None
    margin: float = DEFAULT_MARGIN
    predict_only: bool = False
    maxtext: str = ""  # a `maxtext:` model's command line (its search is over its ici_* sizes)


@dataclass(frozen=True)
class SweepProgress:
    """Where a sweep stands: programs finished of those to compile (one per group of candidates that are one
    program), and the best that fits so far."""

    done: int
    total: int
    cached: int
    best: Ranked | None
    last: str  # the candidate just finished


@dataclass(frozen=True)
class Advice:
    """A finished search: every candidate's fate, and the ranking."""

    request: SweepRequest
    target: str  # "v5p 2x2x2 (cpu-8 plans priced as v5p)"
    hardware: str
    efficiency: float
    enumerated: int
    screenings: tuple[Screening, ...]  # one per candidate, in enumeration order
    ranking: tuple[Ranked, ...]  # candidates that fit, best first
    over_capacity: tuple[Ranked, ...]  # compiled, but over HBM
    failed: tuple[tuple[Candidate, str], ...]  # screened in, but the compile refused them
    compiled: int  # compiled in this run
    cached: int  # read from the plan cache
    seconds: float  # wall time
    same_program: int = 0  # screened in, but the same program as another candidate: its plan, not compiled
    predicted: int = 0  # candidates priced by prediction
    predict_seconds: float = 0.0  # wall time of predicting them all (before any compile)

    @property
    def pruned(self) -> tuple[Screening, ...]:
        return tuple(s for s in self.screenings if s.verdict != COMPILE)

    def pruned_by(self, verdict: str) -> int:
        return sum(s.verdict == verdict for s in self.screenings)

    def frame(self) -> pd.DataFrame:
        """Every compiled candidate, ranked ones first, as a pandas DataFrame (rank 0: over HBM)."""
        return advice_frame(self)
