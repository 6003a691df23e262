"""The golden store: where each guarded case's plan lives, and reading and writing it safely.

One plan per case at `<model>/<topology>/<name>.json` of the golden directory, where name is the preset or
an explicit variant name. Only this package touches the golden directory; writes are atomic, reads check
the schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from shardscope.atomic import write_atomic
from shardscope.errors import PlanError
from shardscope.golden.cases import GoldenCase
from shardscope.plan.document import Plan
from shardscope.plan.json import check_schema, load_plan, plan_to_json


def golden_path(root: Path, case: GoldenCase) -> Path:
    """The one place a case's golden path is computed (CLI, tests and pytest plugin use it)."""
    return root / case.folder / case.topology / f"{case.stem}.json"


def load_golden(path: Path) -> Plan:
    """Reads a golden plan.

    Raises:
      PlanError: missing, corrupt, or written by a newer shardscope.
    """
    return load_plan(path, what="golden")


def read_golden_text(path: Path) -> str:
    """A golden's canonical JSON text, checked to be a plan this version reads (not parsed into records).

    Raises:
      PlanError: missing, unreadable, invalid JSON, or of a newer schema.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"golden file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PlanError(f"cannot read golden file {path} ({err})") from None
    try:
        check_schema(json.loads(text), str(path))
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: corrupt plan (invalid JSON at line {err.lineno}: {err.msg})") from None
    return text


def write_golden(path: Path, plan: Plan) -> None:
    """Writes a golden atomically: a reader or a killed writer sees the old file or the new one."""
    write_atomic(path, plan_to_json(plan))


def orphan_goldens(root: Path, cases: Sequence[GoldenCase]) -> tuple[Path, ...]:
    """Plan files in the golden directory that no case of the manifest owns."""
    owned = {golden_path(root, case) for case in cases}
    # maxtext:NAME cases live one folder deeper (maxtext/NAME/…).
    found = [*root.glob("*/*/*.json"), *root.glob("maxtext/*/*/*.json")]
    return tuple(sorted(p for p in found if p not in owned))
