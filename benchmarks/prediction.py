"""Predicted vs compiled collectives on the golden matrix: `python benchmarks/prediction.py [GOLDEN_DIR]`.

For every golden case with collectives, the tensors-only plan (the golden without what the compile added) is
given to `shardscope.predict`; per case and mesh-axis set, prints the compiled and predicted traffic per device
per step and the error, the share of compiled traffic whose causes the prediction names, and how many
predicted forward weight all-gathers match a compiled one. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from shardscope.golden.cases import DEFAULT_GOLDEN_DIR, load_manifest
from shardscope.golden.store import golden_path, load_golden
from shardscope.predict import predicted_plan
from shardscope.predict.measure import axes_errors, covered_share, gather_matches, tensors_only


def _kib(count: int) -> str:
    return f"{count / 1024:,.0f}"


def main(root: Path) -> None:
    """Prints the table and a summary of the absolute per-axis errors."""
    errors: list[float] = []
    print(f"{'case':42} {'axes':28} {'compiled KiB':>13} {'predicted KiB':>14} {'error':>8}")
    for case in load_manifest(root):
        path = golden_path(root, case)
        if not path.exists():
            continue
        golden = load_golden(path)
        if not golden.collectives:
            continue
        predicted = predicted_plan(tensors_only(golden))
        label = f"{case.model}/{case.topology}/{case.stem}"
        for row in axes_errors(golden, predicted):
            error = "—" if row.error is None else f"{row.error:+.1%}"
            if row.error is not None:
                errors.append(abs(row.error))
            print(f"{label:42} {'+'.join(row.axes):28} {_kib(row.compiled):>13} {_kib(row.predicted):>14} {error:>8}")
        matched, total = gather_matches(golden, predicted)
        print(
            f"{label:42} covered {covered_share(golden, predicted):.0%} of compiled traffic; "
            f"forward weight all-gathers matched {matched}/{total}"
        )
    if errors:
        print(
            f"per-axis |error| over {len(errors)} (case, axes) pairs: median {statistics.median(errors):.1%}, "
            f"worst {max(errors):.1%}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_GOLDEN_DIR)
