"""The same parameters in two layouts: a scan's stacked one, and the one MaxText's pipeline keeps.

A pipelined case stores its main stack's layers as [(repeats,) stages, …] (`layers_j` of a stage visit that
runs several), where parameter [r, s] (its `layers_j`) is layer (r · stages + s) · per_visit + j; every other
case stacks them as a scan does, [.., layers, ..] at index 1. Both sides of a verification start from the
same numbers, and their results are compared in one layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from reference_models.config import DecoderConfig
from reference_models.decoder import PipelineLayout, layer_stacks, pipeline_layout
from shardscope.stages.state import path_of

# A parameter-shaped tree (the parameters, a gradient, an optimizer moment): nested dicts of arrays.
ParamTree = Any


def _pipelined(config: DecoderConfig) -> tuple[str, PipelineLayout] | None:
    stack = layer_stacks(config)[-1]
    layout = pipeline_layout(config, stack)
    return None if layout is None else (stack.name, layout)


def same_layout(a: DecoderConfig, b: DecoderConfig) -> bool:
    """Whether two configs keep their parameters in the same layout."""
    return (a.pipeline_stages, a.pipeline_repeats) == (b.pipeline_stages, b.pipeline_repeats)


def to_case_layout(config: DecoderConfig, tree: ParamTree) -> ParamTree:
    """A tree of the stacked model in the layout `config` keeps (unchanged unless it is pipelined)."""
    pipelined = _pipelined(config)
    if pipelined is None:
        return tree
    name, layout = pipelined
    decoder = dict(tree["decoder"])
    layers = decoder.pop(name)

    def split(leaf: Any) -> np.ndarray:
        leaf = np.moveaxis(np.asarray(leaf), 1, 0)  # [layers, …]
        lead: tuple[int, ...] = (layout.stages, layout.per_visit)
        lead = (layout.repeats, *lead) if layout.repeats > 1 else lead
        return leaf.reshape(*lead, *leaf.shape[1:])

    blocks = jax.tree.map(split, layers)
    axis = 2 if layout.repeats > 1 else 1  # the per-visit index
    if layout.per_visit == 1:
        decoder["pipeline_module"] = {"layers": jax.tree.map(lambda b: np.take(b, 0, axis=axis), blocks)}
    else:
        decoder["pipeline_module"] = {
            "layers": {
                f"layers_{j}": jax.tree.map(lambda b, j=j: np.take(b, j, axis=axis), blocks)
                for j in range(layout.per_visit)
            }
        }
    return {**tree, "decoder": decoder}


def to_stacked(config: DecoderConfig, tree: ParamTree) -> ParamTree:
    """The inverse of `to_case_layout`: a tree in the layout `config` keeps, stacked as a scan stacks it."""
    pipelined = _pipelined(config)
    if pipelined is None:
        return tree
    name, layout = pipelined
    decoder = dict(tree["decoder"])
    blocks = decoder.pop("pipeline_module")["layers"]
    per_layer = [blocks] if layout.per_visit == 1 else [blocks[f"layers_{j}"] for j in range(layout.per_visit)]
    axis = 2 if layout.repeats > 1 else 1

    def join(*leaves: Any) -> np.ndarray:
        leaf = np.stack([np.asarray(x) for x in leaves], axis=axis)  # [(repeats,) stages, per_visit, …]
        leaf = leaf.reshape(-1, *leaf.shape[axis + 1 :])  # [layers, …] in their order
        return np.moveaxis(leaf, 0, 1)

    decoder[name] = jax.tree.map(join, *per_layer)
    return {key: ({**decoder} if key == "decoder" else tree[key]) for key in tree}


def stacked_config(config: DecoderConfig) -> DecoderConfig:
    """The same model stacked as a scan stacks it (no pipeline layout): where both sides' numbers come from."""
    return dataclasses.replace(config, pipeline_stages=0, pipeline_repeats=1)


def corresponding_paths(source: DecoderConfig, target: DecoderConfig, params: ParamTree) -> dict[str, tuple[str, ...]]:
    """Each parameter path of `target`'s layout → the paths of `source`'s layout whose values it holds.

    `params`: the parameters (arrays or shapes) in `source`'s layout. Every source leaf is filled with its own
    number and moved as values are, so the mapping is what the moves do, not a second copy of their rules.
    """
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    names = [path_of(key_path) for key_path, _ in leaves]
    numbered = jax.tree_util.tree_unflatten(
        tree, [np.full(leaf.shape, i, dtype=np.int32) for i, (_, leaf) in enumerate(leaves)]
    )
    moved = to_case_layout(target, to_stacked(source, numbered))
    return {
        path_of(key_path): tuple(names[i] for i in np.unique(leaf))
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(moved)[0]
    }
