"""The case the command-line options name (`--preset`/`--mesh`/`--set`, or MaxText's `--maxtext`), with its
warnings on standard error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from pathlib import Path

    from shardscope.case.maxtext_model import MaxTextCase
    from shardscope.case.resolve import Case


def options_given(*options: tuple[str, object]) -> list[str]:
    """The names of the options the user gave, of (name, value) pairs (a falsy value: not given)."""
    return [name for name, value in options if value]


def warn(lines: Sequence[str]) -> None:
    """Warnings, one line each, on standard error (the output stays clean for pipes)."""
    for line in lines:
        typer.echo(f"warning: {line}", err=True)


def resolve_cli_case(
    model: str,
    preset: str,
    topology: str,
    mesh: str | None,
    settings: Sequence[str] | None,
    maxtext: str | None,
) -> Case:
    """The case the options name: `--maxtext` (MaxText's keys size the mesh and pick the rules; an explicit
    `--preset`/`--topology` must agree with them) or `--preset`/`--mesh`; warnings printed on standard error.

    Raises:
      ShardscopeError: any input that is wrong.
    """
    # lazy: off the --help path
    from shardscope.case.resolve import parse_overrides, resolve_case, resolve_maxtext_case
    from shardscope.case.topology import parse_mesh_arg

    if maxtext is None:
        return resolve_case(model, preset, topology, parse_mesh_arg(mesh or ""), parse_overrides(settings or []))
    if mesh:
        raise ShardscopeError("--mesh with --maxtext: size the mesh with MaxText's ici_*_parallelism keys")
    chosen_preset = None if preset == "default" else preset
    chosen_topology = None if topology == "cpu-8" else topology
    case, run = resolve_maxtext_case(model, chosen_preset, chosen_topology, maxtext, parse_overrides(settings or []))
    warn(run.warnings)
    return case


def resolve_cli_maxtext_case(
    model: str,
    topology: str,
    preset: str,
    mesh: str | None,
    settings: Sequence[str] | None,
    maxtext: str | None,
    maxtext_path: Path | None,
) -> MaxTextCase:
    """A `maxtext:MODEL` case: MaxText's own step, which its command line (`--maxtext`) configures whole.

    Raises:
      ShardscopeError: an option that belongs to the reference models, or a wrong MaxText tree, model or key.
    """
    # lazy: off the --help path
    from shardscope.case.maxtext_model import resolve_maxtext_model
    from shardscope.case.maxtext_run import parse_maxtext_args
    from shardscope.case.topology import get_topology

    given = options_given(("--preset", preset != "default"), ("--mesh", mesh), ("--set", settings))
    if given:
        raise ShardscopeError(
            f"{model} is MaxText's own program, configured by MaxText's command line: {', '.join(given)} does not "
            "apply (e.g. --maxtext 'custom_mesh_and_rule=ep-as-cp ici_expert_parallelism=2')"
        )
    case = resolve_maxtext_model(model, get_topology(topology), parse_maxtext_args(maxtext or ""), maxtext_path)
    warn(case.notes)
    return case


def check_maxtext_path(model: str | None, maxtext_path: Path | None) -> None:
    """`--maxtext-path` names the tree a `maxtext:` model is built from; it means nothing for another model.

    Raises:
      ShardscopeError: --maxtext-path without a maxtext: model.
    """
    from shardscope.case.maxtext_model import PREFIX, is_maxtext_model  # lazy: off the --help path

    if maxtext_path is not None and (model is None or not is_maxtext_model(model)):
        raise ShardscopeError(f"--maxtext-path plans a {PREFIX}MODEL (e.g. {PREFIX}qwen3-0.6b); {model} is not one")


def check_model_or_step(
    model: str | None,
    step: str | None,
    preset: str,
    mesh: str | None,
    settings: list[str] | None,
    tensors_only: bool,
) -> None:
    """A reference model or --step, never both; a step brings its own mesh and shardings.

    Raises:
      ShardscopeError: neither or both, or an option a step does not take.
    """
    if (model is None) == (step is None):
        raise ShardscopeError("dump needs a model name or --step module:function (one of them)")
    if step is not None:
        given = options_given(
            ("--preset", preset != "default"), ("--mesh", mesh), ("--set", settings), ("--tensors-only", tensors_only)
        )
        if given:
            raise ShardscopeError(f"--step brings its own mesh and shardings: {', '.join(given)} does not apply")


def maxtext_variants(model: str, variants: Sequence[str] | None) -> list[str]:
    """What `compare maxtext:MODEL` lays side by side: each `--preset` is MaxText keys ('k=v …') added to the
    command line, `default` the command line as given.

    Raises:
      ShardscopeError: no variant, a bare name that is neither `default` nor keys, or a variant given twice.
    """
    example = "--preset default --preset 'ici_fsdp_parallelism=4 ici_tensor_parallelism=2'"
    if not variants:
        raise ShardscopeError(f"compare {model}: name MaxText keys to compare with --preset (e.g. {example})")
    for variant in variants:
        if variant != "default" and "=" not in variant:
            raise ShardscopeError(
                f"--preset {variant}: {model} is configured by MaxText's command line; compare MaxText keys "
                f"'k=v …' or default (e.g. --preset 'custom_mesh_and_rule={variant}')"
            )
    if len(set(variants)) != len(variants):
        raise ShardscopeError(f"--preset: each variant once, found {', '.join(variants)}")
    return list(variants)


def with_variant(maxtext: str | None, variant: str) -> str:
    """MaxText's command line of one variant: its keys after the common ones (MaxText takes the last of a key)."""
    return " ".join(part for part in (maxtext or "", "" if variant == "default" else variant) if part)
