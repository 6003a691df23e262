"""Every `shardscope` command the README shows runs as written and exits as the README implies.

Commands are taken from the README's bash blocks (all but the set-up block, which installs and runs this
very suite) and run one after another in a scratch directory holding the files they name, each in its own
process through the installed console script, as a user would type them.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The quick lane (`-m "not slow"`) leaves these out: every command of the README, each in a process of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GOLDEN = ROOT / "golden"
# Commands whose documented outcome is "they differ" (exit 1).
DIFFERING = ("shardscope diff ",)


def readme_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
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


def runs_here(command: str) -> bool:
    """MaxText's own programs (`maxtext:`, and `why` of the plan one makes) need Python 3.12 and MaxText: their
    commands are run by tests/test_maxtext_program.py, in the test command's maxtext: lane."""
    return "maxtext:" not in command and "qwen.json" not in command


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The files README commands name: two plans, an HLO module, a rule file, a golden set, the examples."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / "default.json", root / "old.json")
    shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / "ep-as-cp.json", root / "new.json")
    shutil.copy(ROOT / "tests" / "hlo_samples" / "flax_moe_train_step.hlo.txt", root / "module.after_optimizations.txt")
    shutil.copy(ROOT / "tests" / "data" / "maxtext" / "rules" / "tp-heads.yml", root / "my_rules.yml")
    shutil.copytree(ROOT / "examples", root / "examples")
    shutil.copytree(ROOT / "tests" / "data" / "maxtext" / "sharding_info", root / "sharding_info")
    golden = root / "golden"
    for case in ("default", "ep-as-cp"):
        (golden / "deepseek-tiny" / "cpu-8").mkdir(parents=True, exist_ok=True)
        shutil.copy(GOLDEN / "deepseek-tiny" / "cpu-8" / f"{case}.json", golden / "deepseek-tiny" / "cpu-8")
    (golden / "cases.yaml").write_text(
        "hardware: v5p\ncases:\n"
        "  - {model: deepseek-tiny, preset: default}\n"
        "  - {model: deepseek-tiny, preset: ep-as-cp}\n"
    )
    return root


def test_the_readme_shows_commands():
    assert len(readme_commands()) >= 15


@pytest.mark.parametrize("command", [c for c in readme_commands() if runs_here(c)])
def test_readme_command_runs(command, scratch):
    args = shlex.split(command)
    program = shutil.which("shardscope") if args[0] == "shardscope" else sys.executable
    assert program is not None, "the shardscope console script is not installed"
    result = subprocess.run([program, *args[1:]], cwd=scratch, capture_output=True, text=True, timeout=600)
    expected = 1 if command.startswith(DIFFERING) else 0
    assert result.returncode == expected, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
