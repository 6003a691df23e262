"""pytest integration: golden plans as tests, for shardscope's own matrix and for any project's functions.

Installed as a pytest plugin (entry point `shardscope`). A failing golden prints the change table, not a
checksum; `pytest --shardscope-update` rewrites the goldens instead of failing. A missing golden fails
and says how to create it. `shardscope_golden.check_case(model, path, …)` guards a case as `shardscope dump`
plans it, MaxText's own programs (`maxtext:NAME`) included. `shardscope_golden.verify_step(make_step)` checks
a program's numbers instead: on the topology's devices against one device.

When asked, before any test file or conftest imports JAX, the plugin gives it a pool of fake CPU devices to
build meshes on: `--shardscope-devices N` (or `shardscope_devices = N` in the ini file) sets
`XLA_FLAGS=--xla_force_host_platform_device_count=N`, added to any other XLA flags, and `JAX_PLATFORMS=cpu`
unless JAX_PLATFORMS is set (an installed libtpu would otherwise make JAX look for TPU chips first). Not asked
(or 0), it leaves JAX alone: the plugin loads in every pytest run of an environment that has shardscope, and
a GPU or TPU project's own tests must keep their devices.
"""

from __future__ import annotations

import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_COUNT_FLAG = "--xla_force_host_platform_device_count"
_DEVICES_SET = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds --shardscope-update and --shardscope-devices (and the `shardscope_devices` ini option)."""
    group = parser.getgroup("shardscope")
    group.addoption(
        "--shardscope-update",
        action="store_true",
        default=False,
        help="Rewrite shardscope golden plans instead of failing on a difference.",
    )
    group.addoption(
        "--shardscope-devices",
        type=int,
        default=None,
        metavar="N",
        help=f"Fake CPU devices JAX starts with: XLA_FLAGS {_COUNT_FLAG}=N, and JAX_PLATFORMS=cpu unless it is "
        "set (default: the shardscope_devices ini value; neither, or 0: JAX's devices are left alone).",
    )
    parser.addini(
        "shardscope_devices",
        help="Fake CPU devices JAX starts with, as --shardscope-devices (unset or 0: JAX's devices untouched).",
        default="",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Sizes the device pool before conftest files (and the test files they import) load JAX."""
    set_up_devices(early_config)


def pytest_configure(config: pytest.Config) -> None:
    """Sizes the device pool when the plugin was registered too late for the early hook (`pytest_plugins`)."""
    set_up_devices(config)


def device_count(config: pytest.Config) -> int:
    """The fake CPU device count asked for: the option, else the ini value (0: none asked for)."""
    # The early hook runs before the full parse (only the options known by then are parsed), the late one after.
    given = getattr(config.option, "shardscope_devices", None)
    if given is None:
        given = getattr(config.known_args_namespace, "shardscope_devices", None)
    if given is None:
        text = str(config.getini("shardscope_devices")).strip()
        if text:
            try:
                given = int(text)
            except ValueError:
                raise pytest.UsageError(f"shardscope_devices must be a whole number, found {text!r}") from None
        else:
            return 0
    if given < 0:
        raise pytest.UsageError(f"--shardscope-devices must be 0 or more, found {given}")
    return given


