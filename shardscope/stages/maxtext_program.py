"""MaxText's own training step, built as MaxText's `train_compile` builds it, then lowered and compiled.

The step is MaxText's, not a copy: its config from its own command line (`pyconfig.initialize`), its mesh
(`get_topology_mesh` for a TPU topology; `create_device_mesh` on the fake CPU devices otherwise), its abstract
train state and shardings (`get_shaped_inputs`), ZeRO-1's parameter shardings, its input sharding and its
jitted `train_step` (`get_functional_train_with_signature`). It is traced inside MaxText's own contexts, its
mesh and `nn_partitioning.axis_rules(config.logical_axis_rules)`: outside them MaxText's constraints resolve
against no rules and a different program compiles without a word.

MaxText records each activation constraint it makes (with `debug_sharding`) in a module-level list; the list
is emptied before a build and read after it, so a plan holds the constraints of its own step only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardscope.case.maxtext_model import MaxTextCase, MaxTextError
from shardscope.case.preset_lint import LintSettings
from shardscope.case.presets import Preset
from shardscope.case.rules import Rule
from shardscope.errors import MemoryExhaustedError
from shardscope.stages.compiler_log import capture_compiler_log
from shardscope.stages.devices import tpu_devices
from shardscope.stages.maxtext_gpu import gpu_compile_error, gpu_compile_options, gpu_mesh_grid
from shardscope.stages.maxtext_target import on_target
from shardscope.stages.user_step import one_line


@dataclass(frozen=True)
class TrainFunction:
    """MaxText's jitted train step before it is jitted: the function (`train_step` with MaxText's model, config
    and shardings bound, as `get_functional_train_with_signature` binds them) and what `jax.jit` takes."""

    function: Any
    in_shardings: Any
    out_shardings: Any
    static_argnums: Any
    donate_argnums: Any
    model: Any  # the Linen model, or the NNX train state's graphdef
    params_shardings: Any


@dataclass(frozen=True)
class MaxTextStep:
    """MaxText's train step, built (abstract state and shardings) and, unless only its tensors are asked for,
    lowered and compiled."""

    case: MaxTextCase
    config: Any  # MaxText's config object
    mesh: Any  # jax.sharding.Mesh
    state: Any  # the abstract train state (TrainState of ShapeDtypeStructs, or an NNX state)
    state_shardings: Any  # NamedSharding per state leaf, as the step takes them
    logical: Any  # PartitionSpec of logical axis names per state leaf (MaxText's logical annotations)
    batch: dict[str, Any]  # the shaped batch
    batch_sharding: Any  # the input data sharding (one NamedSharding for every batch field)
    activations: tuple[dict[str, Any], ...]  # MaxText's activation-sharding dump entries of this build
    lowered: Any = None
    compiled: Any = None
    compiler_log: str = ""
    compiler_log_visible: bool = True
    train: TrainFunction | None = None

    @property
    def nnx(self) -> bool:
        """Whether the step is MaxText's NNX model's (its state a TrainStateNNX, no dropout key argument) rather
        than its Linen model's. A release without Linen (0.2.5) has no `pure_nnx` key: NNX."""
        return bool(getattr(self.config, "pure_nnx", True))


def _import_maxtext(case: MaxTextCase) -> None:
    """Puts the case's MaxText tree first on the import path; one process plans one tree."""
    # MaxText's own switch for its Google Cloud parts (goodput recording, GCS, diagnostics): stubbed, as a
    # compile for planning uses none of them, so `shardscope[maxtext]` need not install their clients. MaxText
    # reads it as each part is first imported.
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")
    src = str(case.tree.src)
    loaded = sys.modules.get("maxtext")
    if loaded is not None:
        where = next(iter(getattr(loaded, "__path__", [])), "")
        if not where.startswith(src):
            raise MaxTextError(
                f"this process already imported MaxText from {where}; plan {src} in a process of its own"
            )
        return
    if case.tree.checkout and src not in sys.path:
        sys.path.insert(0, src)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """MaxText prints its progress on standard output, where a plan may be going (`-o -`), and logs its
    defaults (an output directory, a deprecated data pipeline) as warnings: both kept off the terminal. What
    MaxText refuses still reaches the user, as the one-line error its exception becomes. The deprecations
    MaxText's code meets in its own dependencies are MaxText's to act on, not its users'."""
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


