"""The plan cache: a case whose every input is unchanged is not compiled again (`dump`, `check`, `update`).

A plan is a function of its case (model config, the preset's whole content, overrides, topology and mesh),
of shardscope's and the reference models' sources, of the versions of jax, jaxlib, flax, optax and libtpu,
and of the compiler options. The key is a digest of all of them, so an answer is never stale: change any
input and the key changes. Entries are canonical plan JSON under `~/.cache/shardscope/plans/` (or
`$SHARDSCOPE_CACHE_DIR`, or `$XDG_CACHE_HOME/shardscope`), written atomically, so concurrent runs read a
whole entry or none. Computing a key imports no JAX: a run whose cases all hit never starts a backend.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from shardscope.atomic import write_atomic
from shardscope.case.resolve import Case, compiler_options_for
from shardscope.plan.records import SCHEMA

# The directories whose sources make a plan: shardscope itself and the reference models.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = (_PACKAGE_ROOT, _PACKAGE_ROOT.parent / "reference_models")
SOURCE_SUFFIXES = (".py", ".yaml", ".yml")
# Sources that present, compare or guard plans but never make one (paths under the package): editing them
# keeps the cache valid. Plans are made by case/, stages/, extract/, hlo/, plan/, lint/ (findings), cost/
# (priced after the cache), golden/planning.py, golden/cache.py.
PRESENTATION = frozenset(
    {"report", "cli", "diff", "advise", "__init__.py", "tables.py", "pytest_plugin.py"}
    | {"golden/check.py", "golden/store.py", "golden/cases.py", "golden/runner.py", "golden/ray_pool.py"}
    | {"extract/maxtext_dump.py"}
)
VERSIONED = ("jax", "jaxlib", "flax", "optax", "libtpu", "numpy", "ml_dtypes")


def cache_dir() -> Path:
    """Where cached plans live: $SHARDSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/shardscope, else ~/.cache/shardscope."""
    explicit = os.environ.get("SHARDSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardscope"


def _presentation(root: Path, path: Path) -> bool:
    """Whether a source of shardscope's own only presents, compares or guards plans."""
    if root != _PACKAGE_ROOT:
        return False
    relative = path.relative_to(root)
    return relative.parts[0] in PRESENTATION or relative.as_posix() in PRESENTATION


def source_digest(roots: tuple[Path, ...] = SOURCE_ROOTS) -> str:
    """A digest of every source file under `roots` (names and contents), in a stable order."""
    # Read afresh every time (about 2 ms): a long-lived process must see an edit made after it started.
    digest = hashlib.sha256()
    for root in roots:
        if not root.is_dir():
            continue
        files = sorted(
            p
            for p in root.rglob("*")
            if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts and not _presentation(root, p)
        )
        for path in files:
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str | None]:
    """Versions of the packages a plan depends on (None: not installed), read without importing them."""
    versions: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def case_inputs(case: Case, tensors_only: bool) -> dict[str, Any]:
    """Everything a case's plan depends on, as plain data (the material of its key)."""
    return {
        "schema": SCHEMA,
        "tensors_only": tensors_only,
        "model": case.model_name,
        "model_config": _jsonable(case.model),
        "preset": _jsonable(case.preset),
        "topology": _jsonable(case.topology),
        "mesh": [list(axis) for axis in case.mesh],
        "overrides": [list(pair) for pair in case.overrides],
        "compiler_options": compiler_options_for(case),
        "sources": source_digest(),
        "versions": package_versions(),
        "python": list(sys.version_info[:2]),
        "machine": platform.machine(),
    }


def case_key(case: Case, tensors_only: bool = False) -> str:
    """The cache key of a case's plan: a digest of `case_inputs`."""
    material = json.dumps(case_inputs(case, tensors_only), sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def _entry(key: str, root: Path | None) -> Path:
    return (root or cache_dir()) / "plans" / key[:2] / f"{key}.json"


def load_cached(key: str, root: Path | None = None) -> str | None:
    """The cached plan JSON of `key`, or None (never cached, or unreadable: treated as a miss)."""
    try:
        return _entry(key, root).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def load_plan_text(key: str, root: Path | None = None) -> str | None:
    """The cached plan JSON of `key` if it is a whole plan document; anything else is a miss (and is
    overwritten). Entries are written atomically, so this only guards against files edited by hand."""
    text = load_cached(key, root)
    if text is None or not (
        text.startswith('{\n  "case"') and text.endswith("}\n") and f'"schema": "{SCHEMA}"' in text
    ):
        return None
    return text


def store(key: str, plan_json: str, root: Path | None = None) -> None:
    """Caches a plan (atomically). A cache that cannot be written is not an error: the plan stands."""
    try:
        write_atomic(_entry(key, root), plan_json)
    except OSError:
        return
