"""The next-token loss over chunks of the batch's tokens, as MaxText's `num_vocab_tiling` runs it.

MaxText's `vocabulary_tiling.py`: the decoder returns its hidden states (before the output head); the output
head's parameters are gathered over the FSDP axes once; a scan over `tiles` chunks of the batch's tokens
computes each chunk's logits and cross-entropy, so only one chunk's [tokens / tiles × vocab] logits live at a
time. The backward pass (a custom VJP) scans the chunks again: each chunk's logits are recomputed and
differentiated, the head's gradients accumulated over the chunks, the hidden states' gradient written per
chunk. The sum over chunks is the whole batch's: the loss equals the untiled one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from reference_models.config import FSDP_AXES
from reference_models.decoder import target_log_probs
from reference_models.sharding import current_context, place, without_axes

# MaxText's logical names for the loss's values (`vocabulary_tiling.py`); `num_tile` has no rule in base.yml.
_HIDDEN = ("activation_embed_and_logits_batch", "activation_length", "activation_embed")
_TARGETS = ("activation_embed_and_logits_batch", "activation_length")
_TILED_HIDDEN = ("num_tile", "activation_embed_and_logits_batch_sequence", "activation_embed")
_TILED_TARGETS = ("num_tile", "activation_embed_and_logits_batch_sequence")
_CHUNK_HIDDEN = ("activation_embed_and_logits_batch_sequence", "activation_embed")
_CHUNK_TARGETS = ("activation_embed_and_logits_batch_sequence",)
_CHUNK_LOGITS = ("activation_embed_and_logits_batch_sequence", "activation_vocab")

Logits = Callable[[Any, jax.Array], jax.Array]  # (head parameters, hidden [tokens, embed]) -> [tokens, vocab]


def _placed(x: jax.Array, logical: Sequence[str | None], what: str) -> jax.Array:
    """`x` on the sharding its logical axes resolve to (unchanged outside a sharding context). Not recorded
    as an activation: these are the loss's values, not the model's."""
    context = current_context()
    if context is None:
        return x
    spec = context.resolve(logical)
    if context.validate is not None:
        spec = context.validate(f"loss/{what}", tuple(x.shape), spec) or spec
    return place(context, x, spec)


def _reshaped(x: jax.Array, shape: tuple[int, ...], logical: Sequence[str | None], what: str) -> jax.Array:
    """`x` reshaped and placed; with Explicit axes the reshape is given its result's sharding, as MaxText's
    (a reshape that merges split dimensions has no sharding of its own)."""
    context = current_context()
    if context is None or not context.explicit:
        return _placed(x.reshape(shape), logical, what)
    return _placed(jax.lax.reshape(x, shape, out_sharding=context.resolve(logical)), logical, what)


def gathered_over_fsdp(params: Any, logical: Any) -> Any:
    """The head's parameters with their FSDP axes gathered (their other axes kept), as MaxText gathers them
    before its tiled loss. `logical`: each parameter's logical axes, in the same tree.

    The gather's backward pass leaves the gradient split as the parameter is stored, where the transpose of
    a sharding constraint would put it on the gathered layout first: MaxText's compiled step gathers no
    gradient back (its program holds no float32 copy of the head; for Llama 3.1 405B one is 7.8 GiB)."""
    return _over_fsdp(params, logical, gathered=True)


def split_over_fsdp(params: Any, logical: Any) -> Any:
    """The head's parameters (or their gradients) placed as the parameters are stored, split over FSDP."""
    return _over_fsdp(params, logical, gathered=False)


def _over_fsdp(params: Any, logical: Any, gathered: bool) -> Any:
    context = current_context()
    if context is None:
        return params

    def placed(param: jax.Array, axes: tuple[str, ...]) -> jax.Array:
        stored = context.resolve(axes)
        if not gathered:
            return place(context, param, stored)
        whole = without_axes(stored, FSDP_AXES)

        def to_whole(x: jax.Array) -> jax.Array:
            return place(context, x, whole)

        gather = jax.custom_vjp(to_whole)
        gather.defvjp(lambda x: (to_whole(x), None), lambda _, cotangent: (place(context, cotangent, stored),))
        return gather(param)

    return jax.tree.map(placed, params, logical, is_leaf=lambda node: isinstance(node, tuple))


