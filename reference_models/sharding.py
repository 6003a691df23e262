"""The sharding context the models run under, and the helper they call instead of a bare constraint.

The context (mesh, logical→physical resolver, MoE strategy, and the list of recorded
activation shardings) lives in a ContextVar for the duration of one trace, so two traces never share a
record and nothing has to be cleared by hand. Without a context the models run unsharded (one device).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import jax

from reference_models.config import PipelineSettings

# Maps a logical-axes tuple to a PartitionSpec (the preset's rules, resolved).
Resolver = Callable[[Sequence[str | None]], jax.sharding.PartitionSpec]
# Checks (path, shape, spec) before a constraint: raises, or returns the spec to use (None: keep it).
Validator = Callable[[str, tuple[int, ...], jax.sharding.PartitionSpec], jax.sharding.PartitionSpec | None]


@dataclass(frozen=True)
class ActivationRecord:
    """One activation constraint as traced: where, what it is, and where it was put."""

    path: str
    logical: tuple[str | None, ...] | None  # None: a physical-only constraint (no logical names)
    shape: tuple[int, ...]
    dtype: str
    spec: jax.sharding.PartitionSpec


@dataclass(frozen=True)
class ShardingContext:
    """Everything a model needs to place its activations on a mesh during one trace."""

    mesh: jax.sharding.Mesh
    resolve: Resolver
    moe_strategy: str = "all_to_all"
    # Set when the main layer stack runs as a pipeline over a stage axis of more than one device.
    pipeline: PipelineSettings | None = None
    # With a pipeline, the rules the layers it does not run (DeepSeek's dense layers) are placed by: the stage
    # axis acting as data (MaxText's `logical_axis_rules_pp_act_as_dp`). None: `resolve`.
    resolve_outside_pipeline: Resolver | None = None
    # Called with (path, shape, spec) before constraining; raises if the spec cannot shard the shape, or
    # returns the spec to use instead (None: the spec as it is).
    validate: Validator | None = None
    records: list[ActivationRecord] = field(default_factory=list)
    # Every logical-axes tuple the trace resolved, recorded or not (the MoE resolves the spec it places its
    # expert weights on without recording a logical name): filled by a resolver that records what it is asked.
    resolved: set[tuple[str | None, ...]] = field(default_factory=set)

    @property
    def explicit(self) -> bool:
        """Whether the mesh's axes are Explicit (shardings are part of array types)."""
        return is_explicit(self.mesh)

    @property
    def platform(self) -> str:
        """The platform the step is traced for: "cpu" or "tpu" (a TPU topology compiled ahead of time)."""
        return str(self.mesh.devices.flat[0].platform)


_CURRENT: contextvars.ContextVar[ShardingContext | None] = contextvars.ContextVar("sharding_context", default=None)
# Module path of a layer applied on its own (the pipeline applies one layer at a time), so that what it
# records is named as if the layer ran inside its stack.
_PREFIX: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("path_prefix", default=())


@contextlib.contextmanager
def sharding_context(context: ShardingContext) -> Iterator[ShardingContext]:
    """Runs the enclosed trace under `context`."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def unsharded() -> Iterator[None]:
    """Runs the enclosed trace without a context: nothing is constrained or recorded (an abstract init)."""
    token = _CURRENT.set(None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def path_prefix(prefix: Sequence[str]) -> Iterator[None]:
    """Records activations of the enclosed trace under `prefix` + their module's own path."""
    token = _PREFIX.set(tuple(prefix))
    try:
        yield
    finally:
        _PREFIX.reset(token)


def current_context() -> ShardingContext | None:
    """The active context, or None when running unsharded."""
    return _CURRENT.get()


