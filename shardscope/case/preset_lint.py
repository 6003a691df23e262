"""A preset's `lint` section: which lints it silences (wholly, or for subjects containing a text) and its
thresholds, parsed strictly (an unknown lint id or key is an error, with a "did you mean")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardscope.case.lints import LINT_IDS
from shardscope.errors import PresetError, ShardscopeError, unknown_name

LINT_KEYS = ("ignore", "max_replicated_bytes")
DEFAULT_MAX_REPLICATED_BYTES = 16 * 1024**2
_BYTE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


@dataclass(frozen=True, kw_only=True)
class LintSettings:
    """What `lint` checks under this preset: lints silenced (wholly, or for subjects containing a text), and
    thresholds."""

    ignore: tuple[str, ...] = ()
    # (lint id, text): that lint's findings whose subject contains the text are silenced.
    ignore_subjects: tuple[tuple[str, str], ...] = ()
    max_replicated_bytes: int = DEFAULT_MAX_REPLICATED_BYTES  # per device, for `large-replicated`


def preset_error(source: str, message: str) -> PresetError:
    """An error in a preset, naming where it came from."""
    return PresetError(f"preset {source}: {message}")


def parse_bytes(value: Any, where: str) -> int:
    """A byte count: an integer, or a number with a unit ("16 MiB", "1GB").

    Raises:
      ShardscopeError: anything else, or a negative count.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgib")
    unit = text[len(number) :]
    try:
        count = float(number) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        count = -1
    if count < 0 or isinstance(value, bool):
        raise ShardscopeError(f"{where}: expected a byte count such as 16777216 or '16 MiB', found {value!r}")
    return int(count)


def check_lint_id(lint_id: str, source: str, where: str) -> None:
    if lint_id not in LINT_IDS:
        raise preset_error(source, f"{where}: " + unknown_name("lint", lint_id, LINT_IDS).args[0])


def lint_ids(value: Any, source: str, where: str) -> tuple[str, ...]:
    """Lint ids to silence (a list, or comma-separated), each checked against the lint catalogue."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise preset_error(source, f"{where} must be a list of lint ids, found {value!r}")
    for lint_id in value:
        check_lint_id(lint_id, source, where)
    return tuple(dict.fromkeys(value))


def _ignore_entries(value: Any, source: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """`lint.ignore`: lint ids, and {id: ..., subject: ...} entries that silence one lint's findings on the
    subjects containing that text."""
    if not isinstance(value, list):
        raise preset_error(source, f"lint.ignore must be a list of lint ids, found {value!r}")
    ids: list[str] = []
    subjects: list[tuple[str, str]] = []
    for entry in value:
        if isinstance(entry, str):
            check_lint_id(entry, source, "lint.ignore")
            ids.append(entry)
            continue
        if (
            not isinstance(entry, dict)
            or set(entry) != {"id", "subject"}
            or not all(isinstance(v, str) and v for v in entry.values())
        ):
            raise preset_error(
                source,
                f"lint.ignore entries are lint ids or {{id: ID, subject: TEXT}} (silences the findings of lint ID "
                f"whose subject contains TEXT), found {entry!r}",
            )
        check_lint_id(entry["id"], source, "lint.ignore")
        subjects.append((entry["id"], entry["subject"]))
    return tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(subjects))


def parse_lint(value: Any, source: str) -> LintSettings:
    if value is None:
        return LintSettings()
    if not isinstance(value, dict):
        raise preset_error(source, f"lint must be a mapping with keys {', '.join(LINT_KEYS)}, found {value!r}")
    unknown = sorted(set(value) - set(LINT_KEYS))
    if unknown:
        raise preset_error(source, "lint: " + unknown_name("key", str(unknown[0]), LINT_KEYS).args[0])
    try:
        limit = parse_bytes(value.get("max_replicated_bytes", DEFAULT_MAX_REPLICATED_BYTES), "max_replicated_bytes")
    except ShardscopeError as err:
        raise preset_error(source, f"lint.{err}") from None
    ids, subjects = _ignore_entries(value.get("ignore", []), source)
    return LintSettings(ignore=ids, ignore_subjects=subjects, max_replicated_bytes=limit)