@contextlib.contextmanager
def _maxtext_rng() -> Iterator[None]:
    """MaxText's train_compile runs with the `unsafe_rbg` PRNG (its keys, and so its step's RNG arguments, are
    four words, not two); set for this build only, so that other plans of the process keep JAX's default."""
    from jax._src import config  # lazy: the scoped form of `jax.config.update("jax_default_prng_impl", …)`

    # The TPU compiler's flag that goes with it, as train_compile sets it (read when libtpu starts).
    flag = "--xla_tpu_spmd_rng_bit_generator_unsafe=true"
    if flag not in os.environ.get("LIBTPU_INIT_ARGS", ""):
        os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {flag}".strip()
    with config.default_prng_impl("unsafe_rbg"):
        yield


@contextlib.contextmanager
def maxtext_scope(step: MaxTextStep, mesh: bool = False, rules: bool = False) -> Iterator[None]:
    """MaxText's contexts for running its code on a built step: quiet, its PRNG, and (asked for) its mesh and
    its logical axis rules, as its training loop sets them."""
    import jax  # lazy: JAX starts once the device pool is sized
    from flax.linen import partitioning as nn_partitioning

    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_stdout())
        stack.enter_context(_maxtext_rng())
        if mesh or rules:
            stack.enter_context(jax.set_mesh(step.mesh))
            stack.enter_context(_legacy_mesh(step.case, step.config, step.mesh))
        if rules:
            stack.enter_context(nn_partitioning.axis_rules(step.config.logical_axis_rules))
        yield


def _legacy_mesh(case: MaxTextCase, config: Any, mesh: Any) -> Any:
    """The mesh's legacy context (`with mesh:`) where the release's train_compile and training loop enter it
    besides `jax.set_mesh` (0.2.4 always; 0.2.5 for DiLoCo only, whose drjax reads it), else no context."""
    legacy = case.tree.release.mesh_context_always or bool(getattr(config, "enable_diloco", False))
    return mesh if legacy else contextlib.nullcontext()


# MaxText's config refusing a key it does not have: "'pure_nnx' not in 'emb_dim', 'mlp_dim', …" (0.2.5 has no
# `pure_nnx`: a 0.2.4 command line that asks for Linen).
_UNKNOWN_KEY = re.compile(r"'(\w+)' not in '")


def config_error(err: Exception) -> str:
    """MaxText's own complaint about a command line, as one line."""
    errors = getattr(err, "errors", None)
    if callable(errors):  # pydantic's ValidationError: the first field it refused, and why
        try:
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
        except (TypeError, IndexError, AttributeError):
            pass
    return one_line(err)


def maxtext_config(case: MaxTextCase) -> Any:
    """MaxText's config of the case's command line.

    Raises:
      MaxTextError: MaxText refuses the command line (its own message), or cannot be imported.
    """
    _import_maxtext(case)
    try:
        with _quiet_stdout():  # MaxText announces the optional parts it stubs as it is imported
            from maxtext.configs import pyconfig  # lazy: MaxText is an optional extra
            from maxtext.trainers.pre_train import train_compile  # noqa: F401  # the rest of its imports, quietly
    except ImportError as err:
        raise MaxTextError(f"MaxText {case.tree.version} cannot be imported ({one_line(err)})") from None
    try:
        with _quiet_stdout():
            return pyconfig.initialize(["shardscope", *case.argv()])
    except Exception as err:  # MaxText's config raises ValueError, pydantic errors, AssertionError, …
        unknown = _UNKNOWN_KEY.match(str(err))
        if unknown is not None:  # MaxText's message goes on to list every key it has: the name is the news
            key = unknown.group(1)
            raise MaxTextError(f"--maxtext {key}=…: MaxText {case.tree.version} has no key {key!r}") from None
        raise MaxTextError(f"MaxText's config refused maxtext:{case.model}: {config_error(err)}") from None


