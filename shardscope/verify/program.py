"""What a step's traced program says about each of its outputs: how much rounding its value may carry (the
reductions it went through and the float types on the way) and where the step computes it.

A float sum of K terms whose order changes (as sharding changes it: partial sums per device, then a
collective) differs by about eps · √K · magnitude. The rounding errors of successive reductions are
independent, so their variances add: a value that went through reductions of sizes K1, K2, … carries about
eps · √(K1 + K2 + …) · magnitude. `Precision.reduction` is that sum along the worst path from the program's
inputs to the value (a scan's body counted once per iteration), `Precision.eps` the machine epsilon of the
coarsest float type on that path (a bfloat16 intermediate makes a float32 result as coarse as bfloat16).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

# Iterations of a scan body walked one by one; a longer scan's growth per iteration is extrapolated (it is
# the same every iteration once the carry's worst path runs through the body).
SCAN_ITERATIONS_WALKED = 3
# Equations whose output is their input, placed or typed anew: never where a value is computed.
_PASS_THROUGH = frozenset(
    {"convert_element_type", "reshard", "sharding_constraint", "copy", "copy_p", "pvary", "name", "device_put"}
)
# Sub-programs called once with the equation's inputs as their inputs, in order.
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}
_CALLS |= {"remat2": "jaxpr", "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}
_SUMS_OVER_AXES = frozenset({"reduce_sum", "reduce_prod"})
_CUMULATIVE = frozenset({"cumsum", "cumprod", "cumlogsumexp"})
_COLLECTIVE_SUMS = frozenset({"psum", "psum_invariant", "psum2", "reduce_scatter", "psum_scatter"})


@dataclass(frozen=True)
class Precision:
    """How much rounding a value may carry: the summed sizes of the reductions on its worst path, and the
    machine epsilon of the coarsest float type on it (0: an integer value, exact)."""

    reduction: float
    eps: float

    def tolerance(self, magnitude: float, safety: float) -> float:
        """The absolute difference a reordering of its sums may make on values of this magnitude."""
        return safety * self.eps * math.sqrt(max(self.reduction, 1.0)) * magnitude


EXACT = Precision(0.0, 0.0)


@dataclass(frozen=True)
class ProgramReading:
    """Per output of a program (flattened, in order): its precision and where the step computes it, as (the
    index of the top-level equation, its position among that equation's outputs); an output passed through
    unchanged is (-1, 0)."""

    precisions: tuple[Precision, ...]
    computed_at: tuple[tuple[int, int], ...]


def read_program(closed_jaxpr: Any, inputs: Sequence[Precision] | None = None) -> ProgramReading:
    """The precision and place of every output of a traced program (`jax.jit(f).trace(...).jaxpr`).

    Args:
      closed_jaxpr: the program.
      inputs: what each flattened input carries already (a state from earlier steps); exact when None.
    """
    jaxpr = closed_jaxpr.jaxpr
    given = list(inputs) if inputs is not None else [EXACT] * len(jaxpr.invars)
    start = [_own(var, reading) for var, reading in zip(jaxpr.invars, given, strict=True)]
    precisions = _walk(jaxpr, start, {})
    # An integer output (a count, an index) must come out equal: it carries no tolerance, whatever it was
    # computed from.
    exact = [_eps(getattr(var, "aval", None)) == 0.0 for var in jaxpr.outvars]
    precisions = [EXACT if integer else reading for integer, reading in zip(exact, precisions, strict=True)]
    return ProgramReading(tuple(precisions), tuple(_computed_at(jaxpr)))


def _eps(aval: Any) -> float:
    # JAX's finfo and issubdtype: numpy's own do not know bfloat16 or the float8 types.
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return 0.0
    try:
        return float(jnp.finfo(dtype).eps) if jnp.issubdtype(dtype, jnp.inexact) else 0.0
    except (TypeError, ValueError):  # extended dtypes (PRNG keys) are no numbers
        return 0.0


def _own(var: Any, reading: Precision) -> Precision:
    """A value's reading with its own type's epsilon counted in."""
    return Precision(reading.reduction, max(reading.eps, _eps(getattr(var, "aval", None))))


def _walk(jaxpr: Any, inputs: Sequence[Precision], axis_sizes: Mapping[str, int]) -> list[Precision]:
    env: dict[Any, Precision] = dict(zip(jaxpr.invars, inputs, strict=True))
    for var in jaxpr.constvars:
        env[var] = _own(var, EXACT)

    def read(var: Any) -> Precision:
        return EXACT if isinstance(var, Literal) else env.get(var, EXACT)

    for eqn in jaxpr.eqns:
        outs = _equation(eqn, [read(v) for v in eqn.invars], axis_sizes)
        for var, reading in zip(eqn.outvars, outs, strict=True):
            env[var] = _own(var, reading)
    return [read(var) for var in jaxpr.outvars]


def _joined(readings: Sequence[Precision]) -> Precision:
    if not readings:
        return EXACT
    return Precision(max(r.reduction for r in readings), max(r.eps for r in readings))


def _plus(reading: Precision, size: float) -> Precision:
    return Precision(reading.reduction + size, reading.eps)


def _equation(eqn: Any, ins: list[Precision], axis_sizes: Mapping[str, int]) -> list[Precision]:
    name = eqn.primitive.name
    count = len(eqn.outvars)
    if name in _CALLS and _CALLS[name] in eqn.params:
        return _call(eqn.params[_CALLS[name]], ins, axis_sizes, count)
    if name == "shard_map":
        sizes = {**axis_sizes, **{str(k): int(v) for k, v in dict(eqn.params["mesh"].shape).items()}}
        return _call(eqn.params["jaxpr"], ins, sizes, count)
    if name == "scan":
        return _scan(eqn, ins, axis_sizes)
    if name == "cond":
        branches = [_call(branch, ins[1:], axis_sizes, count) for branch in eqn.params["branches"]]
        return [_joined([b[i] for b in branches] + [ins[0]]) for i in range(count)]
    joined = _joined(ins)
    nested = [value for value in eqn.params.values() if _programs(value)]
    if nested:
        # Any other equation with programs inside (a while loop, …): each runs once on the joined inputs.
        inner = [_joined(_walk_any(p, joined, axis_sizes)) for value in nested for p in _programs(value)]
        return [_joined([joined, *inner])] * count
    return [_plus(joined, _reduced(eqn, axis_sizes))] * count


def _reduced(eqn: Any, axis_sizes: Mapping[str, int]) -> float:
    """How many terms each output element of the equation sums (0: no sum)."""
    name = eqn.primitive.name
    shape = lambda index: tuple(getattr(eqn.invars[index].aval, "shape", ()))  # noqa: E731
    if name == "dot_general":
        (contracting, _), _ = eqn.params["dimension_numbers"]
        return float(math.prod(shape(0)[d] for d in contracting))
    if name in _SUMS_OVER_AXES:
        return float(math.prod(shape(0)[a] for a in eqn.params["axes"]))
    if name in _CUMULATIVE:
        return float(shape(0)[eqn.params["axis"]])
    if name in _COLLECTIVE_SUMS:
        axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
        axes = axes if isinstance(axes, tuple | list) else (axes,)
        return float(math.prod(shape(0)[a] if isinstance(a, int) else axis_sizes.get(str(a), 1) for a in axes))
    if name in ("scatter-add", "scatter_add"):
        window = set(eqn.params["dimension_numbers"].update_window_dims)
        updates = shape(2)
        return float(math.prod(size for dim, size in enumerate(updates) if dim not in window))
    if name == "conv_general_dilated":
        kernel = shape(1)
        out_features = eqn.params["dimension_numbers"].rhs_spec[0]
        return float(math.prod(size for dim, size in enumerate(kernel) if dim != out_features))
    return 0.0


def _programs(value: Any) -> list[Any]:
    values = value if isinstance(value, tuple | list) else (value,)
    return [v for v in values if isinstance(v, ClosedJaxpr | Jaxpr)]


def _open(program: Any) -> Any:
    return getattr(program, "jaxpr", program)


def _walk_any(program: Any, reading: Precision, axis_sizes: Mapping[str, int]) -> list[Precision]:
    jaxpr = _open(program)
    return _walk(jaxpr, [reading] * len(jaxpr.invars), axis_sizes)


def _call(program: Any, ins: list[Precision], axis_sizes: Mapping[str, int], count: int) -> list[Precision]:
    jaxpr = _open(program)
    if len(jaxpr.invars) != len(ins) or len(jaxpr.outvars) != count:
        return [_joined(_walk_any(jaxpr, _joined(ins), axis_sizes))] * count
    return _walk(jaxpr, ins, axis_sizes)


def _scan(eqn: Any, ins: list[Precision], axis_sizes: Mapping[str, int]) -> list[Precision]:
    """A scan's outputs after `length` iterations: the body walked a few times with its carry fed back, and the
    growth of the last iteration extrapolated over the rest."""
    body = _open(eqn.params["jaxpr"])
    consts, carries = _scan_inputs(eqn.params)
    length = int(eqn.params["length"])
    fixed, carry, xs = ins[:consts], ins[consts : consts + carries], ins[consts + carries :]
    previous: list[Precision] = []
    outs: list[Precision] = []
    walked = max(1, min(length, SCAN_ITERATIONS_WALKED))
    for _ in range(walked):
        previous = outs
        outs = _walk(body, [*fixed, *carry, *xs], axis_sizes)
        carry = outs[:carries]
    if length > walked and previous:
        remaining = length - walked
        outs = [
            Precision(o.reduction + remaining * max(o.reduction - p.reduction, 0.0), o.eps)
            for o, p in zip(outs, previous, strict=True)
        ]
    return outs


def _scan_inputs(params: Mapping[str, Any]) -> tuple[int, int]:
    """How many of a scan's inputs are constants and how many its carry (the rest are the scanned xs). JAX 0.10
    counts them (`num_consts`, `num_carry`); JAX 0.11 groups its inputs as (consts, carry, xs) in `ft_in`."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts.vals)), len(list(carry.vals))


def _computed_at(jaxpr: Any) -> list[tuple[int, int]]:
    """Per output, the top-level equation that computes it (through equations that only place or retype)."""
    producer: dict[Any, tuple[int, int]] = {}
    passes: dict[Any, Any] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        for position, var in enumerate(eqn.outvars):
            producer[var] = (index, position)
            if eqn.primitive.name in _PASS_THROUGH and len(eqn.invars) == 1:
                passes[var] = eqn.invars[0]

    def origin(var: Any) -> tuple[int, int]:
        if isinstance(var, Literal):  # a constant output (a metric the step fixes): computed nowhere
            return (-1, 0)
        seen = 0
        while var in passes and seen < len(jaxpr.eqns):
            var, seen = passes[var], seen + 1
        return producer.get(var, (-1, 0))

    return [origin(var) for var in jaxpr.outvars]
