"""`check` and `update` as data: per golden case, what was found (no printing here)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardscope.case.maxtext_model import INSTALL_HINT as MAXTEXT_INSTALL_HINT
from shardscope.case.topology import needs_libtpu
from shardscope.case.tpu import TPU_EXTRA_HINT, libtpu_version
from shardscope.diff.changes import PlanDiff
from shardscope.diff.json import diff_to_json
from shardscope.diff.plans import diff_plans
from shardscope.errors import PlanError
from shardscope.golden.cases import GoldenCase
from shardscope.golden.runner import dump_cases
from shardscope.golden.store import golden_path, load_golden, orphan_goldens, read_golden_text, write_golden
from shardscope.golden.verifying import Verification
from shardscope.golden.worker import DumpResult, resolve_golden_case
from shardscope.plan.json import plan_from_json
from shardscope.verify.records import VerifyReport, report_to_json

# Called once per finished case (the CLI advances its progress bar).
Progress = Callable[[DumpResult], None]


@dataclass(frozen=True)
class CaseOutcome:
    """The verdict for one golden case (or one orphaned golden file)."""

    case_id: str
    # "same", "changed", "missing", "orphan", "error", "skipped", "created", "updated", "unchanged"; a case's
    # `verify:` is an outcome of its own, "verified" or "diverged" (or "error").
    status: str
    path: Path
    diff: PlanDiff | None = None
    message: str = ""
    verify: VerifyReport | None = None


def outcome_to_json(outcome: CaseOutcome) -> dict[str, Any]:
    """One outcome as plain data: case, status, golden path, message, and the diff when there is one."""

    return {
        "case": outcome.case_id,
        "status": outcome.status,
        "golden": str(outcome.path),
        "message": outcome.message,
        "diff": diff_to_json(outcome.diff) if outcome.diff is not None and not outcome.diff.same else None,
        "verify": json.loads(report_to_json(outcome.verify)) if outcome.verify is not None else None,
    }


def _failed(result: DumpResult, path: Path) -> CaseOutcome:
    """The outcome of a case that could not be planned (its one-line reason kept)."""
    return CaseOutcome(result.case.case_id, "error", path, message=result.error or "")


def _no_progress(_: DumpResult) -> None:
    return None


def plannable_here(cases: Sequence[GoldenCase], root: Path) -> tuple[list[GoldenCase], list[CaseOutcome]]:
    """Cases this machine can plan, and a "skipped" outcome for each TPU case when libtpu is missing and each
    `maxtext:` case of the installed MaxText when MaxText is not importable.

    A golden set with one TPU case must still be checkable on a machine without the TPU extra: the other
    cases are checked, and the TPU ones are named with how to install what they need (likewise MaxText).
    """
    has_libtpu, has_maxtext = libtpu_version() is not None, importlib.util.find_spec("maxtext") is not None
    runnable, skipped = [], []
    for case in cases:
        if not has_libtpu and needs_libtpu(case.topology):
            message = f"needs libtpu to compile for {case.topology}: {TPU_EXTRA_HINT}"
        elif not has_maxtext and case.is_maxtext and not case.maxtext_path:
            message = f"needs MaxText to plan {case.model}: {MAXTEXT_INSTALL_HINT}"
        else:
            runnable.append(case)
            continue
        skipped.append(CaseOutcome(case.case_id, "skipped", golden_path(root, case), message=message))
    return runnable, skipped


def check_goldens(
    root: Path,
    cases: Sequence[GoldenCase],
    jobs: int,
    progress: Progress = _no_progress,
    use_cache: bool = True,
    ray: str | None = None,
    whole_set: Sequence[GoldenCase] | None = None,
    report_orphans: bool = True,
) -> tuple[CaseOutcome, ...]:
    """Re-dumps every case that has a golden and diffs it; missing and orphaned goldens are outcomes too.

    `cases` may be a shard of `whole_set` (default: `cases` are the whole set); orphans are goldens no case
    of the whole set owns, reported only with `report_orphans` (by one shard, so each is reported once).

    Raises:
      ShardscopeError: a case names an unknown model/preset/topology or a mesh that does not fit.
      PlanError: a golden is corrupt or of a newer schema (both checked before anything compiles).
    """
    runnable, skipped = plannable_here(cases, root)
    for case in runnable:
        resolve_golden_case(case)  # a wrong name fails the whole check before anything compiles
    outcomes: list[CaseOutcome] = list(skipped)
    present: list[GoldenCase] = []
    goldens: dict[str, str] = {}
    for case in runnable:
        path = golden_path(root, case)
        if not path.exists():
            outcomes.append(
                CaseOutcome(case.case_id, "missing", path, message=f"create it: shardscope update {case.case_id}")
            )
            continue
        goldens[case.case_id] = read_golden_text(path)
        present.append(case)
    for path in orphan_goldens(root, whole_set or cases) if report_orphans else ():
        outcomes.append(
            CaseOutcome(
                str(path.relative_to(root)), "orphan", path, message=f"no case in cases.yaml owns it: delete {path}"
            )
        )
    for result in dump_cases(present, jobs, use_cache, ray):
        progress(result)
        path = golden_path(root, result.case)
        if result.plan_json is None:
            outcomes.append(_failed(result, path))
            continue
        golden = goldens[result.case.case_id]
        if result.plan_json == golden:
            # Plans are canonical text: byte-identical means the same (no parse, no diff needed).
            outcomes.append(CaseOutcome(result.case.case_id, "same", path))
            continue
        diff = diff_plans(plan_from_json(golden, str(path)), plan_from_json(result.plan_json, result.case.case_id))
        outcomes.append(CaseOutcome(result.case.case_id, "same" if diff.same else "changed", path, diff))
    from shardscope.golden.verifying import verify_golden_cases  # lazy: loads JAX, only for `verify:` cases

    for verification in verify_golden_cases(runnable, whole_set or cases):
        outcomes.append(verification_outcome(verification, golden_path(root, verification.case)))
    return tuple(sorted(outcomes, key=lambda o: o.case_id))


def verification_outcome(verification: Verification, path: Path) -> CaseOutcome:
    """A case's `verify:` as a row of its own: verified, diverged (with the first diverging tensor), or error."""
    case_id = f"{verification.case.case_id} verify {verification.case.verify}"
    report = verification.report
    if report is None:
        return CaseOutcome(case_id, "error", path, message=verification.error or "")
    if report.same:
        return CaseOutcome(case_id, "verified", path, message=f"{report.checked} tensor checks", verify=report)
    first = report.divergences[0].check
    message = (
        f"{len(report.divergences)} of {report.checked} tensor checks diverged, first {first.tensor} at step "
        f"{first.step} (max rel error {first.max_rel_error:.2g}); see where: {verification.command}"
    )
    return CaseOutcome(case_id, "diverged", path, message=message, verify=report)


