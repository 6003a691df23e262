"""A `maxtext:` golden case planned (or verified) in a process of its own.

`python -m shardscope.golden.isolated CASE_JSON` prints the case's plan JSON (unpriced, as the plan cache and
the runner take it); `python -m shardscope.golden.isolated CASE_JSON --verify AGAINST` writes the pickled
`VerifyReport` of the case's steps run against AGAINST (one-device, or MaxText keys 'k=v …' as
`verify --against` takes them). Either ends with one line on stderr and exit 2 when the case is wrong.

MaxText's program is built in a child process because MaxText cannot be imported from two trees in one
process (a check may guard cases of two checkouts), and because MaxText sizes its batch by the process's
device count, which must then be the case's own, not the worker's pool (nor the pool `check` verifies the
reference models' cases on).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from shardscope.case.maxtext_model import MaxTextCase, resolve_maxtext_model
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import get_topology
from shardscope.errors import ShardscopeError
from shardscope.verify.records import AGAINST_ONE_DEVICE, VerifyReport


def case_argument(case: MaxTextCase) -> str:
    """The case as the child process takes it."""
    path = str(case.tree.package_dir) if case.tree.checkout else ""
    return json.dumps({"model": case.name, "topology": case.topology.name, "args": case.args, "path": path})


def _run_child(case: MaxTextCase, *extra: str) -> bytes:
    """The child's output for the case (and `extra` arguments).

    Raises:
      ShardscopeError: the child's one-line error.
    """
    child = subprocess.run(
        [sys.executable, "-m", "shardscope.golden.isolated", case_argument(case), *extra],
        capture_output=True,
        check=False,
    )
    if child.returncode != 0:
        lines = [line for line in child.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise ShardscopeError(lines[-1] if lines else f"{case.name}: child process failed (exit {child.returncode})")
    return child.stdout


def plan_in_child(case: MaxTextCase) -> str:
    """The case's plan JSON, planned in a child process (raises ShardscopeError with the child's line)."""
    return _run_child(case).decode()


def verify_in_child(case: MaxTextCase, against: str) -> VerifyReport:
    """The case's steps verified in a child process on the case's own devices, against `against` (one-device,
    or MaxText keys changing its command line). Raises ShardscopeError with the child's line."""
    report = pickle.loads(_run_child(case, "--verify", against))  # written by our own child, below
    if not isinstance(report, VerifyReport):
        raise ShardscopeError(f"{case.name}: verify's child process returned no report")
    return report


def _case_of(argument: str) -> MaxTextCase:
    spec = json.loads(argument)
    return resolve_maxtext_model(
        spec["model"],
        get_topology(spec["topology"]),
        parse_maxtext_args([f"{k}={v}" for k, v in spec["args"]]),
        Path(spec["path"]) if spec["path"] else None,
    )


def _verify(case: MaxTextCase, against: str) -> bytes:
    """The pickled report (a report holds tuples of records, which pickle keeps as they are)."""
    from shardscope.stages.devices import configure_devices  # lazy: before JAX starts

    configure_devices(case.topology)
    from shardscope.verify.cases import DEFAULT_STEPS  # lazy: loads JAX and MaxText
    from shardscope.verify.maxtext import verify_maxtext

    return pickle.dumps(verify_maxtext(case, None if against == AGAINST_ONE_DEVICE else against, DEFAULT_STEPS))


def main(arguments: list[str]) -> int:
    """Plans (or with `--verify AGAINST`, verifies) the case the first argument describes, and prints the result."""
    from shardscope.stages.compiler_log import prepare_compiler_log  # lazy: before JAX starts

    prepare_compiler_log()
    try:
        case = _case_of(arguments[0])
        if arguments[1:2] == ["--verify"]:
            sys.stdout.buffer.write(_verify(case, arguments[2]))
            return 0
        from shardscope.golden.pipeline import plan_maxtext_case  # lazy: loads JAX and MaxText
        from shardscope.plan.json import plan_to_json

        sys.stdout.write(plan_to_json(plan_maxtext_case(case)))
    except ShardscopeError as err:
        sys.stderr.write(f"{err}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
