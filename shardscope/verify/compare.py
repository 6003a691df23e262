"""Two sides' results compared tensor by tensor and step by step, with the tolerances of `verify.tolerance`;
the checks in the order the step computes them (loss, gradients in backward order, updated parameters, then
the optimizer's moments; a program's outputs in the order it computes them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from shardscope.errors import ShardscopeError
from shardscope.stages.train_step import AdamW
from shardscope.verify.program import Precision, ProgramReading
from shardscope.verify.records import KINDS, TensorCheck
from shardscope.verify.run import SideRun
from shardscope.verify.tolerance import AdamBounds, adam_bounds, rounding_tolerance

_MU, _NU = "opt_state/0/mu/", "opt_state/0/nu/"
_KIND_PREFIXES = (("grads/", "gradient"), ("params/", "parameter"), (_MU, "first moment"), (_NU, "second moment"))
# What AdamW's elementwise bounds cover (rule 3).
_BOUNDED = frozenset({"parameter", "first moment", "second moment"})


def kind_of(path: str, train_step: bool) -> str:
    """What an output is: `loss`, `gradient`, `parameter`, a moment, other optimizer `state`; `output` of a
    program of one's own."""
    if not train_step:
        return "output"
    if path == "loss":
        return "loss"
    for prefix, kind in _KIND_PREFIXES:
        if path.startswith(prefix):
            return kind
    return "state"


def param_of(path: str) -> str:
    """The parameter a gradient, moment or parameter output belongs to (`params/…`)."""
    for prefix in ("grads/", _MU, _NU):
        if path.startswith(prefix):
            rest = path.removeprefix(prefix)
            return rest if rest.startswith("params/") else "params/" + rest
    return path


def _joined(a: Precision, b: Precision) -> Precision:
    return Precision(max(a.reduction, b.reduction), max(a.eps, b.eps))