def _mesh(case: MaxTextCase, config: Any, devices: Sequence[Any] | None = None) -> Any:
    import jax  # lazy: JAX starts once the device pool is sized
    from jax.sharding import AxisType, Mesh
    from maxtext.common.common_types import ShardMode
    from maxtext.trainers.pre_train import train_compile
    from maxtext.utils import maxtext_utils

    if case.topology.tpu is not None:
        tpu_devices(case.topology.tpu, case.topology.slices)  # libtpu's check and quiet environment
        return train_compile.get_topology_mesh(config)
    axis_type = AxisType.Explicit if config.shard_mode == ShardMode.EXPLICIT else AxisType.Auto
    if case.topology.gpu is not None:
        grid = gpu_mesh_grid(case.topology.gpu, config)
        return Mesh(grid, config.mesh_axes, axis_types=(axis_type,) * len(config.mesh_axes))
    devices = sorted(jax.devices(), key=lambda d: d.id) if devices is None else list(devices)
    if len(devices) != case.topology.num_devices:
        # MaxText sizes its batch and its -1 axes by the process's device count.
        raise MaxTextError(
            f"maxtext:{case.model} on {case.topology.name} needs a process of {case.topology.num_devices} "
            f"CPU devices; this one has {len(devices)}"
        )
    grid = maxtext_utils.create_device_mesh(config, devices)
    return Mesh(grid, config.mesh_axes, axis_types=(axis_type,) * len(config.mesh_axes))


def build_maxtext_step(
    case: MaxTextCase, lower: bool = True, compile_step: bool = True, devices: Sequence[Any] | None = None
) -> MaxTextStep:
    """MaxText's train step of a case: its state and shardings, and (with `lower`) its lowered and (with
    `compile_step`) compiled program.

    `devices`: the CPU devices its mesh is built on (default: every device of the process, as MaxText builds
    it; a single device for a run whose command line says so, see `verify`).

    Raises:
      MaxTextError: MaxText refuses the command line or cannot build the step (its message, one line).
      MemoryExhaustedError: the TPU compiler cannot fit the step in device memory.
    """
    import jax  # lazy: JAX starts once the device pool is sized
    from flax.linen import partitioning as nn_partitioning

    config = maxtext_config(case)
    from maxtext.trainers.pre_train import train, train_compile  # lazy: MaxText is an optional extra
    from maxtext.utils import maxtext_utils, sharding

    sharding.clear_input_shardings_dump()
    try:
        with _quiet_stdout(), _maxtext_rng():
            mesh = _mesh(case, config, devices)
        with _quiet_stdout(), _maxtext_rng(), on_target(case, mesh):
            args, kwargs, state_shardings, logical, model = train_compile.get_shaped_inputs(mesh, config)
            params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
            input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
            data_sharding = sharding.get_input_data_sharding(config, mesh)
            function, in_shardings, out_shardings, static, donate = maxtext_utils.get_functional_train_with_signature(
                train.train_step, data_sharding, input_shardings, model, config, params_shardings
            )
    except MaxTextError:
        raise
    except Exception as err:  # MaxText's own code refusing the case (asserts, ValueErrors)
        raise MaxTextError(f"MaxText could not build maxtext:{case.model}: {config_error(err)}") from None
    built = MaxTextStep(
        case=case,
        config=config,
        mesh=mesh,
        state=args[0],
        state_shardings=input_shardings,
        logical=logical,
        batch=dict(args[1]),
        batch_sharding=data_sharding,
        activations=tuple(sharding._ACTIVATION_SHARDINGS_DUMP),
        train=TrainFunction(function, in_shardings, out_shardings, static, donate, model, params_shardings),
    )
    if not lower:
        return built
    rules = nn_partitioning.axis_rules(config.logical_axis_rules)
    legacy_mesh = _legacy_mesh(case, config, mesh)
    try:
        with _quiet_stdout(), _maxtext_rng(), on_target(case, mesh), jax.set_mesh(mesh), legacy_mesh, rules:
            jitted = jax.jit(
                function,
                in_shardings=in_shardings,
                out_shardings=out_shardings,
                static_argnums=static,
                donate_argnums=donate,
            )
            lowered = jitted.lower(*args, **kwargs)
    except Exception as err:  # MaxText's step refusing the case while it is traced
        raise MaxTextError(
            f"MaxText's train step of maxtext:{case.model} does not trace: {config_error(err)}"
        ) from None
    activations = tuple(sharding._ACTIVATION_SHARDINGS_DUMP)
    if not compile_step:
        return dataclasses.replace(built, lowered=lowered, activations=activations)
    from maxtext.utils import max_utils  # lazy: MaxText is an optional extra

    # MaxText hands its `compile_xla_flags` to a TPU compile; a GPU compile takes them too (the options of a
    # GPU run's XLA_FLAGS), and the CPU route its own compile as MaxText runs it.
    options = max_utils.parse_libtpu_flags_to_dict(config.compile_xla_flags) if case.topology.platform != "cpu" else {}
    if case.topology.gpu is not None:
        options = gpu_compile_options(options)
    try:
        with capture_compiler_log() as log:
            compiled = lowered.compile(compiler_options=options)
    except jax.errors.JaxRuntimeError as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        refused = gpu_compile_error(case, message) if case.topology.gpu is not None else None
        if refused is not None:
            raise MaxTextError(refused) from None
        if "RESOURCE_EXHAUSTED" in message:
            raise MemoryExhaustedError(
                f"maxtext:{case.model} on {case.topology.name}: the compiler cannot fit the step in device memory "
                f"({message.removeprefix('RESOURCE_EXHAUSTED: ')}); lower per_device_batch_size, use more devices, "
                "or plan shardings alone with --tensors-only"
            ) from None
        if "ragged" in message.lower() or "ragged-all-to-all" in str(err):
            raise MaxTextError(
                f"maxtext:{case.model} on {case.topology.name}: XLA's CPU compiler cannot compile MaxText's "
                "ragged all-to-all (its dropless MoE under expert parallelism); plan it on a TPU topology "
                "(--topology v5p-8, …), or run MaxText's dense path with --maxtext 'sparse_matmul=false'"
            ) from None
        raise
    return dataclasses.replace(
        built,
        lowered=lowered,
        compiled=compiled,
        activations=activations,
        compiler_log=log.text,
        compiler_log_visible=log.visible,
    )


