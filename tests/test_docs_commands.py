"""Every `shardscope` command the README and the docs show runs as written and exits as they imply.

Commands are taken from the bash blocks of the README (all but the set-up block, which installs and runs this
very suite) and of every docs page, in that order, and run one after another in a scratch directory holding
the files they name, each in its own process through the installed console script, as a user would type
them. The getting-started page has a test of its own (tests/test_docs_getting_started.py): it writes files
between its commands.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The quick lane (`-m "not slow"`) leaves these out: every command of the docs, each in a process of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The README first, then the docs pages in a fixed order (a command may read what an earlier one wrote).
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if p.name != "getting-started.md")]
GOLDEN = ROOT / "golden"
# The commands run this checkout's code, whichever checkout the console script was installed from.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
# Commands whose documented outcome is "they differ" (exit 1).
DIFFERING = ("shardscope diff ",)


def page_commands(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        if "scripts/test.sh" in block:
            continue  # the set-up block: it installs shardscope and runs these tests
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("shardscope ") or line.startswith("python examples/"):
                commands.append(line)
    return commands


def docs_commands() -> list[str]:
    """Every page's commands in page order, each once (the README's tour is also in the CLI reference)."""
    return list(dict.fromkeys(command for page in PAGES for command in page_commands(page)))


def runs_here(command: str) -> bool:
    """MaxText's own programs (`maxtext:`, and `why` of the plan one makes) need Python 3.12 and MaxText: their
    commands are run by tests/test_maxtext_program.py (`verify`'s by tests/test_maxtext_verify.py), in the test
    command's maxtext: lane; GPU clusters' by tests/test_gpu.py, in its GPU lane. A command on a Ray cluster
    (`--ray`) needs a cluster: tests/test_ray.py starts one of its own for them."""
    if re.search(r"--topology (h100|h200|b200|gb200)-|h100-2x8\.json", command):
        return False  # GPU clusters need the GPU extra: tests/test_gpu.py runs them, in the GPU lane
    return "maxtext:" not in command and "qwen.json" not in command and "--ray" not in command


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The files the commands name: plans, an HLO module, a rule file, a golden set, the examples, a step."""
    root = tmp_path_factory.mktemp("docs")
    for old, new in (("old.json", "new.json"), ("before.json", "after.json")):
        shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / "default.json", root / old)
        shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / "ep-as-cp.json", root / new)
    shutil.copy(ROOT / "tests" / "hlo_samples" / "flax_moe_train_step.hlo.txt", root / "module.after_optimizations.txt")
    shutil.copy(ROOT / "tests" / "data" / "maxtext" / "rules" / "tp-heads.yml", root / "my_rules.yml")
    shutil.copytree(ROOT / "examples", root / "examples")
    shutil.copytree(ROOT / "tests" / "data" / "maxtext" / "sharding_info", root / "sharding_info")
    shutil.copytree(ROOT / "tests" / "data" / "verify", root / "tests" / "data" / "verify")
    golden = root / "golden"
    for case in ("default", "ep-as-cp"):
        (golden / "deepseek-tiny" / "cpu-8").mkdir(parents=True, exist_ok=True)
        shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / f"{case}.json", golden / "deepseek-tiny" / "cpu-8")
    (golden / "cases.yaml").write_text(
        "hardware: v5p\ncases:\n"
        "  - {model: deepseek-tiny, preset: default}\n"
        "  - {model: deepseek-tiny, preset: ep-as-cp}\n"
    )
    yield root
    shutil.rmtree(root)


def test_the_readme_shows_commands():
    """The README's tour and examples, besides every docs page's commands."""
    assert len(page_commands(README)) >= 12
    assert len(docs_commands()) >= 35


def test_every_docs_page_with_a_guide_shows_its_commands():
    """The how-to guides of the CLI each show at least one command a user can copy."""
    guides = ("advise.md", "own-model.md", "tpu-topologies.md", "verify.md", "maxtext-models.md")
    for name in guides:
        assert page_commands(DOCS / "how-to" / name), name


@pytest.mark.parametrize("command", [c for c in docs_commands() if runs_here(c)])
def test_docs_command_runs(command, scratch):
    args = shlex.split(command)
    program = shutil.which("shardscope") if args[0] == "shardscope" else sys.executable
    assert program is not None, "the shardscope console script is not installed"
    result = subprocess.run([program, *args[1:]], cwd=scratch, capture_output=True, text=True, timeout=600, env=ENV)
    expected = 1 if command.startswith(DIFFERING) else 0
    assert result.returncode == expected, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
