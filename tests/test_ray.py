"""Compiling on a Ray cluster: a local cluster started here gives the table the local processes give."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# The quick lane (`-m "not slow"`) leaves these out: a Ray cluster started.
pytestmark = pytest.mark.slow

pytest.importorskip("ray")

RAY = str(Path(sys.executable).parent / "ray")
# --confirm 0: every candidate compiled (on the cluster), not only the best predicted.
SEARCH = [
    "advise",
    "mixtral-tiny",
    "--preset",
    "ep-as-cp",
    "--mesh",
    "data=1,stage=1",
    "--hardware",
    "v5p",
    "--confirm",
    "0",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session_processes(session: int) -> list[int]:
    """The processes of one session: the head's, and its workers (the raylet gives each its own group)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    members.append(int(entry.name))
            except ProcessLookupError:
                pass
    return members


@pytest.fixture(scope="module")
def cluster():
    """A one-node Ray cluster with two CPUs, of this test's own: its head in a session of its own and its
    files in a directory of its own, so that stopping it ends its processes and no one else's."""
    port = _free_port()
    # Not under pytest's tmp_path: Ray's sockets sit three levels below its directory, and a Unix socket's
    # path may not pass 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="ss-ray-"))
    # No drain on SIGTERM: nothing runs on the cluster by then, and draining waits up to 30 s.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    start = [RAY, "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp_dir}", "--num-cpus=2"]
    start += ["--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=150000000"]
    with (temp_dir / "head.log").open("w") as log:
        head = subprocess.Popen(start, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # `ray start` writes the cluster's address into its directory once every process has started.
        deadline = time.monotonic() + 300
        while not (temp_dir / "ray_current_cluster").exists():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start: {(temp_dir / 'head.log').read_text()}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # the head stops the processes it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=60)
        # Whatever it left (a worker it did not reach, or everything if it hung) is still in its session.
        for pid in _session_processes(head.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _shardscope(args, cache: Path, **env_extra):
    env = dict(os.environ, SHARDSCOPE_CACHE_DIR=str(cache), **env_extra)
    if "RAY_ADDRESS" not in env_extra:
        env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "shardscope.cli", *args], env=env, capture_output=True, text=True, timeout=1200
    )


def _table(data):
    return {key: data[key] for key in ("ranking", "over_capacity", "failed", "pruned", "target", "efficiency")}


def test_a_sweep_on_a_ray_cluster_gives_the_local_table(cluster, tmp_path):
    on_ray = _shardscope([*SEARCH, "--json", "--ray", cluster], tmp_path / "ray-cache")
    assert on_ray.returncode == 0, on_ray.stderr
    local = _shardscope([*SEARCH, "--json", "--no-cache"], tmp_path / "local-cache")
    assert local.returncode == 0, local.stderr
    ray_data, local_data = json.loads(on_ray.stdout), json.loads(local.stdout)
    assert ray_data["counts"]["compiled"] == 4 and ray_data["counts"]["cached"] == 0
    assert len(ray_data["ranking"]) == 4
    assert _table(ray_data) == _table(local_data)
    # What the cluster compiled was cached here: the same search again compiles nothing.
    again = _shardscope([*SEARCH, "--json"], tmp_path / "ray-cache")
    assert json.loads(again.stdout)["counts"]["compiled"] == 0


def test_check_runs_on_the_cluster_named_by_ray_address(cluster, tmp_path):
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "cases.yaml").write_text("cases:\n  - {model: mixtral-tiny, preset: ep-as-cp}\n")
    made = _shardscope(["update", "--golden", str(golden)], tmp_path / "cache")
    assert made.returncode == 0, made.stderr
    checked = _shardscope(
        ["check", "--golden", str(golden), "--no-cache", "--json"], tmp_path / "cache", RAY_ADDRESS=cluster
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["summary"] == "1 case: 1 same"


def test_a_cluster_that_does_not_answer_is_one_line(tmp_path):
    port = _free_port()  # nothing listens there
    result = _shardscope([*SEARCH, "--ray", f"127.0.0.1:{port}"], tmp_path / "cache")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"shardscope: error: --ray 127.0.0.1:{port}: no Ray cluster reachable there (Connection refused)"
    )


def _free_cpus(address: str) -> float:
    """The cluster's CPUs no actor holds, asked by a driver of its own."""
    probe = (
        f"import logging, ray; ray.init(address={address!r}, logging_level=logging.ERROR, log_to_driver=False); "
        "print(ray.available_resources().get('CPU', 0.0))"
    )
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


def test_ctrl_c_during_a_search_on_the_cluster_frees_its_workers(cluster, tmp_path):
    env = dict(os.environ, SHARDSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("RAY_ADDRESS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "shardscope.cli", *SEARCH, "--ray", cluster, "--no-cache"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # Once the search holds the cluster's CPUs (its workers started), interrupt it as a terminal would.
    deadline = time.monotonic() + 120
    while _free_cpus(cluster) >= 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(1)
    if process.poll() is not None:
        _, err = process.communicate()  # closes the pipe before failing
        pytest.fail(f"the search ended before its workers were seen: {err}")
    os.killpg(process.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err.splitlines() == ["shardscope: interrupted"], err
    assert time.monotonic() - sent <= 10
    # The cluster gets its CPUs back: the workers stopped with the search.
    deadline = time.monotonic() + 30
    while _free_cpus(cluster) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert _free_cpus(cluster) == 2
