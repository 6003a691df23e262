"""Compiling cases on a Ray cluster (`--ray ADDRESS`, or `RAY_ADDRESS`) instead of local processes.

Each actor is one worker process prepared once like a local worker (`worker.start_worker`), then given
cases one at a time; results come back as plan JSON, which the caller caches and prices exactly as it does
local results, so a table made on a cluster is the table made here. Before any case is sent, each actor's
fingerprint (shardscope's and the reference models' sources, package versions, Python) must equal this
process's: a node running other code would otherwise answer with other plans. Ray is an optional extra.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shardscope.errors import ShardscopeError
from shardscope.golden.cache import package_versions, source_digest
from shardscope.golden.cases import GoldenCase
from shardscope.golden.worker import DumpResult, dump_one, start_worker

RAY_ENV = "RAY_ADDRESS"
RAY_EXTRA_HINT = "pip install 'shardscope[cluster]'"
# How long a cluster may take to answer before `--ray` is called unreachable.
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class RayAddress:
    """Where a Ray cluster listens: its head's GCS (`host:port`), a Ray client server (`ray://host:port`), or
    `auto` (the cluster started on this machine, as Ray itself reads RAY_ADDRESS=auto)."""

    text: str  # as the user gave it
    host: str
    port: int


def ray_address(option: str | None) -> str | None:
    """The cluster to compile on: `--ray`, else $RAY_ADDRESS, else None (local processes)."""
    return option or os.environ.get(RAY_ENV) or None


def parse_ray_address(text: str) -> RayAddress:
    """`host:port`, `ray://host:port` or `auto` (raises ShardscopeError, one line, otherwise)."""
    if text == "auto":
        return RayAddress(text, "", 0)
    rest = text.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ShardscopeError(f"--ray {text!r}: expected host:port, ray://host:port or auto, e.g. --ray 10.0.0.2:6379")
    return RayAddress(text, host.strip("[]"), int(port))


def check_reachable(text: str, timeout: float = CONNECT_TIMEOUT) -> RayAddress:
    """Fails fast, in one line, when nothing listens at the address (Ray itself would retry for a minute).

    Raises:
      ShardscopeError: a malformed address, a missing Ray install, or no answer within `timeout` seconds.
    """
    address = parse_ray_address(text)
    try:
        # lazy: Ray is an optional extra
        import ray  # noqa: F401
    except ImportError:
        raise ShardscopeError(f"--ray needs Ray installed: {RAY_EXTRA_HINT}") from None
    if address.text == "auto":
        return address  # Ray finds the local cluster itself (and `_connect` says so in one line if there is none)
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        if isinstance(err, TimeoutError | socket.timeout):
            reason = f"no answer in {timeout:g} s"
        raise ShardscopeError(f"--ray {text}: no Ray cluster reachable there ({reason})") from None
    return address


def fingerprint() -> dict[str, object]:
    """What makes a plan here: the sources and versions the plan cache keys on, and the Python version."""

    return {
        "sources": source_digest(),
        "versions": package_versions(),
        "python": list(sys.version_info[:2]),
        "machine": platform.machine(),
    }


class _Worker:
    """A Ray actor: one prepared worker process (see the module docstring)."""

    def __init__(self, devices: int) -> None:
        start_worker(devices)

    def fingerprint(self) -> dict[str, object]:
        return fingerprint()

    def dump(self, case: GoldenCase) -> DumpResult:
        return dump_one(case)


def _connect(text: str):
    import ray  # lazy: Ray is an optional extra

    address = check_reachable(text)
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address.text, logging_level=logging.ERROR, log_to_driver=False)
    except Exception as err:  # Ray raises many types; every one means the same to a user
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ShardscopeError(f"--ray {text}: could not join the Ray cluster: {first}") from None
    return ray


def compile_on_ray(text: str, cases: Sequence[GoldenCase], devices: int, slots: int) -> Iterator[DumpResult]:
    """Compiles `cases` (in the order given) on the cluster at `text`, yielding results as they finish.

    `slots`: actors to start (0: one per CPU of the cluster); `devices`: each actor's fake CPU pool.
    """
    ray = _connect(text)
    from ray.util import ActorPool  # lazy: Ray is an optional extra

    cpus = int(ray.cluster_resources().get("CPU", 1))
    count = max(1, min(len(cases), slots or cpus))
    actor = ray.remote(num_cpus=1)(_Worker)
    workers = [actor.remote(devices) for _ in range(count)]
    try:
        here = fingerprint()
        for theirs in ray.get([w.fingerprint.remote() for w in workers]):
            if theirs != here:
                differs = ", ".join(k for k in here if here[k] != theirs.get(k))
                raise ShardscopeError(
                    f"--ray {text}: the cluster's workers run another shardscope ({differs} differ); "
                    "install this version there so that its plans are these"
                )
        pool = ActorPool(workers)
        yield from pool.map_unordered(lambda worker, case: worker.dump.remote(case), list(cases))
    finally:
        for worker in workers:
            ray.kill(worker)
