"""The docs' generated reference: the CLI (from the typer app), the presets, the lints and the hardware table
(from their registries), rendered as Markdown where a page says `<!-- generated: NAME -->`.

MkDocs runs `on_page_markdown` on every page (`hooks:` in mkdocs.yml); the tests call the `render_*` functions
directly. Nothing here is typed by hand, so the reference cannot fall behind the code. None of it imports JAX.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import typer.main

# The reference describes the checkout it is built from, whichever shardscope is installed: its packages are
# imported now, from the checkout (MkDocs puts sys.path back once this module has loaded).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
for _package in ("shardscope", "reference_models"):
    importlib.import_module(_package)

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _cell(text: str) -> str:
    """Text for one cell of a Markdown table: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


# Typer carries its own copy of click: its commands and parameters are read by their attributes, not their classes.
Command = Any
Parameter = Any


def _parameter_rows(parameters: list[Parameter], context: typer.Context) -> list[str]:
    """One table row per parameter, as `--help` words it: names and metavar, then help and default."""
    rows = []
    for parameter in parameters:
        names, help_text = parameter.get_help_record(context) or (parameter.name, "")
        rows.append(f"| `{names}` | {_cell(help_text)} |")
    return rows


def cli_commands() -> dict[str, tuple[Command, typer.Context]]:
    """Every visible `shardscope` command by name (in `--help`'s order), with a context to render it in."""
    from shardscope.cli import app

    group = typer.main.get_command(app)
    root = typer.Context(group, info_name="shardscope")
    commands = {}
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        if not command.hidden:
            commands[name] = (command, typer.Context(command, info_name=name, parent=root))
    return commands


def arguments(command: Command) -> list[Parameter]:
    """A command's positional arguments."""
    return [p for p in command.params if p.param_type_name == "argument"]


def options(command: Command) -> list[Parameter]:
    """A command's visible options."""
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


def render_cli() -> str:
    """Every command: its help, usage, arguments and options (names, metavar, default, help)."""
    commands = cli_commands()
    lines = ["| command | does |", "|---|---|"]
    for name, (command, _) in commands.items():
        lines.append(f"| [`{name}`](#{name}) | {_cell(command.get_short_help_str(limit=200))} |")
    lines += [
        "",
        "Every command takes `-h`/`--help`; `shardscope --version` prints the version. Exit 2 always means the "
        "input was wrong (one line on stderr, no traceback).",
    ]
    for name, (command, context) in commands.items():
        usage = " ".join(command.collect_usage_pieces(context))
        lines += ["", f"### `{name}` {{#{name}}}", "", (command.help or "").strip(), ""]
        lines += ["```text", f"shardscope {name} {usage}", "```", ""]
        if arguments(command):
            lines += ["| argument | |", "|---|---|", *_parameter_rows(arguments(command), context), ""]
        if options(command):
            lines += ["| option | |", "|---|---|", *_parameter_rows(options(command), context), ""]
    return "\n".join(lines)


def render_presets() -> str:
    """The built-in presets: mesh, strategies, where the rules come from, and every rule in order."""
    from shardscope.case.presets import builtin_preset_names, get_preset

    lines = ["| preset | mesh | MoE | shard mode | rules from | what it does |", "|---|---|---|---|---|---|"]
    presets = [get_preset(name) for name in builtin_preset_names()]
    for preset in presets:
        mesh = ",".join(f"{axis}={size}" for axis, size in preset.mesh) or "–"
        origin = preset.origin.split(" @ ")[0] if preset.origin else "shardscope"
        lines.append(
            f"| [`{preset.name}`](#{preset.name}) | `{mesh}` | {preset.moe} | {preset.shard_mode} | "
            f"{_cell(origin)} | {_cell(preset.description)} |"
        )
    for preset in presets:
        lines += ["", f"## `{preset.name}` {{#{preset.name}}}", "", _cell(preset.description), ""]
        if preset.origin:
            lines += [f"Rules from {_cell(preset.origin)}.", ""]
        lines.append(f"Mesh axes `{list(preset.mesh_axes)}`.")
        if preset.pipeline is not None:
            lines.append(f"Pipeline over `{preset.pipeline.stage_axis}`.")
        if preset.lint.ignore:
            lines.append(f"Lints silenced: {', '.join(f'`{lint}`' for lint in preset.lint.ignore)}.")
        lines += ["", "| # | logical axis | mesh axes |", "|---|---|---|"]
        for index, (logical, axes) in enumerate(preset.logical_axis_rules):
            lines.append(f"| {index} | `{logical}` | {', '.join(f'`{a}`' for a in axes) or 'replicated'} |")
    return "\n".join(lines)


