"""What shardscope knows (`shardscope list`): models, presets, topologies and hardware, as data and as tables."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from reference_models import MODELS
from shardscope.case.hardware import known_hardware
from shardscope.case.maxtext_model import INSTALL_HINT, PREFIX, installed_tree
from shardscope.case.presets import builtin_preset_names, get_preset
from shardscope.case.tpu import known_tpu_names, libtpu_version, parse_tpu_slice


def catalogue_to_json() -> dict[str, Any]:
    """Every model (its shape), preset (strategy, mesh, origin), TPU topology (devices) and generation, and
    MaxText's own models when MaxText is installed."""
    tree = installed_tree()
    return {
        "models": {
            name: {
                "family": cfg.family,
                "layers": cfg.num_layers,
                # Layers with a dense MLP: DeepSeek's first ones, every Llama layer.
                "dense_layers": cfg.num_layers - cfg.num_moe_layers,
                "experts": cfg.num_experts,
                "experts_per_token": cfg.num_experts_per_token,
                "embed": cfg.embed_dim,
                "seq_len": cfg.seq_len,
            }
            for name, cfg in MODELS.items()
        },
        "presets": {
            name: {
                "moe": (p := get_preset(name)).moe,
                "shard_mode": p.shard_mode,
                "mesh": dict(p.mesh),
                "origin": p.origin,
                "description": p.description,
            }
            for name in builtin_preset_names()
        },
        "topologies": {name: parse_tpu_slice(name).num_devices for name in known_tpu_names()},
        "libtpu": libtpu_version(),
        "hardware": known_hardware(),
        "maxtext": None if tree is None else {"version": tree.version, "models": [PREFIX + m for m in tree.models()]},
    }


def catalogue_renderables() -> tuple[RenderableType, ...]:
    """The same as four tables: models, presets, topologies (and whether libtpu is installed), hardware."""
    models = Table(title="Models", title_justify="left", show_edge=False)
    for column in ("name", "family", "layers", "experts (top-k)", "embed", "seq"):
        models.add_column(column)
    for name, cfg in MODELS.items():
        models.add_row(
            name,
            cfg.family,
            f"{cfg.num_layers} ({cfg.num_layers - cfg.num_moe_layers} dense)",
            f"{cfg.num_experts} ({cfg.num_experts_per_token})" if cfg.num_experts else "none",
            str(cfg.embed_dim),
            str(cfg.seq_len),
        )
    presets = Table(title="Presets", title_justify="left", show_edge=False)
    for column in ("name", "moe", "shard mode", "mesh", "rules from", "description"):
        presets.add_column(column, no_wrap=column != "description")
    for name in builtin_preset_names():
        preset = get_preset(name)
        mesh = ",".join(f"{a}={s}" for a, s in preset.mesh if s != 1)
        origin = preset.origin.split()[0] if preset.origin else "shardscope"
        presets.add_row(name, preset.moe, preset.shard_mode, mesh, origin, preset.description)
    topologies = Table(title="Topologies", title_justify="left", show_edge=False)
    topologies.add_column("name")
    topologies.add_column("devices")
    topologies.add_row("cpu-N", "N fake CPU devices (default cpu-8; e.g. cpu-256 for real model shapes)")
    installed = libtpu_version()
    for name in known_tpu_names():
        note = f"{parse_tpu_slice(name).num_devices} TPU devices"
        needs = Text(f"{note} (needs: pip install 'shardscope[tpu]')")  # Text: `[tpu]` is not markup
        topologies.add_row(name, note if installed else needs)
    hardware = Text(f"hardware (--hardware): {', '.join(known_hardware())}")
    return (models, "", presets, "", topologies, "", hardware, Text("\n"), maxtext_models())


def maxtext_models() -> RenderableType:
    """MaxText's own models (`maxtext:NAME`), or how to get them."""
    tree = installed_tree()
    if tree is None:
        return Text(f"MaxText's own models (maxtext:NAME): not installed here; {INSTALL_HINT}")
    names = ", ".join(tree.models())
    return Text(f"MaxText {tree.version}'s own models (maxtext:NAME, configured by --maxtext): {names}")
