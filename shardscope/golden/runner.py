"""Dumping many cases: validation up front, then compiles spread over worker processes (or a Ray cluster).

XLA compiles one program on roughly one core, so a matrix of cases finishes sooner on a pool of
processes, each of which starts JAX once with a device pool big enough for every case.

The processes are spawned (a forked child would inherit the parent's JAX threads), and Python's spawn start
method runs the caller's script again in each child, as `__mp_main__`, before the worker starts; it offers no
supported way to start a child without that. A script that starts workers from its top level would start
them again from each child, which Python refuses with a RuntimeError that breaks the pool: instead the child
ends with one line and the caller gets a ShardscopeError, both saying to put the call under
`if __name__ == "__main__":` (or to use one job).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool

from shardscope.case.maxtext_model import MaxTextCase
from shardscope.case.resolve import Case
from shardscope.cost.price import price_plan, target_for
from shardscope.errors import ShardscopeError
from shardscope.golden.cache import case_key, load_plan_text, store
from shardscope.golden.cases import GoldenCase
from shardscope.golden.ray_pool import compile_on_ray
from shardscope.golden.worker import (
    DumpResult,
    StepCase,
    dump_one,
    resolve_golden_case,
    start_pool_worker,
    start_worker,
)
from shardscope.interrupts import signals_held
from shardscope.plan.json import plan_from_json, plan_to_json


def priced(case: GoldenCase, plan_json: str) -> str:
    """A case's plan JSON with its `estimate` section (a TPU case, or one that names its hardware).

    The plan cache holds plans unpriced, so a change of hardware table or efficiency never needs a compile.
    """
    if case.hardware is None and target_for(case.topology, None) is None:
        return plan_json
    plan = plan_from_json(plan_json, case.case_id)
    return plan_to_json(price_plan(plan, case.hardware, case.efficiency))


def _expected_cost(case: Case | StepCase | MaxTextCase) -> float:
    """A rough relative compile cost, for scheduling only: layers traced, pipelines and TPU compiles."""
    if isinstance(case, MaxTextCase):
        return 50.0 if case.topology.platform == "tpu" else 10.0  # a child process importing MaxText
    if isinstance(case, StepCase):
        return 1.0
    cost = float(case.model.num_layers + case.model.first_dense_layers)
    if case.preset.pipeline is not None and case.mesh_sizes.get(case.preset.pipeline.stage_axis, 1) > 1:
        cost *= 4
    if case.topology.platform == "tpu":
        cost *= 2
    return cost


def default_jobs() -> int:
    """One worker per core."""
    return max(1, os.cpu_count() or 1)


def dump_cases(
    cases: Sequence[GoldenCase], jobs: int, use_cache: bool = True, ray: str | None = None
) -> Iterator[DumpResult]:
    """Plans every case, yielding results as they finish (in any order).

    Cases are validated first, so a wrong name or mesh fails before anything compiles. A case whose
    inputs are all unchanged comes from the plan cache (see `shardscope.cache`) without compiling; the
    rest are compiled — by `jobs` local processes, or on the Ray cluster at `ray` (`jobs` actors there,
    0: one per CPU of the cluster) — and cached as each finishes, so an interrupted run resumes where it
    stopped.
    """
    resolved: list[Case | StepCase | MaxTextCase] = [resolve_golden_case(case) for case in cases]
    # A program of one's own is never cached: its source is outside what the cache key can see.
    keys = [case_key(c) if use_cache and isinstance(c, Case) else None for c in resolved]
    pending: list[int] = []
    for index, key in enumerate(keys):
        cached = load_plan_text(key) if key is not None else None
        if cached is not None:
            yield DumpResult(cases[index], priced(cases[index], cached), cached=True)
        else:
            pending.append(index)
    for result in _compile_cases([cases[i] for i in pending], [resolved[i] for i in pending], jobs, ray):
        key = keys[cases.index(result.case)]
        if result.plan_json is None:
            yield result
            continue
        if key is not None:
            store(key, result.plan_json)
        yield DumpResult(result.case, priced(result.case, result.plan_json))


def _compile_cases(
    cases: Sequence[GoldenCase], resolved: Sequence[Case | StepCase | MaxTextCase], jobs: int, ray: str | None
) -> Iterator[DumpResult]:
    if not cases:
        return
    # A maxtext: case plans in a child process with its own devices (`golden.isolated`).
    devices = max(
        (c.topology.num_devices for c in resolved if c.topology.platform == "cpu" and not isinstance(c, MaxTextCase)),
        default=1,
    )
    # Longest first (pipelines, then DeepSeek, then the rest), so no long compile starts last.
    order = sorted(range(len(cases)), key=lambda i: -_expected_cost(resolved[i]))
    if ray is not None:
        yield from compile_on_ray(ray, [cases[i] for i in order], devices, jobs)
        return
    if jobs <= 1 or len(cases) == 1:
        start_worker(devices)
        for case in cases:
            yield dump_one(case)
        return
    yield from _compile_in_processes([cases[i] for i in order], devices, min(jobs, len(cases)))


def _compile_in_processes(cases: Sequence[GoldenCase], devices: int, workers: int) -> Iterator[DumpResult]:
    # "spawn": a forked child would inherit the parent's JAX state, if it has any.
    context = multiprocessing.get_context("spawn")
    started = context.Event()  # set by the first worker that gets past importing the caller's script
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=start_pool_worker, initargs=(devices, started)
    )
    with pool:
        try:
            with signals_held():  # the workers start here: see `signals_held`
                futures = [pool.submit(dump_one, case) for case in cases]
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
        except BrokenProcessPool:
            script = _script_workers_import()
            if started.is_set() or script is None:
                raise
            raise ShardscopeError(
                f"worker processes ended while starting; each runs {script} again as it starts, so a shardscope "
                'call with several jobs at its top level must be under `if __name__ == "__main__":` (or use jobs=1)'
            ) from None
        except RuntimeError:
            # A child still running the caller's script (multiprocessing's `_inheriting`, the flag behind its
            # own RuntimeError) cannot start processes; it can only end. Anything else is raised as it is.
            if not getattr(multiprocessing.current_process(), "_inheriting", False):
                raise
            # One write of the whole line: several workers end at once on the same stderr, and SystemExit's
            # own message is written in two parts (text, then newline) that another worker's can split.
            os.write(2, f"shardscope: {_unguarded(sys.argv[0])}\n".encode())
            raise SystemExit(1) from None


def _script_workers_import() -> str | None:
    """The caller's script that multiprocessing's spawn runs again in each worker (None: none is run)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # a package's __main__ (`python -m package`) is not run again
    return getattr(main, "__file__", None)


def _unguarded(script: str) -> str:
    """Why a child still running the caller's script cannot start workers, and the fix."""
    return (
        f"{script} starts shardscope's worker processes at its top level, and each of them runs it again as it "
        'starts: put that call under `if __name__ == "__main__":` (or use jobs=1)'
    )