def maxtext_rules(config: Any) -> tuple[Rule, ...]:
    """MaxText's logical axis rules of a config, as shardscope's rules: (logical name, mesh axes)."""
    rules = []
    for name, axes in config.logical_axis_rules:
        named = (axes,) if isinstance(axes, str) else tuple(axes or ())
        rules.append((str(name), tuple(str(a) for a in named)))
    return tuple(rules)


def maxtext_preset(step: MaxTextStep) -> Preset:
    """What MaxText's config says about sharding, as a preset: its mesh axes and sizes, its rules (base.yml's,
    merged with the model's and a `custom_mesh_and_rule` file's, as MaxText merged them), its input sharding
    and its shard mode; what the lints and `explain` read."""
    config = step.config
    return Preset(
        name=step.case.rule,
        origin=f"MaxText {step.case.tree.version}",
        mesh_axes=tuple(str(a) for a in config.mesh_axes),
        mesh=tuple((str(axis), int(size)) for axis, size in step.mesh.shape.items()),
        data_sharding=tuple(tuple(str(a) for a in group) for group in config.data_sharding),
        input_data_sharding_logical_axes=tuple(str(a) for a in config.input_data_sharding_logical_axes),
        logical_axis_rules=maxtext_rules(config),
        shard_mode="explicit" if str(getattr(config.shard_mode, "value", config.shard_mode)) == "explicit" else "auto",
        lint=MAXTEXT_RULE_LINTS,
    )


# MaxText's rules (base.yml, merged with the model's and the rule file's) serve every MaxText model, inference
# and pipelines, on a twelve-axis mesh: most rules match nothing of one model, some only where an earlier
# axis is taken, and most axes are size 1. As for the built-in presets that carry MaxText's files, the lints
# that would report that are silenced; the tensor, compile and memory lints run.
MAXTEXT_RULE_LINTS = LintSettings(ignore=("dead-rule", "shadowed-rule", "unit-axis-rule"))