def outcome_diff(outcome: CaseOutcome) -> PlanDiff | None:
    """The outcome's diff; for a golden reproduced byte for byte, the (empty) diff of the golden with itself."""
    if outcome.diff is not None or outcome.status != "same":
        return outcome.diff
    golden = load_golden(outcome.path)
    return diff_plans(golden, golden)


def report_diffs(outcomes: Sequence[CaseOutcome]) -> list[PlanDiff]:
    """The diffs a check's HTML report shows: every changed case, or with nothing changed every case
    reproduced (its empty diff), so that the report still says so case by case."""
    changed = [o.diff for o in outcomes if o.status == "changed" and o.diff is not None]
    same = [d for o in outcomes if o.status == "same" and (d := outcome_diff(o)) is not None]
    return changed or same


def update_goldens(
    root: Path,
    cases: Sequence[GoldenCase],
    jobs: int,
    progress: Progress = _no_progress,
    use_cache: bool = True,
    ray: str | None = None,
) -> tuple[CaseOutcome, ...]:
    """Re-dumps the cases and writes their goldens atomically; says which were created or changed."""
    cases, skipped = plannable_here(cases, root)
    outcomes = list(skipped)
    for result in dump_cases(cases, jobs, use_cache, ray):
        progress(result)
        path = golden_path(root, result.case)
        if result.plan_json is None:
            outcomes.append(_failed(result, path))
            continue
        new = plan_from_json(result.plan_json, result.case.case_id)
        try:
            old = load_golden(path) if path.exists() else None
        except PlanError:
            old = None  # a corrupt golden is exactly what update repairs
        diff = diff_plans(old, new) if old is not None else None
        if diff is not None and diff.same and path.read_text(encoding="utf-8") == result.plan_json:
            outcomes.append(CaseOutcome(result.case.case_id, "unchanged", path, diff))
            continue
        write_golden(path, new)
        status = "created" if old is None else "updated"
        outcomes.append(CaseOutcome(result.case.case_id, status, path, diff))
    return tuple(sorted(outcomes, key=lambda o: o.case_id))


@dataclass(frozen=True)
class CheckSummary:
    """The closing words of a check: counts by status, and what to run next."""

    counts: tuple[tuple[str, int], ...]  # status → cases, in STATUS_ORDER
    line: str
    hints: tuple[str, ...]

    def count(self, status: str) -> int:
        return dict(self.counts).get(status, 0)

    def failed(self, require_all: bool) -> bool:
        """Whether the check fails: anything not the same, or with --require-all a case it could not run."""
        bad = sum(self.count(s) for s in ("changed", "missing", "orphan", "error", "diverged"))
        return bad > 0 or (require_all and self.count("skipped") > 0)


STATUS_ORDER = ("same", "changed", "missing", "orphan", "error", "skipped", "verified", "diverged")
# A case's `verify:` row: counted apart from the cases.
VERIFY_STATUSES = ("verified", "diverged")


def check_summary(outcomes: Sequence[CaseOutcome], root: Path) -> CheckSummary:
    """Counts the outcomes and says how to accept changes, create missing goldens, or run skipped cases."""
    counts = tuple((status, n) for status in STATUS_ORDER if (n := sum(o.status == status for o in outcomes)))
    verified = [(status, n) for status, n in counts if status in VERIFY_STATUSES]
    plans = [(status, n) for status, n in counts if status not in VERIFY_STATUSES]
    cases = sum(n for status, n in plans if status != "orphan")
    line = f"{cases} case{'' if cases == 1 else 's'}: " + ", ".join(f"{n} {status}" for status, n in plans)
    if verified:
        line += "; numerics: " + ", ".join(f"{n} {status}" for status, n in verified)
    golden = "" if root == Path("golden") else f" --golden {root}"
    hints = []
    to_update = [o.case_id for o in outcomes if o.status in ("changed", "missing")]
    if to_update:
        hints.append(f"to accept the changes: shardscope update{golden} {' '.join(to_update)}")
    orphans = [str(o.path) for o in outcomes if o.status == "orphan"]
    if orphans:
        hints.append(f"no case owns {', '.join(orphans)}: delete it or add its case to cases.yaml")
    if any(o.status == "skipped" for o in outcomes):
        hints.append(f"skipped cases compile for TPU, which needs libtpu: {TPU_EXTRA_HINT}")

    return CheckSummary(counts=counts, line=line, hints=tuple(hints))
