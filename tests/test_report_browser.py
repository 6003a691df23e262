"""The HTML report in a real browser: it renders, and a hostile tensor path stays text (no script runs)."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from shardscope.diff import diff_plans
from shardscope.plan import CaseRecord, Plan, TensorRecord, plan_from_json
from shardscope.report.html import write_html

DATA = Path(__file__).parent / "data"
CHROMIUM = shutil.which("chromium")
# Would retitle the page and set a global if it ever ran.
PAYLOAD = '<script>document.title="pwned";window.__pwned=1</script>'

# The quick lane (`-m "not slow"`) leaves these out: a headless browser started per test.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs headless Chromium on a local file with every network-facing feature off."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
        page.as_uri(),
    ]
    # The timeout only stops a hung browser from hanging the suite; nothing is asserted about time.
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_screenshot_of_default_vs_ep_as_cp(tmp_path):
    old = plan_from_json((DATA / "plan-deepseek-tiny-default.json").read_text())
    new = plan_from_json((DATA / "plan-deepseek-tiny-ep-as-cp.json").read_text())
    page = tmp_path / "diff.html"
    write_html(diff_plans(old, new), page)
    shot = tmp_path / "diff.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1400,2000")
    assert png_size(shot) == (1400, 2000)
    # A blank page compresses to a few KiB; the rendered tables do not.
    assert shot.stat().st_size > 50_000


def hostile_plan(preset: str, spec) -> Plan:
    tensor = TensorRecord("param", (8,), "float32", ("embed",), spec, (1,), 4)
    case = CaseRecord("deepseek-tiny", preset, "cpu-8", (("fsdp", 8),), "auto")
    return Plan(case, (), ((f"params/{PAYLOAD}/kernel", tensor),), (), ())


def test_hostile_names_stay_text(tmp_path):
    page = tmp_path / "hostile.html"
    write_html(diff_plans(hostile_plan("default", (None,)), hostile_plan(PAYLOAD, ("fsdp",))), page)
    dom = chromium(tmp_path, page, "--dump-dom").stdout
    assert "<script" not in dom.lower()
    assert "__pwned=1" in dom  # the payload is on the page, as text
    assert "&lt;script&gt;document.title" in dom
    title = re.search(r"<title>(.*?)</title>", dom, re.DOTALL)
    assert title is not None
    assert (
        html.unescape(title.group(1))
        == f"shardscope diff · deepseek-tiny · default · cpu-8 → deepseek-tiny · {PAYLOAD} · cpu-8"
    )


def test_scripts_do_run_in_this_harness(tmp_path):
    # The control for the test above: a page that does run a script shows it in the dumped DOM.
    page = tmp_path / "control.html"
    script = '<script>document.title="ran"</script>'
    page.write_text(f"<!DOCTYPE html><html><head><title>before</title></head><body>{script}</body></html>")
    dom = chromium(tmp_path, page, "--dump-dom").stdout
    assert re.search(r"<title>ran</title>", dom)
