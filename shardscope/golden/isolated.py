"""A `maxtext:` golden case planned in a process of its own: `python -m shardscope.golden.isolated CASE_JSON`
prints the case's plan JSON (unpriced, as the plan cache and the runner take it), or one line on stderr and
exit 2.

MaxText's program is built in a child process because MaxText cannot be imported from two trees in one
process (a check may guard cases of two checkouts), and because MaxText sizes its batch by the process's
device count, which must then be the case's own, not the worker's pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shardscope.case.maxtext_model import MaxTextCase, resolve_maxtext_model
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import get_topology
from shardscope.errors import ShardscopeError


def case_argument(case: MaxTextCase) -> str:
    """The case as the child process takes it."""
    path = str(case.tree.package_dir) if case.tree.checkout else ""
    return json.dumps({"model": case.name, "topology": case.topology.name, "args": case.args, "path": path})


def plan_in_child(case: MaxTextCase) -> str:
    """The case's plan JSON, planned in a child process.

    Raises:
      ShardscopeError: the child's one-line error.
    """
    child = subprocess.run(
        [sys.executable, "-m", "shardscope.golden.isolated", case_argument(case)],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        lines = [line for line in child.stderr.splitlines() if line.strip()]
        raise ShardscopeError(lines[-1] if lines else f"planning {case.name} failed (exit {child.returncode})")
    return child.stdout


def main(argument: str) -> int:
    """Plans the case the argument describes and prints its plan JSON."""
    from shardscope.stages.compiler_log import prepare_compiler_log  # lazy: before JAX starts

    prepare_compiler_log()
    spec = json.loads(argument)
    try:
        case = resolve_maxtext_model(
            spec["model"],
            get_topology(spec["topology"]),
            parse_maxtext_args([f"{k}={v}" for k, v in spec["args"]]),
            Path(spec["path"]) if spec["path"] else None,
        )
        from shardscope.golden.pipeline import plan_maxtext_case  # lazy: loads JAX and MaxText
        from shardscope.plan.json import plan_to_json

        sys.stdout.write(plan_to_json(plan_maxtext_case(case)))
    except ShardscopeError as err:
        sys.stderr.write(f"{err}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
