"""Ctrl-C is input too: sent to the whole process group (as a terminal sends it) at several points of a dump,
a check and an advise, it ends everything within seconds with exit 130 and one line, leaving no partial
file and no process behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardscope

# The quick lane (`-m "not slow"`) leaves these out: processes started and interrupted while they compile.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _interrupt(args: list[str], delay: float, cwd: Path) -> tuple[int, list[str], float]:
    """Runs `shardscope ARGS`, sends SIGINT to its process group after `delay` seconds; (exit code, stderr
    lines, seconds from the signal to the exit). Fails if any process of the group outlives it by 10 s.

    A run that ended before its signal (this machine was faster than when the delay was chosen) is run again
    with half the delay, twice at most: the point is to land inside the work, wherever that is today."""
    for attempt in range(3):
        ran = _interrupt_once(args, delay / 2**attempt, cwd)
        if ran is not None:
            return ran
    pytest.fail(f"{args} ended before the signal, even at {delay / 4:.1f} s")


def _interrupt_once(args: list[str], delay: float, cwd: Path) -> tuple[int, list[str], float] | None:
    """One run of `_interrupt`; None when the command ended before the signal."""
    env = dict(os.environ, SHARDSCOPE_CACHE_DIR=str(cwd / "cache"))
    process = subprocess.Popen(
        [sys.executable, "-m", "shardscope.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Its own process group, as a terminal's foreground job. (No preexec_fn: forking a process that runs
        # JAX's threads from Python is unsafe; the CLI installs its own SIGINT handler whatever it inherits.)
        start_new_session=True,
    )
    time.sleep(delay)
    if process.poll() is not None:
        process.communicate()  # closes the pipe (an open one would be reported, much later, by another test)
        return None
    os.killpg(process.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = process.communicate(timeout=30)
    took = time.monotonic() - sent
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"{args}: processes of the group outlived the interrupt by 10 s")
    return process.returncode, err.splitlines(), took


def _assert_interrupted(code: int, lines: list[str], took: float) -> None:
    assert code == 130, lines
    assert lines == ["shardscope: interrupted"], lines
    assert took <= 10


@pytest.fixture(scope="module")
def dump_seconds(tmp_path_factory) -> float:
    """How long a whole dump takes on this machine now: the signals land at fractions of it (3, 5 and 7 s into
    a 10 s dump), so a fast or a loaded machine still interrupts it mid-way, not after it ended."""
    cwd = tmp_path_factory.mktemp("timing")
    env = dict(os.environ, SHARDSCOPE_CACHE_DIR=str(cwd / "cache"))
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "shardscope.cli", "dump", "deepseek-tiny", "--preset", "ep-tp", "--no-cache"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.monotonic() - start


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("preset", ["ep-tp", "ep-as-dp"])
def test_ctrl_c_during_a_dump(tmp_path, preset, fraction, dump_seconds):
    out = tmp_path / "plan.json"
    code, lines, took = _interrupt(
        ["dump", "deepseek-tiny", "--preset", preset, "--no-cache", "-o", str(out)], fraction * dump_seconds, tmp_path
    )
    if code == -signal.SIGINT and not lines:
        # The signal landed as the finished process was shutting down (its handler already gone): the work was
        # done, so the plan must be whole.
        assert shardscope.load_plan(out).tensors
    else:
        _assert_interrupted(code, lines, took)
    # No partial file: no plan, or (when the signal lands after the rename, as the process leaves) a whole one.
    assert not out.exists() or shardscope.load_plan(out).tensors
    assert not list(tmp_path.glob(".plan.json.*"))


@pytest.mark.parametrize(("command", "delay"), [("check", 3), ("check", 8), ("update", 4), ("update", 10)])
def test_ctrl_c_during_a_check_leaves_the_goldens_as_they_were(tmp_path, command, delay):
    golden = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", golden)
    before = {p: p.read_bytes() for p in golden.rglob("*") if p.is_file()}
    code, lines, took = _interrupt([command, "--golden", str(golden), "--no-cache"], delay, tmp_path)
    _assert_interrupted(code, lines, took)
    after = {p: p.read_bytes() for p in golden.rglob("*") if p.is_file()}
    # Each golden is its old self or its new whole self (an update writes atomically); nothing else appears.
    assert set(after) == set(before)
    assert not list(golden.rglob("*.tmp"))


@pytest.mark.parametrize("delay", [3, 6])
def test_ctrl_c_during_an_advise(tmp_path, delay):
    code, lines, took = _interrupt(["advise", "deepseek-tiny", "--preset", "ep-tp", "--no-cache"], delay, tmp_path)
    # Piped, an advise reports its progress on stderr (a line per tenth of its plans) before the one line.
    progress = [line for line in lines[:-1] if re.fullmatch(r"advise: \d+% \(\d+ of \d+ plans done, .*\)", line)]
    assert progress == lines[:-1], lines
    _assert_interrupted(code, lines[-1:], took)
