"""Test setup: eight fake CPU devices for the whole session (before JAX's backend starts), and a
cache so each tiny case is compiled once per session."""

from __future__ import annotations

import os
import shutil
import tempfile

# The tests' plan cache is their own, never the user's (~/.cache/shardscope); each process of a run (every
# pytest-xdist worker imports this module) makes its own and removes it when it ends.
os.environ["SHARDSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="shardscope-test-cache-")
# pytest-xdist's workers set COLUMNS=80; the commands' piped output is 120 columns wide unless COLUMNS says
# otherwise, and the tests read it as a pipe does.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)

from shardscope.stages.compiler_log import prepare_compiler_log

# Before JAX starts: the compiler logs its warnings (captured while compiling, for the lints), and shows none.
prepare_compiler_log()

import jax  # noqa: E402
import pytest  # noqa: E402

from shardscope.case.presets import builtin_preset_names  # noqa: E402

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)
_CACHE_DIR = os.environ["SHARDSCOPE_CACHE_DIR"]


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


TINY_MODELS = ("deepseek-tiny", "mixtral-tiny")
# Every built-in preset (the seeds' and MaxText's rule files).
PRESETS = builtin_preset_names()


@pytest.fixture(scope="session")
def compile_cached():
    """Case → CompiledStep, each case compiled once per session."""
    from shardscope.stages.compile import compile_case

    cache: dict = {}

    def get(case):
        if case not in cache:
            cache[case] = compile_case(case)
        return cache[case]

    return get


@pytest.fixture(scope="session")
def compiled_cases(compile_cached):
    """(model, preset, **overrides) → CompiledStep of the tiny case on cpu-8."""
    from shardscope.case import resolve_case

    def get(model: str, preset: str, **overrides: str):
        return compile_cached(resolve_case(model, preset, overrides=overrides))

    return get


@pytest.fixture(scope="session")
def plan_of(compile_cached):
    """Case → Plan (compiled once, extracted once)."""
    from shardscope.extract.plans import extract_plan

    cache: dict = {}

    def get(case):
        if case not in cache:
            step = compile_cached(case)
            cache[case] = extract_plan(step, step.compiled.as_text())
        return cache[case]

    return get


@pytest.fixture(scope="session")
def tiny_plans(plan_of):
    """(model, preset) → Plan of the tiny case on cpu-8."""
    from shardscope.case import resolve_case

    return lambda model, preset: plan_of(resolve_case(model, preset))


@pytest.fixture(scope="session")
def tiny_plans_with(plan_of):
    """(model, preset, **settings) → Plan of the tiny case on cpu-8 with `--set` overrides."""
    from shardscope.case import resolve_case

    return lambda model, preset, **settings: plan_of(resolve_case(model, preset, overrides=settings))


@pytest.fixture(scope="session")
def plan_for_golden_case(plan_of):
    """GoldenCase → Plan, sharing compiles with every other test."""
    from shardscope.golden.worker import resolve_golden_case

    return lambda case: plan_of(resolve_golden_case(case))
