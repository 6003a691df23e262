"""Reference DeepSeek, Mixtral and Llama models (Flax) with logical axis names on every parameter and activation.

This package's top level imports no JAX, so that listing and validating model names stays instant; the
modules themselves live in `reference_models.decoder`, `.moe`, `.layers` and `.sharding`.
"""

from __future__ import annotations

from reference_models import deepseek, llama, mixtral
from reference_models.config import DecoderConfig

# Model names as users write them → flavor configs.
MODELS: dict[str, DecoderConfig] = {
    "deepseek-tiny": deepseek.FLAVORS["tiny"],
    "deepseek2-16b": deepseek.FLAVORS["16b"],
    "deepseek3-671b": deepseek.FLAVORS["671b"],
    "mixtral-tiny": mixtral.FLAVORS["tiny"],
    "mixtral-8x7b": mixtral.FLAVORS["8x7b"],
    "mixtral-8x22b": mixtral.FLAVORS["8x22b"],
    "llama-tiny": llama.FLAVORS["tiny"],
    "llama2-7b": llama.FLAVORS["2-7b"],
    "llama2-70b": llama.FLAVORS["2-70b"],
    "llama3-8b": llama.FLAVORS["3-8b"],
    "llama3.1-8b": llama.FLAVORS["3.1-8b"],
    "llama3.1-70b": llama.FLAVORS["3.1-70b"],
    "llama3.1-405b": llama.FLAVORS["3.1-405b"],
}

__all__ = ["MODELS", "DecoderConfig"]
