"""Reports of a diff: the HTML page is self-contained and escapes every name; the Markdown fits a PR comment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from shardscope.diff import diff_plans
from shardscope.plan import CaseRecord, Plan, TensorRecord, plan_from_json
from shardscope.plan.units import human_bytes
from shardscope.report.diff_terminal import diff_renderable
from shardscope.report.html import render_html, write_html
from shardscope.report.markdown import md_escape, render_markdown, write_markdown

DATA = Path(__file__).parent / "data"
PAYLOAD = "<script>alert(1)</script>"
QUERY = "activations/decoder/moe_layers/self_attention/query"


@pytest.fixture(scope="module")
def sample_plans():
    old = plan_from_json((DATA / "plan-deepseek-tiny-default.json").read_text())
    new = plan_from_json((DATA / "plan-deepseek-tiny-ep-as-cp.json").read_text())
    return old, new


@pytest.fixture(scope="module")
def sample_diff(sample_plans):
    return diff_plans(*sample_plans)


def traffic(plan, axes=None):
    """Bytes moved per device per step, summed from the plan's rows (over `axes` only, if given)."""
    return sum(
        r.bytes * r.count * r.loop_trips
        for r in plan.collectives
        if r.axes and r.loop_trips is not None and (axes is None or r.axes == axes)
    )


def delta_text(before: int, after: int) -> str:
    sign = "+" if after >= before else "−"
    return f"{sign}{human_bytes(abs(after - before))} ({sign}{round(abs(after - before) * 100 / before)}%)"


def hostile_diff():
    """A diff whose tensor path, preset, source and overrides carry markup."""

    def tensor(spec):
        return TensorRecord("param", (8,), "float32", ("embed|x",), spec, (8,), 32)

    def plan(preset, spec):
        case = CaseRecord("deepseek-tiny", preset, "cpu-8", (("fsdp", 8),), "auto", (("note", PAYLOAD),))
        tensors = ((f"params/{PAYLOAD}/a|b", tensor(spec)),)
        return Plan(case, (), tensors, (), (("temp_bytes", 10),))

    return diff_plans(plan("default", (None,)), plan(PAYLOAD, ("fsdp",)))


def test_html_has_no_remote_resources(sample_diff):
    page = render_html(sample_diff)
    assert "http://" not in page and "https://" not in page
    targets = re.findall(r"\b(?:src|href|action|srcset)\s*=\s*[\"']?([^\"'\s>]*)", page, re.IGNORECASE)
    assert targets and all(t.startswith("#") for t in targets)  # only in-page anchors
    assert "@import" not in page and "url(" not in page
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


def test_html_shows_the_changes(sample_diff, sample_plans):
    page = render_html(sample_diff)
    # Paths are shown whole, with break opportunities only after slashes.
    assert QUERY.replace("/", "/<wbr>") in page
    assert "params/decoder/moe_layers/self_attention/wq_b/kernel".replace("/", "/<wbr>") in page
    assert f"{_placement_count(sample_diff)} changes" in page
    # The dimension that gained `expert` is highlighted on the after line, the dropped axis on the before line.
    assert '<span class="ax-add">&#39;expert&#39;</span>' in page
    assert '<span class="ax-drop">&#39;expert&#39;</span>' in page
    assert '<span class="pill add">+expert</span>' in page
    # Unchanged rows are folded away, closed.
    assert f"{len(sample_diff.unchanged_tensors)} unchanged tensors" in page
    assert f"{len(sample_diff.unchanged_collectives)} unchanged collective rows" in page
    assert "<details open" not in page
    # Headline totals before → after.
    old, new = sample_plans
    assert "Traffic per mesh axis" in page and delta_text(traffic(old), traffic(new)) in page
    # MaxText's twelve-axis default mesh is shown by the axes that split devices.
    assert "fsdp=4,expert=2 (+10 axes of size 1)" in page


def test_html_escapes_names():
    page = render_html(hostile_diff())
    assert PAYLOAD not in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the preset, in the title and the case lines
    assert "params/<wbr>&lt;script&gt;alert(1)&lt;/<wbr>script&gt;/<wbr>a|b" in page  # the path, split at '/'


def test_html_of_same_plans(sample_diff):
    old = plan_from_json((DATA / "plan-deepseek-tiny-default.json").read_text())
    page = render_html(diff_plans(old, old))
    assert "no changes" in page and "No tensor changed." in page and "No collective changed." in page


def test_markdown_fits_a_pr_comment(sample_diff, sample_plans):
    old, new = sample_plans
    text = render_markdown(sample_diff)
    lines = text.splitlines()
    assert len(lines) < 60
    assert lines[0] == f"### shardscope plan diff: {_placement_count(sample_diff)} changes"
    before, after = traffic(old), traffic(new)
    assert (
        f"| **traffic / step** | {human_bytes(before)} | {human_bytes(after)} | {delta_text(before, after)} |" in lines
    )
    axes = ("fsdp", "expert")
    before, after = traffic(old, axes), traffic(new, axes)
    assert f"| over fsdp+expert | {human_bytes(before)} | {human_bytes(after)} | {delta_text(before, after)} |" in lines
    assert any("wkv\\_b/kernel (+5 mirrors)" in line and "kv\\_lora −expert" in line for line in lines)
    # The many activations that move expert from the batch to the sequence are folded into one line.
    assert any(line.endswith("× (dim 0 −expert, dim 1 +expert).") for line in lines)
    # Every table row has the same number of cells as its header.
    for table in re.findall(r"(?:^\|.*\|$\n?)+", text, re.MULTILINE):
        rows = [r for r in table.splitlines() if r]
        assert {len(re.findall(r"(?<!\\)\|", r)) for r in rows} == {len(re.findall(r"\|", rows[0]))}


def test_markdown_escapes_names():
    text = render_markdown(hostile_diff())
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "params/&lt;script&gt;alert(1)&lt;/script&gt;/a\\|b" in text
    assert "a|b" not in text and "embed|x" not in text


def test_md_escape():
    assert md_escape("a_b|c*d`e[f]") == "a\\_b\\|c\\*d\\`e\\[f\\]"
    assert md_escape("x<y>&z") == "x&lt;y&gt;&amp;z"
    assert md_escape("two\nlines") == "two lines"


def test_terminal_renderable(sample_diff):
    console = Console(width=220, record=True, color_system=None)
    console.print(diff_renderable(sample_diff))
    text = console.export_text()
    assert f"{_placement_count(sample_diff)} changes" in text
    assert "dim 1 activation_length +expert" in text
    unchanged = f"{len(sample_diff.unchanged_tensors)} tensors and {len(sample_diff.unchanged_collectives)}"
    assert f"{unchanged} collective rows unchanged" in text
    # The one collective row that changed, with its bytes before → after.
    (changed,) = sample_diff.of_kind("collective_changed")
    bytes_change = dict((f.field, f) for f in changed.fields)["bytes"]
    assert f"{human_bytes(bytes_change.before)} → {human_bytes(bytes_change.after)}" in text


def test_writes_are_atomic_files(sample_diff, tmp_path):
    write_html(sample_diff, tmp_path / "out" / "diff.html")
    write_markdown(sample_diff, tmp_path / "out" / "diff.md")
    assert (tmp_path / "out" / "diff.html").read_text() == render_html(sample_diff)
    assert (tmp_path / "out" / "diff.md").read_text() == render_markdown(sample_diff)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["diff.html", "diff.md"]


def _placement_count(diff) -> int:
    # The verdict counts what the plans place and move: not the case header naming the sides, nor lint findings.
    return sum(1 for c in diff.changes if c.kind != "case" and not c.kind.startswith("finding"))
