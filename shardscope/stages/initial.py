"""A model's parameters initialised for real (a tiny model's, for `verify`): its own initialisers, a fixed key.

The initialiser is compiled to run once, so its compile is what costs, and most of that compile is the random
number generator: JAX's threefry (and XLA's expansion of its bit generator on CPU) is tens of rounds of
integer arithmetic per draw, which made a tiny model's init compile for longer than its train step. A
parameter only needs numbers that look random and are the same wherever they are used, so the key here is
a counter-based generator of a few multiplies and shifts (MurmurHash3's 32-bit finaliser over a counter),
and the program is compiled without optimisation and without XLA's CPU fusion emitters (which halves its
compile again; it runs once, in milliseconds either way).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import define_prng_impl

from reference_models.config import DecoderConfig
from reference_models.decoder import Transformer
from shardscope.case.cpu_options import cpu_compiler_options

_GOLDEN = 0x9E3779B9  # 2^32 / φ: consecutive counters land far apart before mixing


def _mix(x: Any) -> Any:
    """MurmurHash3's finaliser: every input bit flips about half the output bits."""

    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _stream(key: Any, count: int) -> Any:

    counter = jax.lax.iota(jnp.uint32, count)
    return _mix(_mix(counter * jnp.uint32(_GOLDEN) ^ key[0]) + key[1])


def _seed(seed: Any) -> Any:

    value = jnp.asarray(seed).astype(jnp.uint32)
    return jnp.stack([_mix(value), _mix(value ^ jnp.uint32(_GOLDEN))])


def _split(key: Any, shape: tuple[int, ...]) -> Any:
    return _stream(key, 2 * math.prod(shape)).reshape(*shape, 2)


def _fold_in(key: Any, data: Any) -> Any:

    value = jnp.asarray(data).astype(jnp.uint32)
    return jnp.stack([_mix(key[0] ^ _mix(value)), _mix(key[1] + value * jnp.uint32(_GOLDEN))])


def _random_bits(key: Any, bit_width: int, shape: tuple[int, ...]) -> Any:

    words = _stream(key, math.prod(shape))
    return words.astype({8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[bit_width]).reshape(shape)


@functools.cache
def cheap_generator() -> Any:
    """The counter-based generator, registered with JAX once per process."""
    return define_prng_impl(
        key_shape=(2,), seed=_seed, split=_split, random_bits=_random_bits, fold_in=_fold_in, name="murmur32"
    )


@functools.lru_cache(maxsize=4)
def initial_params(config: DecoderConfig, batch_shape: tuple[int, int], seed: int) -> Any:
    """The model's parameters from its own initialisers and a fixed key, as read-only host arrays (kept for the
    next verification of the same model in this process: a golden check or a test session runs several)."""
    key = jax.random.key(seed, impl=cheap_generator())
    zeros = jnp.zeros(batch_shape, jnp.int32)  # the shapes matter, not the tokens
    lowered = jax.jit(Transformer(config).init).lower(key, zeros)
    params = lowered.compile(compiler_options=cpu_compiler_options())(key, zeros)
    host = jax.tree.map(np.array, nn.unbox(params)["params"])
    for leaf in jax.tree.leaves(host):
        leaf.setflags(write=False)
    return host
