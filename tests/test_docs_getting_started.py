"""The docs' getting-started page runs as written: its files are written and its commands run, in page order, in
a scratch directory, each in its own process through the installed console script, on fake CPU devices.

The page's convention: a ```yaml title="PATH"``` block is the file at PATH (written when the walk reaches it; a
`--8<-- "FILE"` line in it is the docs file it includes); each line of a ```bash``` block is a command, expected to
exit 0 unless its comment says `exits N`. The CI workflow the page hands out is then run too: its `shardscope`
steps, against the goldens the page made.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE = DOCS / "getting-started.md"
WORKFLOW = ".github/workflows/shardscope.yml"
# The commands run this checkout's code, whichever checkout the console script was installed from.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", flags=re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', flags=re.M)


@dataclass(frozen=True)
class Step:
    """A file the page writes (`path`, `text`) or a command it runs (`command`, `exit_code`)."""

    path: str | None = None
    text: str = ""
    command: str = ""
    exit_code: int = 0


def page_steps(markdown: str) -> list[Step]:
    """The page's files and commands in page order."""
    steps = []
    for language, info, body in BLOCK.findall(markdown):
        title = re.search(r'title="([^"]+)"', info)
        if language == "yaml" and title:
            text = SNIPPET.sub(lambda m: (DOCS / m.group(1)).read_text(encoding="utf-8"), body)
            steps.append(Step(path=title.group(1), text=text))
        elif language == "bash":
            for line in body.splitlines():
                command, _, comment = line.partition("  #")
                if command.strip():
                    exits = re.search(r"exits (\d)", comment)
                    steps.append(Step(command=command.strip(), exit_code=int(exits.group(1)) if exits else 0))
    return steps


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command)
    assert args[0] == "shardscope", f"the page runs only shardscope commands, found {command!r}"
    program = Path(sys.executable).parent / "shardscope"  # this environment's console script
    assert program.is_file(), "the shardscope console script is not installed"
    return subprocess.run([program, *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=600, env=ENV)


def test_the_page_reads_into_files_and_commands():
    steps = page_steps(PAGE.read_text(encoding="utf-8"))
    commands = [s.command for s in steps if s.command]
    files = [s.path for s in steps if s.path]
    assert len(commands) >= 9, commands
    assert {"shardscope dump", "shardscope diff", "shardscope update", "shardscope check"} <= {
        " ".join(c.split()[:2]) for c in commands
    }
    assert any("--html" in c for c in commands if c.startswith("shardscope diff"))
    assert files.count("rules.yml") == 3 and "golden/cases.yaml" in files and WORKFLOW in files
    assert "--8<--" not in next(s.text for s in steps if s.path == WORKFLOW)
    assert [s.exit_code for s in steps if s.command.startswith("shardscope diff")] == [1, 1]


def test_the_workflow_checks_the_goldens_and_keeps_the_reports():
    workflow = yaml.safe_load((DOCS / "assets" / "shardscope.yml").read_text(encoding="utf-8"))
    steps = workflow["jobs"]["sharding"]["steps"]
    runs = [step["run"] for step in steps if "run" in step]
    check = next(r for r in runs if r.startswith("shardscope check"))
    assert "--golden golden" in check and "--html shardscope-report.html" in check
    assert any("shardscope-summary.md" in r and "GITHUB_STEP_SUMMARY" in r for r in runs)
    assert any(step.get("with", {}).get("path") == "shardscope-report.html" for step in steps)


# Five compiles of llama-tiny, each in a process of its own.
@pytest.mark.slow
def test_every_command_on_the_page_runs(tmp_path):
    steps = page_steps(PAGE.read_text(encoding="utf-8"))
    for step in steps:
        if step.path is not None:
            target = tmp_path / step.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.text, encoding="utf-8")
            continue
        result = run(step.command, tmp_path)
        assert result.returncode == step.exit_code, f"{step.command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr
    # What the page says each step leaves behind.
    assert (tmp_path / "golden" / "llama-tiny" / "cpu-8" / "llama-rules.json").is_file()
    for report in ("diff.html", "diff.md", "check.html", "check.md"):
        assert (tmp_path / report).stat().st_size > 0, report
    assert "mlp" in (tmp_path / "diff.md").read_text(encoding="utf-8")
    # The workflow's own commands, as CI runs them, on the goldens the page made: nothing changed.
    workflow = yaml.safe_load((tmp_path / WORKFLOW).read_text(encoding="utf-8"))
    for step in workflow["jobs"]["sharding"]["steps"]:
        if step.get("run", "").startswith("shardscope "):
            result = run(step["run"], tmp_path)
            assert result.returncode == 0, f"{step['run']}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "1 same" in (tmp_path / "shardscope-summary.md").read_text(encoding="utf-8")
    shutil.rmtree(tmp_path)