def entry_axes(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry: None, "axis" or ("a", "b")."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def without_axes(spec: jax.sharding.PartitionSpec, axes: tuple[str, ...]) -> jax.sharding.PartitionSpec:
    """`spec` with `axes` taken out of every entry (an entry left with none is replicated)."""
    entries = []
    for entry in spec:
        kept = tuple(name for name in entry_axes(entry) if name not in axes)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return jax.sharding.PartitionSpec(*entries)


def is_explicit(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh) -> bool:
    """Whether the mesh's axes are of type Explicit (shardings are part of array types)."""
    return any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def ambient_mesh(context: ShardingContext) -> jax.sharding.Mesh | None:
    """The mesh to give a shard_map: None (the mesh in context, which knows the axes an enclosing shard_map
    made manual) while tracing under `jax.set_mesh`, else the context's mesh."""
    return None if not jax.sharding.get_abstract_mesh().empty else context.mesh


def place(context: ShardingContext, x: jax.Array, spec: jax.sharding.PartitionSpec) -> jax.Array:
    """Puts `x` on `spec`: a constraint for Auto axes, a reshard for Explicit ones.

    With explicit axes a sharding is part of the array's type, so the array is moved rather than asserted;
    the bare spec refers to the ambient mesh (set while tracing).
    """
    if context.explicit:
        return jax.sharding.reshard(x, spec)
    if jax.sharding.get_abstract_mesh().manual_axes:
        # Inside a shard_map (a pipeline stage): the spec refers to the mesh in context, whose stage axis
        # is manual there.
        return jax.lax.with_sharding_constraint(x, spec)
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(context.mesh, spec))


def constrain(
    module_path: Sequence[str],
    name: str,
    x: jax.Array,
    logical: Sequence[str | None],
    adjust: Callable[[jax.sharding.PartitionSpec], jax.sharding.PartitionSpec] | None = None,
) -> jax.Array:
    """Constrains an activation to the sharding its logical axes resolve to, and records it.

    Args:
      module_path: the calling Flax module's path (`self.path`).
      name: the activation's name within the module: the name MaxText's model gives the same value
        ("inputs_q", "q_nope", "mlp_lnx", ...), so that plans and MaxText's dumps line up.
      x: the activation.
      logical: one logical axis name per dimension.
      adjust: applied to the rules' spec first (a pipeline's loop state is split over its stage axis whatever
        the rules say of `activation_stage`); the spec placed is the one recorded.

    Returns:
      `x` with a sharding constraint (unchanged when no context is active).
    """
    context = _CURRENT.get()
    if context is None:
        return x
    spec = context.resolve(logical)
    return _record_and_place(context, module_path, name, x, tuple(logical), spec if adjust is None else adjust(spec))


def constrain_physical(
    module_path: Sequence[str], name: str, x: jax.Array, spec: jax.sharding.PartitionSpec
) -> jax.Array:
    """Constrains a value to a physical spec that no logical names describe, and records it.

    MaxText's MoE places its expert weights this way before the expert computation (the spec of their
    logical axes with FSDP removed), so that they are gathered over FSDP once, outside the MoE kernel.
    """
    context = _CURRENT.get()
    if context is None:
        return x
    return _record_and_place(context, module_path, name, x, None, spec)


def _record_and_place(
    context: ShardingContext,
    module_path: Sequence[str],
    name: str,
    x: jax.Array,
    logical: tuple[str | None, ...] | None,
    spec: jax.sharding.PartitionSpec,
) -> jax.Array:
    path = "/".join((*_PREFIX.get(), *module_path, name))
    if context.validate is not None:
        spec = context.validate(path, tuple(x.shape), spec) or spec
    record = ActivationRecord(path=path, logical=logical, shape=tuple(x.shape), dtype=str(x.dtype), spec=spec)
    context.records.append(record)
    return place(context, x, spec)


def named_on(mesh: jax.sharding.Mesh | None, spec: jax.sharding.PartitionSpec) -> jax.sharding.NamedSharding:
    """A sharding on `mesh`, or on the ambient mesh's axes where `mesh` is None (see `ambient_mesh`)."""
    return jax.sharding.NamedSharding(mesh if mesh is not None else jax.sharding.get_abstract_mesh(), spec)
