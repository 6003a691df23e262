"""Terminal output fits its width: 120 columns when piped, paths elided in the middle, never broken."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shardscope
from shardscope.report.layout import elide_middle

ROOT = Path(__file__).resolve().parent.parent
PATH = "params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0"


def _matches(shown: str, path: str) -> bool:
    """Whether `shown` is `path`, or whole segments of its start and end around "…"."""
    if "…" not in shown:
        return shown == path
    head, _, tail = shown.partition("…")
    head, tail = head.rstrip("/"), tail.lstrip("/")
    return (not head or path.startswith(head + "/")) and path.endswith("/" + tail)


@pytest.mark.parametrize("width", range(8, 70))
def test_an_elided_path_fits_keeps_its_name_and_whole_segments(width):
    text = elide_middle(PATH, width)
    assert len(text) <= width
    if len(PATH) <= width:
        assert text == PATH
        return
    if width >= len("…/wi_0"):
        assert text.endswith("/wi_0")
        assert _matches(text, PATH), text


def test_piped_output_is_120_columns_and_paths_are_not_broken(tmp_path):
    env_cmd = [sys.executable, "-m", "shardscope.cli", "diff"]
    golden = ROOT / "golden" / "deepseek-tiny" / "cpu-8"
    result = subprocess.run(
        [*env_cmd, str(golden / "default.json"), str(golden / "ep-as-cp.json")],
        capture_output=True,
        text=True,
        env={k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"},
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    # Every tensor path shown is a path of the plans, whole or elided around "…" — never cut across lines.
    paths = {
        path for name in ("default", "ep-as-cp") for path, _ in shardscope.load_plan(golden / f"{name}.json").tensors
    }
    prefixes = ("params/", "activations/", "opt_state/", "…/")
    shown = [w for line in lines for w in line.split() if w.startswith(prefixes) and "/" in w]
    assert shown
    for word in shown:
        assert any(_matches(word, path) for path in paths), word


def test_compared_columns_too_long_for_a_column_are_lettered_and_spelled_out_in_the_legend():
    from shardscope.report.compare import column_headers

    assert column_headers(["default", "ep-as-cp"]) == (["default", "ep-as-cp"], None)
    headers, legend = column_headers(["default", "ici_fsdp_parallelism=2 ici_tensor_parallelism=2"])
    assert headers == ["A", "B"]
    assert legend == "A: default\nB: ici_fsdp_parallelism=2 ici_tensor_parallelism=2"