def _typed_like(primal: jax.Array, cotangent: jax.Array) -> jax.Array:
    """`cotangent` on `primal`'s sharding where shardings are types (Explicit axes: a custom VJP must return
    its inputs' types); left where it is otherwise."""
    context = current_context()
    if context is None or not context.explicit:
        return cotangent
    return jax.sharding.reshard(cotangent, jax.typeof(primal).sharding.spec)


def _chunk_loss(logits_of: Logits, head: Any, hidden: jax.Array, targets: jax.Array) -> jax.Array:
    """Summed cross-entropy of one chunk's targets (float32, as the untiled loss)."""
    hidden = _placed(hidden, _CHUNK_HIDDEN, "chunk_hidden")
    targets = _placed(targets, _CHUNK_TARGETS, "chunk_targets")
    logits = _placed(logits_of(head, hidden), _CHUNK_LOGITS, "chunk_logits")
    return -jnp.sum(target_log_probs(logits, targets))


def tiled_next_token_loss(
    logits_of: Logits,
    head: Any,
    hidden: jax.Array,
    targets: jax.Array,
    tiles: int,
    split: Callable[[Any], Any] = lambda tree: tree,
) -> jax.Array:
    """Mean cross-entropy of `targets` [batch, seq] given `hidden` [batch, seq, embed], over `tiles` chunks.

    `logits_of(head, chunk)`: the output head applied to a chunk's hidden states; `head`: its parameters,
    already gathered (`gathered_over_fsdp`). `split(tree)`: the head's gradients placed as the parameters
    are stored (`split_over_fsdp`): each chunk's gradient is summed over the devices and added to an
    accumulator split over FSDP, as the TPU compiler arranges MaxText's program, instead of a float32
    accumulator of the whole head on every device. `tiles` must divide batch × seq."""
    batch, seq, embed = hidden.shape
    chunk = batch * seq // tiles
    hidden = _placed(hidden, _HIDDEN, "hidden")
    targets = _placed(targets, _TARGETS, "targets")

    def chunks(h: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = _reshaped(h, (tiles, chunk, embed), _TILED_HIDDEN, "tiled_hidden")
        return h, _reshaped(t, (tiles, chunk), _TILED_TARGETS, "tiled_targets")

    def forward(head: Any, h: jax.Array, t: jax.Array) -> tuple[jax.Array, tuple[Any, jax.Array, jax.Array]]:
        tiled_h, tiled_t = chunks(h, t)

        def body(total: jax.Array, pair: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
            return total + _chunk_loss(logits_of, head, *pair), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (tiled_h, tiled_t))
        return total, (head, tiled_h, tiled_t)

    def backward(residuals: tuple[Any, jax.Array, jax.Array], cotangent: jax.Array) -> tuple[Any, jax.Array, None]:
        head, tiled_h, tiled_t = residuals

        def body(grads: Any, pair: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            h, t = pair
            _, vjp = jax.vjp(lambda p, x: _chunk_loss(logits_of, p, x, t), head, h)
            head_grad, hidden_grad = vjp(jnp.ones((), jnp.float32))
            return jax.tree.map(jnp.add, grads, split(head_grad)), _placed(hidden_grad, _CHUNK_HIDDEN, "chunk_hidden")

        zeros = split(jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), head))
        head_grads, hidden_grads = jax.lax.scan(body, zeros, (tiled_h, tiled_t))
        head_grads = jax.tree.map(lambda p, g: _typed_like(p, (g * cotangent).astype(p.dtype)), head, head_grads)
        hidden_grads = _reshaped(hidden_grads * cotangent, (batch, seq, embed), _HIDDEN, "hidden")
        return head_grads, hidden_grads.astype(tiled_h.dtype), None

    @jax.custom_vjp
    def summed(head: Any, h: jax.Array, t: jax.Array) -> jax.Array:
        return forward(head, h, t)[0]

    summed.defvjp(forward, backward)
    return summed(head, hidden, targets) / (batch * seq)
