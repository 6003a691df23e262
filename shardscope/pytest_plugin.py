"""pytest integration: golden plans as tests, for shardscope's own matrix and for any project's functions.

Installed as a pytest plugin (entry point `shardscope`). A failing golden prints the change table, not a
checksum; `pytest --shardscope-update` rewrites the goldens instead of failing. A missing golden fails
and says how to create it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds --shardscope-update."""
    group = parser.getgroup("shardscope")
    group.addoption(
        "--shardscope-update",
        action="store_true",
        default=False,
        help="Rewrite shardscope golden plans instead of failing on a difference.",
    )


@dataclass(frozen=True)
class GoldenChecker:
    """Compares plans with golden files (or rewrites them under --shardscope-update)."""

    update: bool

    def check_plan(self, plan: Any, path: Path) -> None:
        """Fails the test with the change table when `plan` differs from the golden at `path`."""
        from shardscope.diff.plans import diff_plans  # lazy: the plugin loads with every pytest run
        from shardscope.golden.store import load_golden, write_golden

        if self.update:
            write_golden(path, plan)
            return
        if not path.exists():
            pytest.fail(
                f"golden {path} is missing: create it with `pytest --shardscope-update` (or `shardscope update`)",
                pytrace=False,
            )
        diff = diff_plans(load_golden(path), plan)
        if not diff.same:
            pytest.fail(f"plan differs from golden {path}:\n{diff_text(diff)}", pytrace=False)

    def check_compiled(self, compiled: Any, mesh: Any, path: Path, name: str | None = None) -> None:
        """Golden-checks any compiled JAX function (`jax.jit(f).lower(...).compile()`) on its mesh."""
        from shardscope.extract.plans import plan_from_compiled  # lazy: the plugin loads with every pytest run

        self.check_plan(plan_from_compiled(compiled, mesh, name or path.stem), path)

    def check_step(self, step: Any, path: Path, topology: str = "cpu-8", name: str | None = None) -> None:
        """Golden-checks a program of one's own: `step` is a `make_step` function or its "module:function"
        name (the protocol of `shardscope dump --step`), planned on `topology`'s devices."""
        from shardscope.case.topology import get_topology  # lazy: the plugin loads with every pytest run
        from shardscope.golden.pipeline import plan_step_function, plan_step_ref
        from shardscope.stages.user_step import parse_step_ref

        target = get_topology(topology)
        if isinstance(step, str):
            plan = plan_step_ref(parse_step_ref(step), target, name or path.stem)
        else:
            plan = plan_step_function(step, target, name or path.stem)
        self.check_plan(plan, path)


def diff_text(diff: Any) -> str:
    """The terminal change table as plain text."""
    from rich.console import Console  # lazy: rich loads only when a table is printed

    from shardscope.report.diff_terminal import diff_renderable

    buffer = io.StringIO()
    Console(file=buffer, width=140, color_system=None).print(diff_renderable(diff))
    return buffer.getvalue()


@pytest.fixture
def shardscope_golden(request: pytest.FixtureRequest) -> GoldenChecker:
    """A GoldenChecker honouring --shardscope-update."""
    return GoldenChecker(update=bool(request.config.getoption("--shardscope-update")))