def _magnitude(reference: np.ndarray) -> float:
    finite = reference[np.isfinite(reference)] if reference.size else reference
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def _difference(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got − want| elementwise; NaN where both are NaN counts as equal, NaN on one side as infinitely far."""
    if not jnp.issubdtype(want.dtype, jnp.inexact):  # numpy's own issubdtype has bfloat16 as no float
        return np.atleast_1d(np.abs(got.astype(np.int64) - want.astype(np.int64)).astype(np.float64))
    got, want = np.atleast_1d(got.astype(np.float64)), np.atleast_1d(want.astype(np.float64))
    with np.errstate(invalid="ignore"):
        difference = np.abs(got - want)
    both = np.isnan(got) & np.isnan(want)
    difference[both] = 0.0
    difference[np.isnan(difference)] = np.inf
    return difference


def tensor_check(
    step: int, path: str, kind: str, got: np.ndarray, want: np.ndarray, tolerance: float | np.ndarray
) -> TensorCheck:
    """One tensor compared against its reference with an allowed difference (a number or one per element)."""
    difference = _difference(np.asarray(got), np.asarray(want))
    allowed = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), difference.shape)
    magnitude = _magnitude(np.asarray(want, dtype=np.float64)) if want.size else 0.0
    if not difference.size:
        return TensorCheck(step, path, kind, tuple(want.shape), str(want.dtype), 0.0, 0.0, 0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(difference > 0, difference / allowed, 0.0)
    ratios[np.isnan(ratios)] = np.inf
    worst = int(np.argmax(ratios))
    largest = float(np.max(difference))
    relative = largest / magnitude if magnitude > 0 else (0.0 if largest == 0 else float("inf"))
    return TensorCheck(
        step=step,
        tensor=path,
        kind=kind,
        shape=tuple(int(d) for d in want.shape),
        dtype=str(want.dtype),
        max_abs_error=largest,
        max_rel_error=relative,
        tolerance=float(allowed.flat[worst]),
        ratio=float(ratios.flat[worst]),
    )


def _check_same_outputs(side: SideRun, against: SideRun) -> None:
    if set(side.paths) != set(against.paths):
        only = sorted(set(side.paths) ^ set(against.paths))
        raise ShardscopeError(
            f"{side.label} and {against.label} return different outputs ({', '.join(only[:3])}"
            f"{' …' if len(only) > 3 else ''}): the two sides must compute the same step"
        )
    index = {path: i for i, path in enumerate(against.paths)}
    for i, path in enumerate(side.paths):
        got, want = side.values[0][i], against.values[0][index[path]]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ShardscopeError(
                f"{path} is {got.dtype}{list(got.shape)} on {side.label} but {want.dtype}{list(want.shape)} on "
                f"{against.label}: the two sides must compute the same step"
            )


@dataclass(frozen=True)
class _Step:
    """One step of both sides, as the checks read it: values, readings, and each path's index on the
    reference side."""

    got: Sequence[np.ndarray]
    want: Sequence[np.ndarray]
    reading: ProgramReading
    other: ProgramReading
    index: Mapping[str, int]
    carried: float  # rule 2: the largest relative difference of the parameters the step before left

    def allowed(self, i: int, path: str) -> float:
        """Rules 1 and 2 for output `i` (`path`); 0 for an integer output, which must be equal."""
        precision = _joined(self.reading.precisions[i], self.other.precisions[self.index[path]])
        if precision.eps == 0.0:
            return 0.0
        magnitude = _magnitude(self.want[self.index[path]])
        return rounding_tolerance(precision, magnitude) + self.carried * magnitude


def compare_runs(side: SideRun, against: SideRun, adamw: AdamW | None) -> tuple[TensorCheck, ...]:
    """Every output of every step of `side` checked against `against` (the reference), in computation order.

    Args:
      adamw: the optimizer of a train step, whose moments and parameters are bounded elementwise (rule 3 of
        `verify.tolerance`); None for a program of one's own (every output by rules 1 and 2).

    Raises:
      ShardscopeError: the two sides return different outputs (names, shapes or dtypes).
    """
    _check_same_outputs(side, against)
    train_step = adamw is not None
    index = {path: i for i, path in enumerate(against.paths)}
    checks: list[tuple[tuple[int, int, tuple[int, int], str], TensorCheck]] = []
    carried = 0.0
    bounds: dict[str, AdamBounds] = {}
    for step in range(len(side.values)):
        now = _Step(
            side.values[step], against.values[step], side.readings[step], against.readings[step], index, carried
        )
        if adamw is not None:
            grad_tolerance = {
                param_of(path): now.allowed(i, path)
                for i, path in enumerate(side.paths)
                if kind_of(path, train_step) == "gradient"
            }
            bounds = _step_bounds(step + 1, now, grad_tolerance, bounds, adamw)
        carried = 0.0
        for i, path in enumerate(side.paths):
            kind = kind_of(path, train_step)
            tolerance: float | np.ndarray = now.allowed(i, path)
            bound = bounds.get(param_of(path)) if kind in _BOUNDED else None
            if bound is not None:
                tolerance = {"parameter": bound.param, "first moment": bound.mu, "second moment": bound.nu}[
                    kind
                ] + tolerance
            check = tensor_check(step + 1, path, kind, now.got[i], now.want[index[path]], tolerance)
            if kind == "parameter" and np.isfinite(check.max_rel_error):
                carried = max(carried, check.max_rel_error)
            checks.append(((step, KINDS.index(kind), now.reading.computed_at[i], path), check))
    return tuple(check for _, check in sorted(checks, key=lambda item: item[0]))


def _step_bounds(
    step: int, now: _Step, grad_tolerance: Mapping[str, float], before: Mapping[str, AdamBounds], adamw: AdamW
) -> dict[str, AdamBounds]:
    """Rule 3 for every parameter of a train step, on the reference side's gradients and moments."""
    bounds = {}
    for param, tolerance in grad_tolerance.items():
        name = param.removeprefix("params/")
        paths = ("grads/" + param, _MU + name, _NU + name)
        if any(path not in now.index for path in paths):
            continue
        grad, mu, nu = (now.want[now.index[path]] for path in paths)
        bounds[param] = adam_bounds(step, grad, mu, nu, tolerance, before.get(param), adamw)
    return bounds
