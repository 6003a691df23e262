"""Marking a program's stand-ins for TPU kernels, so that a CPU compile of it is priced as the TPU runs it.

A step that calls a TPU kernel (a Pallas flash-attention kernel, a grouped-matmul kernel) cannot compile
for the CPU as it is: there it runs a stand-in, plain JAX doing the kernel's matrix work. Wrap the
stand-in in the matching context manager and the cost model prices its ops as the kernel runs::

    import shardscope.kernels

    def attention(q, k, v):
        if on_tpu:
            return splash_kernel(q, k, v)
        with shardscope.kernels.attention_kernel():
            return blockwise_attention(q, k, v)

Each is a `jax.named_scope` of a reserved name (`ATTENTION`, `HALF_VISITED`, `GROUPED_MATMUL`, see
`shardscope.hlo.markers`); a program that cannot import shardscope may open the scope by its name. The
names are the only names the cost model reads: everything else it prices from the compiled program's ops,
shapes, dtypes, loops and custom-call targets, whatever the program's modules and parameters are called.
"""

from __future__ import annotations

import contextlib
from typing import Any

from shardscope.hlo.markers import ATTENTION, GROUPED_MATMUL, HALF_VISITED

__all__ = ["ATTENTION", "GROUPED_MATMUL", "HALF_VISITED", "attention_kernel", "grouped_matmul_kernel", "half_visited"]


def _scope(name: str) -> contextlib.AbstractContextManager[Any]:
    import jax  # lazy: importing shardscope needs no JAX

    return jax.named_scope(name)


def attention_kernel() -> contextlib.AbstractContextManager[Any]:
    """The scope of an attention kernel's stand-in (a flash kernel's: its scores stay on chip). Its ops
    count their matrix FLOPs, at the attention kernel's efficiency, and no HBM bytes; the ops the compiler
    adds around them without a name of their own (layout copies of the scores) count with them. Open it
    around the stand-in's forward pass and around its backward pass where that is written by hand (a
    `jax.custom_vjp`'s backward function is traced outside the forward's scope)."""
    return _scope(ATTENTION)


def half_visited() -> contextlib.AbstractContextManager[Any]:
    """Within `attention_kernel`: the stand-in's matmuls that the kernel runs on half of their blocks on
    average (a sequence shard's queries against the other shards' keys, written against all of them under
    a mask, of which a load-balanced kernel visits half). Their FLOPs count half."""
    return _scope(HALF_VISITED)


def grouped_matmul_kernel() -> contextlib.AbstractContextManager[Any]:
    """The scope of a grouped-matmul kernel's stand-in (a dropless MoE's expert matmuls, megablox's `gmm`
    on a TPU): its matmuls are priced at the grouped kernel's efficiency."""
    return _scope(GROUPED_MATMUL)
