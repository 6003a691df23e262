"""MaxText's train step run for real (what `verify maxtext:MODEL` runs): MaxText's own initial state, its own
synthetic batch, and its jitted `train_step` with the gradients it computes brought out as extra outputs.

- The initial state is MaxText's: the init function its training loop builds (`setup_train_loop`: the model,
  its optimizer, the key `init_weights_seed`), run by `setup_training_state` with no checkpoint to restore.
- The batch is MaxText's synthetic data (`SyntheticDataIterator`: tokens from a fixed key, every position in
  one segment); MaxText feeds the same batch at every step.
- The gradients are those `train_step` computes: the tree whose norm it reports as `learning/raw_grad_norm`
  (read while the step is traced, by watching MaxText's `max_utils.l2norm_pytree`; the step itself is
  unchanged, it only returns one more tree).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shardscope.case.maxtext_model import MaxTextError
from shardscope.stages.maxtext_program import MaxTextStep, config_error, maxtext_scope

# What MaxText's train step reports as the norm of the gradients before clipping.
RAW_GRAD_NORM = "learning/raw_grad_norm"
LOSS = "learning/loss"


@dataclass(frozen=True)
class TrainProgram:
    """MaxText's step jitted and compiled with its gradients as a third output: `(state, batch[, rng]) →
    (new state, metrics, gradients)`, and its traced program (what `verify.program` reads)."""

    compiled: Any
    jaxpr: Any


def _train(step: MaxTextStep) -> Any:
    if step.train is None:
        raise MaxTextError(f"maxtext:{step.case.model}: the step was built without its train function")
    return step.train


def _init_state_fn(step: MaxTextStep) -> Callable[[], Any]:
    """The init function MaxText's training loop builds (`train_utils.setup_train_loop`), on this step's mesh."""
    import jax  # lazy: MaxText is an optional extra
    from flax import nnx
    from maxtext.common import train_state_nnx
    from maxtext.utils import maxtext_utils, model_creation_utils
    from maxtext.utils.train_utils import create_training_optimizer

    config, mesh = step.config, step.mesh
    if step.nnx:
        create_model, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
        # 0.2.5's loop gives the optimizer its mesh (Muon's); 0.2.4's takes none.
        on_mesh = {"mesh": mesh} if "mesh" in inspect.signature(create_training_optimizer).parameters else {}
        _, tx = create_training_optimizer(config, model, **on_mesh)

        lora = getattr(getattr(config, "lora", None), "enable_lora", False)
        wrt = getattr(nnx, "LoRAParam", nnx.Param) if lora else nnx.Param

        def create_train_state() -> Any:
            created = create_model()
            return train_state_nnx.TrainStateNNX(created, nnx.Optimizer(created, tx, wrt=wrt))

        return create_train_state
    # The Linen model the step was built with (train_compile's, on the step's mesh; MaxText's `from_config`
    # would build one on every device of the process).
    # Its optimizer too: a Linen train state holds it as static data, which the compiled step's input must match.
    linen, tx = _train(step).model, step.state.tx
    key = jax.random.PRNGKey(config.init_weights_seed)
    return lambda: maxtext_utils.init_initial_state(linen, tx, config, True, key)


def initial_state(step: MaxTextStep) -> Any:
    """MaxText's initial train state of the step's config on its mesh, placed as the step takes it."""
    from maxtext.utils import maxtext_utils  # lazy: MaxText is an optional extra

    try:
        with maxtext_scope(step):
            init = _init_state_fn(step)
            state, *_ = maxtext_utils.setup_training_state(None, step.config, step.mesh, None, init)
    except Exception as err:  # MaxText's own code refusing the case (asserts, ValueErrors)
        raise MaxTextError(f"MaxText could not initialise maxtext:{step.case.model}: {config_error(err)}") from None
    return state


def as_state_of(step: MaxTextStep, state: Any) -> Any:
    """A train state's arrays in the tree of `step`'s own state (a Linen state holds its model's `apply` and
    its optimizer as static data, which each side's compiled step checks against its own).

    Raises:
      MaxTextError: the two states hold different numbers of arrays.
    """
    import jax  # lazy: JAX starts once the device pool is sized

    leaves, own = jax.tree.leaves(state), jax.tree.leaves(step.state)
    if len(leaves) != len(own):
        raise MaxTextError(
            f"the two sides of maxtext:{step.case.model} hold different train states ({len(leaves)} vs "
            f"{len(own)} arrays); verify compares the same step under two shardings"
        )
    return jax.tree.unflatten(jax.tree.structure(step.state), leaves)


def synthetic_batch(step: MaxTextStep) -> dict[str, Any]:
    """MaxText's synthetic batch of the step's config (what `dataset_type=synthetic` trains on), on the host."""
    import numpy as np  # lazy: MaxText is an optional extra
    from maxtext.input_pipeline.synthetic_data_processing import SyntheticDataIterator

    try:
        with maxtext_scope(step, mesh=True):
            batch = next(iter(SyntheticDataIterator(step.config, step.mesh)))
    except Exception as err:  # MaxText's own code refusing the case
        raise MaxTextError(
            f"MaxText's synthetic data for maxtext:{step.case.model} failed: {config_error(err)}"
        ) from None
    return {name: np.asarray(value) for name, value in batch.items()}


def step_rng(step: MaxTextStep, index: int) -> Any:
    """The dropout key MaxText's training loop gives a Linen step (`fold_in(init_rng, step)`); None for NNX."""
    import jax  # lazy: JAX starts once the device pool is sized

    if step.nnx:
        return None
    with maxtext_scope(step):
        return jax.random.fold_in(jax.random.PRNGKey(step.config.init_weights_seed), index)


@contextlib.contextmanager
def _watching_norms(calls: list[tuple[Any, Any]]) -> Iterator[None]:
    """Records every tree MaxText takes the L2 norm of, with the norm, while the step is traced."""
    from maxtext.utils import max_utils  # lazy: MaxText is an optional extra

    real = max_utils.l2norm_pytree

    def recording(tree: Any) -> Any:
        norm = real(tree)
        calls.append((tree, norm))
        return norm

    max_utils.l2norm_pytree = recording
    try:
        yield
    finally:
        max_utils.l2norm_pytree = real


def _with_gradients(step: MaxTextStep, function: Callable[..., Any]) -> Callable[..., Any]:
    def train_step(*args: Any) -> Any:
        calls: list[tuple[Any, Any]] = []
        with _watching_norms(calls):
            new_state, metrics = function(*args)
        norm = metrics.get("scalar", {}).get(RAW_GRAD_NORM)
        grads = next((tree for tree, value in calls if value is norm), None)
        if grads is None:
            raise MaxTextError(
                f"maxtext:{step.case.model}: MaxText's train step reports no {RAW_GRAD_NORM} (it does not with "
                "optimizer_memory_host_offload=true), so its gradients cannot be compared"
            )
        return new_state, metrics, grads

    return train_step


def compile_train_program(step: MaxTextStep) -> TrainProgram:
    """MaxText's jitted step (its shardings, its donation) with its gradients as a third output, traced inside
    MaxText's contexts and compiled for the step's mesh.

    Raises:
      MaxTextError: the step reports no gradients, or does not trace (MaxText's message, one line).
    """
    import jax  # lazy: JAX starts once the device pool is sized
    from jax.sharding import NamedSharding, PartitionSpec

    train = _train(step)
    args = [step.state, step.batch] if step.nnx else [step.state, step.batch, step_rng(step, 0)]
    try:
        with maxtext_scope(step, rules=True):
            jitted = jax.jit(
                _with_gradients(step, train.function),
                in_shardings=train.in_shardings,
                # The gradients are laid out as the compiler chooses; on one device they are whole.
                out_shardings=(
                    *train.out_shardings,
                    NamedSharding(step.mesh, PartitionSpec()) if step.mesh.size == 1 else None,
                ),
                static_argnums=train.static_argnums,
                donate_argnums=train.donate_argnums,
            )
            traced = jitted.trace(*args)
            compiled = traced.lower().compile()
    except MaxTextError:
        raise
    except Exception as err:  # MaxText's step refusing the case while it is traced or compiled
        if "ragged" in str(err).lower():
            raise MaxTextError(
                f"maxtext:{step.case.model}: XLA's CPU compiler cannot compile MaxText's ragged all-to-all (its "
                "dropless MoE under expert parallelism), so verify cannot run it; verify MaxText's dense MoE path "
                "with --maxtext 'sparse_matmul=false', or the same MoE without expert parallelism"
            ) from None
        raise MaxTextError(
            f"MaxText's train step of maxtext:{step.case.model} does not compile: {config_error(err)}"
        ) from None
    return TrainProgram(compiled, traced.jaxpr)
