"""The step that gets sharded: the forward pass, next-token loss, gradients and the optimizer's update."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from reference_models.decoder import HEAD_PARAMS, Transformer, next_token_loss
from reference_models.vocab_tiling import gathered_over_fsdp, split_over_fsdp, tiled_next_token_loss
from shardscope.case.resolve import Case


@dataclass(frozen=True)
class AdamW:
    """The optimizer's settings (what `verify` needs to know how a gradient's rounding reaches the update)."""

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


ADAMW = AdamW()


def make_optimizer(mu_dtype: str = "") -> optax.GradientTransformation:
    """AdamW with a learning-rate schedule, as MaxText builds it: its state is (Adam's count, mu, nu),
    weight decay's (empty), the schedule's count — the same tree MaxText's optimizer state has. `mu_dtype`:
    the first moment's dtype (MaxText's `mu_dtype`; "": the parameters')."""
    return optax.adamw(
        learning_rate=optax.constant_schedule(ADAMW.learning_rate),
        b1=ADAMW.b1,
        b2=ADAMW.b2,
        eps=ADAMW.eps,
        weight_decay=ADAMW.weight_decay,
        mu_dtype=mu_dtype or None,
    )


def make_loss(case: Case):
    """The forward pass and next-token loss: (params, batch) → loss. With `vocab_tiles` > 1 the loss runs
    over chunks of the tokens from the decoder's hidden states, as MaxText's `num_vocab_tiling` does."""
    model = Transformer(case.model)
    tiles = case.model.vocab_tiles

    def logits_of(head, hidden):
        return model.apply({"params": head}, None, hidden=hidden)

    def loss_of(params, batch):
        out: Any = model.apply({"params": params}, batch["tokens"])
        if tiles == 1:
            return next_token_loss(out, batch["targets"])
        head = {"decoder": {name: params["decoder"][name] for name in HEAD_PARAMS}}
        logical = {"decoder": HEAD_PARAMS}
        head = gathered_over_fsdp(head, logical)
        split = functools.partial(split_over_fsdp, logical=logical)
        return tiled_next_token_loss(logits_of, head, out, batch["targets"], tiles, split)

    return loss_of


def make_train_step(case: Case, zero1: tuple[Any, Any] | None = None, with_grads: bool = False):
    """Forward, next-token loss, gradients and an AdamW update: the step that gets sharded.

    `zero1`: (the parameters' shardings by the rules, their stored shardings). The parameters are stored
    split like the optimizer state and gathered to the rules' shardings before the forward pass, as
    MaxText's train step does with shard_optimizer_over_data; the update runs on the stored split (with
    Explicit axes, where shardings are types, the gradients are split to it first; with Auto axes the
    compiler places them, as in MaxText's program)."""
    loss_of = make_loss(case)
    optimizer = make_optimizer(case.model.mu_dtype)
    grad_dtype = jnp.dtype(case.model.grad_dtype)
    explicit = case.preset.shard_mode == "explicit"
    move = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint

    def placed(tree, shardings):
        return tree if shardings is None else jax.tree.map(move, tree, shardings)

    compute, stored = zero1 if zero1 is not None else (None, None)

    def train_step(state, batch):
        loss, grads = jax.value_and_grad(loss_of)(placed(state["params"], compute), batch)
        # MaxText casts float32 gradients to its `grad_dtype` before the optimizer.
        grads = jax.tree.map(lambda g: g.astype(grad_dtype) if g.dtype == jnp.float32 else g, grads)
        if explicit:
            grads = placed(grads, stored)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grads": grads} if with_grads else {"loss": loss}
        return {"params": params, "opt_state": opt_state}, metrics

    return train_step
