"""A train state's leaf paths, written alike whoever built the state.

The reference models' state is `{params: …, opt_state: …}`; MaxText's Linen `TrainState` keeps Flax's
collection level (`params/params/decoder/…`, `opt_state/0/mu/params/…`); MaxText's NNX state is
`{model: …, optimizer: {opt_state: …, step: …}}` of Variables whose arrays sit at `…/value`. Plans write every
one of them as the reference models' (`params/decoder/…`, `opt_state/0/mu/decoder/…`), so that a plan of
MaxText's program, MaxText's own sharding dump and the step's HLO argument names all meet on one path.
"""

from __future__ import annotations

from collections.abc import Sequence

# Leading parts of an NNX train state, and what a plan calls them.
_NNX_ROOTS = ((("model",), "params"), (("optimizer", "opt_state"), "opt_state"), (("optimizer", "step"), "step"))


def canonical_state_path(parts: Sequence[str]) -> str:
    """A state leaf's path parts (pytree keys as text) as a plan path (see the module docstring)."""
    parts = list(parts)
    if parts and parts[-1] == "value" and parts[0] in ("model", "optimizer"):
        parts = parts[:-1]  # an NNX Variable's array
    for root, name in _NNX_ROOTS:
        if tuple(parts[: len(root)]) == root:
            parts = [name, *parts[len(root) :]]
            break
    # Flax's collection level: `params` right after the train state's `params` or an Adam moment.
    collection = {
        i for i, part in enumerate(parts) if part == "params" and i > 0 and parts[i - 1] in ("params", "mu", "nu")
    }
    return "/".join(part for i, part in enumerate(parts) if i not in collection)
