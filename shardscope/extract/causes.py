"""Why each collective runs: the tensor it moves, the op that needs it, and the rules behind its mesh axes.

From what the compiled module says of a collective (`shardscope.hlo.origins`: the step argument or op its
operand comes from; its op_name and source line) and from the plan's tensors and the preset's rules:

- the moved tensor is the plan tensor of the argument (`params/...`, `opt_state/...`, `inputs/...`), a
  parameter's gradient (`grads/params/...`: a sum in the backward pass of a module's op whose size is one
  of that module's parameters), or the op's result (`ops/<module>/<primitive>`);
- the rules are those that put a dimension of a related tensor on one of the collective's mesh axes: of the
  moved tensor itself; for an op's result, of the plan tensors it is computed from (a sum over a contraction
  sharded on the axes names the sharded operand) and else of the named activations of the op's module (or
  the nearest enclosing module that has some). None found: the compiler chose the layout.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from shardscope.case.rules import Rule, SpecEntry, entry_axes, explain_logical
from shardscope.extract.state_paths import canonical_state_path
from shardscope.hlo.collectives import Collective
from shardscope.hlo.metadata import module_path, primitive_of
from shardscope.hlo.origins import Origin
from shardscope.plan.records import Cause, RuleCause, TensorRecord

__all__ = ["collective_cause", "placing_rules", "plan_path", "project_relative"]

_KEY = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]|\.(\w+)")
# The step's arguments: the train state and the batch (MaxText calls it `data`).
_ROOTS = {"state": "", "batch": "inputs", "data": "inputs"}
_REDUCTIONS = frozenset({"all-reduce", "reduce-scatter"})


def plan_path(argument: str) -> str:
    """The plan path of a step argument jax named by its pytree path: `state['params']['decoder']` →
    `params/decoder`, `state['opt_state'][0].mu['w']` → `opt_state/0/mu/w`, `batch['tokens']` →
    `inputs/tokens`; "" when the name is no such path."""
    head = re.match(r"\w+", argument)
    if head is None or head.group() not in _ROOTS:
        return ""
    parts = [_ROOTS[head.group()]] if _ROOTS[head.group()] else []
    pos = head.end()
    for key in _KEY.finditer(argument, pos):
        if key.start() != pos:
            return ""
        parts.append(next(g for g in key.groups() if g is not None))
        pos = key.end()
    return canonical_state_path(parts) if pos == len(argument) else ""


@cache
def project_relative(path: str) -> str:
    """A source file as its import path (`reference_models/layers.py`): below the outermost package folder
    that holds it, so plans name the same file alike in every checkout; a file outside any package by its
    name; a file not on this machine below the longest `sys.path` entry it is under (else as it is)."""
    file = Path(path)
    roots = sorted((p.rstrip("/") + "/" for p in sys.path if p and path.startswith(p.rstrip("/") + "/")), key=len)
    imported = path[len(roots[-1]) :] if roots else path
    if file.is_file():
        root = file.parent
        while (root / "__init__.py").is_file() and root.parent != root:
            root = root.parent
        packaged = file.relative_to(root).as_posix()
        # A package with folders that are namespace packages (no __init__.py; MaxText's `maxtext/utils/`) stops
        # the walk early: its import path from sys.path says more, and ends the same.
        return imported if roots and imported.endswith("/" + packaged) else packaged
    return imported


# Libraries whose frames jax leaves in the stack or not depending on where they are installed (a frame under
# the interpreter's own lib directory is left out, one in a virtual environment is not): never the model's line.
_LIBRARIES = frozenset({"jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "chex", "orbax"})


def _model_line(row: Collective) -> str | None:
    """`file:line` of the innermost frame of the op's stack that is no library's (the model line that made
    the op, wherever the libraries are installed)."""
    frames = row.stack or ((row.line,) if row.line else ())
    for file, line in frames:
        if not _in_library(file):
            return f"{project_relative(file)}:{line}"
    return None


def _in_library(file: str) -> bool:
    """A file of one of `_LIBRARIES`: its import path starts with one, or it sits in an installed package
    directory of one (also for a module that is not on this machine)."""
    if project_relative(file).split("/", 1)[0] in _LIBRARIES:
        return True
    parts = Path(file).parts
    return any(
        part in ("site-packages", "dist-packages") and index + 1 < len(parts) and parts[index + 1] in _LIBRARIES
        for index, part in enumerate(parts)
    )


def _op_label(op_name: str) -> str:
    module = module_path(op_name)
    primitive = primitive_of(op_name)
    return f"{module}/{primitive}" if module else primitive


def placing_rules(
    path: str, record: TensorRecord, axes: Sequence[str], rules: Sequence[Rule]
) -> tuple[tuple[int, SpecEntry, RuleCause], ...]:
    """(dimension, the rule's spec for it, the rule) for each dimension of tensor `path` that its spec puts on
    any of `axes` and that a rule decided; () without logical names or rules."""
    if record.logical is None or not rules:
        return ()
    try:
        decisions = explain_logical(record.logical, rules)
    except ValueError:
        return ()
    out = []
    for dim, (entry, decision) in enumerate(zip(record.spec, decisions, strict=False)):
        if set(entry_axes(entry)) & set(axes) and decision.rule_index is not None and decision.logical is not None:
            cause = RuleCause(decision.logical, entry_axes(decision.spec), decision.rule_index, path)
            out.append((dim, decision.spec, cause))
    return tuple(out)


class _Placement:
    """Rule attribution for one plan: which rules put which tensor dimensions on which mesh axes."""

    def __init__(self, tensors: Mapping[str, TensorRecord], rules: Sequence[Rule]) -> None:
        self.tensors = tensors
        self.rules = tuple(rules)
        self.activations: dict[str, list[str]] = {}
        for path, record in tensors.items():
            if record.kind == "activation":
                module = path.removeprefix("activations/").rsplit("/", 1)[0].split("#")[0]
                self.activations.setdefault(module, []).append(path)
        self._memo: dict[tuple[str, tuple[str, ...]], tuple[RuleCause, ...]] = {}

    def rules_of(self, path: str, axes: tuple[str, ...]) -> tuple[RuleCause, ...]:
        """The rules that put a dimension of tensor `path` on any of `axes` (as its spec has it)."""
        key = (path, axes)
        if key not in self._memo:
            self._memo[key] = self._rules_of(path, axes)
        return self._memo[key]

    def _rules_of(self, path: str, axes: tuple[str, ...]) -> tuple[RuleCause, ...]:
        record = self.tensors.get(path)
        if record is None:
            return ()
        return tuple(cause for _, _, cause in placing_rules(path, record, axes, self.rules))

    def nearby_activations(self, module: str) -> list[str]:
        """The named activations of `module`, or of its nearest enclosing module that has some, or (an op
        outside every module that has some, e.g. a top-level norm) all of the model's."""
        parts = module.split("/") if module else []
        while parts:
            found = self.activations.get("/".join(parts))
            if found:
                return sorted(found)
            parts.pop()
        return sorted(path for paths in self.activations.values() for path in paths)

    def gradient_of(self, module: str, shape: tuple[int, ...]) -> str | None:
        """The parameter of `module` whose (per-layer) size `shape` is, if one is."""
        elements = math.prod(shape)
        prefix = f"params/{module}/"
        for path in sorted(p for p in self.tensors if p.startswith(prefix) and "/" not in p[len(prefix) :]):
            record = self.tensors[path]
            total = math.prod(record.shape)
            if elements and (total == elements or any(total == elements * d for d in record.shape if d > 1)):
                return path
        return None


def _argument(origin: Origin, placement: _Placement) -> str | None:
    path = plan_path(origin.name)
    return path if path and path in placement.tensors else None


def _row_cause(row: Collective, placement: _Placement) -> Cause:
    axes = row.axes or ()
    tensors: list[str] = []
    rules: list[RuleCause] = []
    for origin in row.origins:
        if origin.kind == "parameter":
            path = _argument(origin, placement)
            tensors.append(path or origin.name)
            rules += placement.rules_of(path, axes) if path else ()
            continue
        module = module_path(origin.name)
        label = _op_label(origin.name)
        gradient = placement.gradient_of(module, row.shape) if row.pass_ == "backward" else None
        if gradient is not None and row.op in _REDUCTIONS:
            tensors.append(f"grads/{gradient}")
        else:
            tensors.append(f"ops/{label}")
        found: list[RuleCause] = []
        for source in origin.inputs:  # what the op computes from: a sharded operand explains a sum or a move
            path = _argument(source, placement) if source.kind == "parameter" else None
            found += placement.rules_of(path, axes) if path else ()
        if not found:
            modules = [module, *(module_path(s.name) for s in origin.inputs if s.kind == "op")]
            for near in dict.fromkeys(modules):
                for activation in placement.nearby_activations(near):
                    found += placement.rules_of(activation, axes)
        rules += found
    first_of_rule: dict[int, RuleCause] = {}  # one tensor per rule: the first it was found on
    for rule in rules:
        first_of_rule.setdefault(rule.rule, rule)
    return Cause(
        tensors=tuple(dict.fromkeys(tensors)),
        consumer=_op_label(row.consumer) if row.consumer else row.source,
        line=_model_line(row),
        rules=tuple(first_of_rule.values()),
    )


def collective_cause(
    rows: Sequence[Collective], tensors: Mapping[str, TensorRecord], rules: Sequence[Rule]
) -> tuple[Cause, ...]:
    """The cause of each row of a traced module (one whose origin was lost names no tensor)."""
    placement = _Placement(tensors, rules)
    return tuple(_row_cause(row, placement) for row in rows)