def set_up_devices(config: pytest.Config) -> None:
    """Gives JAX `device_count` fake CPU devices (once per session) through the environment, which JAX reads
    when it starts; a JAX already imported is configured directly, unless its backend already runs."""
    if config.stash.get(_DEVICES_SET, False):
        return
    config.stash[_DEVICES_SET] = True
    count = device_count(config)
    if count == 0:
        return
    platforms_given = "JAX_PLATFORMS" in os.environ
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    others = re.sub(rf"{_COUNT_FLAG}=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
    os.environ["XLA_FLAGS"] = " ".join([*others, f"{_COUNT_FLAG}={count}"])
    if "jax" in sys.modules:
        # lazy: only a JAX some plugin already imported is configured here (its flags were read at import)
        from shardscope.stages.devices import configure_cpu_devices

        if platforms_given:
            _set_cpu_device_count(count)
        else:
            configure_cpu_devices(count)


def _set_cpu_device_count(count: int) -> None:
    import jax  # lazy: only when some plugin imported JAX before this one
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", count)


@dataclass(frozen=True)
class GoldenChecker:
    """Compares plans with golden files (or rewrites them under --shardscope-update)."""

    update: bool

    def check_plan(self, plan: Any, path: str | Path) -> None:
        """Fails the test with the change table when `plan` differs from the golden at `path`."""
        from shardscope.diff.plans import diff_plans  # lazy: the plugin loads with every pytest run
        from shardscope.golden.store import load_golden, write_golden

        path = Path(path)
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

    def check_compiled(self, compiled: Any, mesh: Any, path: str | Path, name: str | None = None) -> None:
        """Golden-checks any compiled JAX function (`jax.jit(f).lower(...).compile()`) on its mesh."""
        from shardscope.extract.plans import plan_from_compiled  # lazy: the plugin loads with every pytest run

        path = Path(path)
        self.check_plan(plan_from_compiled(compiled, mesh, name or path.stem), path)

    def check_step(self, step: Any, path: str | Path, topology: str = "cpu-8", name: str | None = None) -> None:
        """Golden-checks a program of one's own: `step` is a `make_step` function or its "module:function"
        name (the protocol of `shardscope dump --step`), planned on `topology`'s devices."""
        from shardscope.case.topology import get_topology  # lazy: the plugin loads with every pytest run
        from shardscope.golden.pipeline import plan_step_function, plan_step_ref
        from shardscope.stages.user_step import parse_step_ref

        path = Path(path)
        target = get_topology(topology)
        if isinstance(step, str):
            plan = plan_step_ref(parse_step_ref(step), target, name or path.stem)
        else:
            plan = plan_step_function(step, target, name or path.stem)
        self.check_plan(plan, path)

    def check_case(
        self,
        model: str,
        path: str | Path,
        *,
        preset: str = "default",
        topology: str = "cpu-8",
        mesh: str = "",
        settings: tuple[str, ...] = (),
        maxtext: str = "",
        maxtext_path: str | Path | None = None,
    ) -> None:
        """Golden-checks a case as `shardscope dump` plans and prices it: a reference model under a preset, or
        MaxText's own program (`maxtext:NAME`, configured by `maxtext`, MaxText's command line; planned in a
        child process with its own devices, so the test's devices do not matter). A case that cannot be
        planned fails the test with its one-line reason."""
        # lazy: the plugin loads with every pytest run
        from shardscope.golden.cases import MAXTEXT_PREFIX, GoldenCase
        from shardscope.golden.runner import priced
        from shardscope.golden.worker import dump_one
        from shardscope.plan.json import plan_from_json

        is_maxtext = model.startswith(MAXTEXT_PREFIX)
        if is_maxtext and (preset != "default" or mesh or settings):
            pytest.fail(f"{model} is configured by MaxText's command line alone: pass maxtext='k=v …'", pytrace=False)
        case = GoldenCase(
            model,
            "" if is_maxtext else preset,
            topology,
            mesh,
            tuple(settings),
            maxtext=maxtext,
            maxtext_path="" if maxtext_path is None else str(maxtext_path),
        )
        result = dump_one(case)
        if result.plan_json is None:
            pytest.fail(f"{case.case_id}: {result.error}", pytrace=False)
        self.check_plan(plan_from_json(priced(case, result.plan_json)), path)

    def verify_step(self, step: Any, topology: str = "cpu-8") -> Any:
        """Runs a program of one's own on `topology`'s devices and on one device and fails the test, with the
        divergences in the order the step computes them, unless its outputs agree within their tolerances
        (`shardscope verify --step`). `step` is a `make_step` function or its "module:function" name;
        returns the report."""
        # lazy: the plugin loads with every pytest run
        from shardscope.case.topology import get_topology
        from shardscope.report.verify import verify_lines
        from shardscope.stages.user_step import StepRef, load_step_function, parse_step_ref
        from shardscope.verify.steps import verify_step_function

        if isinstance(step, str):
            ref = parse_step_ref(step)
            function = load_step_function(ref)
        else:
            ref = StepRef(getattr(step, "__module__", "?"), getattr(step, "__name__", "make_step"))
            function = step
        report = verify_step_function(function, ref, get_topology(topology))
        if not report.same:
            pytest.fail("\n".join(verify_lines(report)), pytrace=False)
        return report


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