def render_lints() -> str:
    """Every lint of the registry: id, severity, what it needs, and the paragraph `lint --explain` prints."""
    from shardscope.case.lints import COMPILE, LINTS

    lines = ["| lint | severity | needs | finds |", "|---|---|---|---|"]
    for lint in LINTS.values():
        needs = "a compile" if lint.stage == COMPILE else "the trace"
        lines.append(f"| [`{lint.id}`](#{lint.id}) | {lint.severity} | {needs} | {_cell(lint.title)} |")
    for lint in LINTS.values():
        lines += ["", f"## `{lint.id}` {{#{lint.id}}}", "", f"*{lint.severity}*: {lint.title}.", "", lint.explanation]
    return "\n".join(lines)


def _figure(value: float | None, scale: float, digits: int = 0) -> str:
    return "–" if value is None else f"{value / scale:,.{digits}f}"


def render_hardware() -> str:
    """The built-in hardware table (never a table of one's own from $SHARDSCOPE_HARDWARE_TABLE)."""
    from shardscope.case import hardware as table

    saved = os.environ.pop(table.TABLE_ENV, None)
    try:
        generations = [table.load_hardware(name) for name in table.known_hardware()]
    finally:
        if saved is not None:
            os.environ[table.TABLE_ENV] = saved
    columns: list[tuple[str, Callable[[Any], str]]] = [
        ("peak bf16 TFLOP/s", lambda h: _figure(h.peak_bf16_flops, 1e12)),
        ("HBM GiB", lambda h: _figure(h.hbm_bytes, 2**30)),
        ("HBM GB/s", lambda h: _figure(h.hbm_bandwidth, 1e9)),
        ("ICI GB/s per link", lambda h: _figure(h.ici_link_bandwidth, 1e9, 1)),
        ("ICI links", lambda h: str(h.ici_links)),
        ("torus", lambda h: f"{h.torus_dims}D"),
        ("wraparound", lambda h: f"{h.wrap_length}{' (whole cubes)' if h.wrap_needs_full_cube else ''}"),
        ("DCN GB/s", lambda h: _figure(h.dcn_bandwidth, 1e9, 1)),
        ("host GB/s", lambda h: _figure(h.host_bandwidth, 1e9, 1)),
        ("devices per chip", lambda h: str(h.devices_per_chip)),
        ("matmul efficiency", lambda h: f"{h.mxu_efficiency:.2f}"),
        ("HBM efficiency", lambda h: f"{h.hbm_efficiency:.2f}"),
        ("link efficiency", lambda h: f"{h.efficiency:.2f}"),
    ]
    lines = [
        "| | " + " | ".join(f"`{h.name}`" for h in generations) + " |",
        "|---|" + "---:|" * len(generations),
    ]
    for title, show in columns:
        lines.append(f"| {title} | " + " | ".join(show(h) for h in generations) + " |")
    return "\n".join(lines)


RENDERERS: dict[str, Callable[[], str]] = {
    "cli": render_cli,
    "presets": render_presets,
    "lints": render_lints,
    "hardware": render_hardware,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: each `<!-- generated: NAME -->` marker becomes that reference."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in RENDERERS:
            raise ValueError(f"unknown generated section {name!r}; known: {', '.join(RENDERERS)}")
        return RENDERERS[name]()

    return MARKER.sub(replace, markdown)
