"""`advise`'s two ways of reading MaxText: a reference model searched under MaxText's command line
(`--maxtext`), and MaxText's own program (`maxtext:MODEL`) searched over its ici_* sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope.cli.case_options import options_given
from shardscope.errors import ShardscopeError

if TYPE_CHECKING:
    from shardscope.advise.advice import Advice

# A sweep started: (compile jobs, use the plan cache, progress callback) → the advice.
Sweep = Callable[[int, bool, Callable], "Advice"]


def maxtext_sweep(
    model: str,
    topology: str,
    maxtext: str | None,
    maxtext_path: Path | None,
    hardware: str | None,
    efficiency: float | None,
    given: tuple[tuple[str, object], ...],
    predict_only: bool,
) -> Sweep:
    """MaxText's own program searched, checked before anything compiles (warnings on stderr).

    Raises:
      ShardscopeError: an option of the reference models' search, --predict-only, or a wrong MaxText input.
    """
    # lazy: off the --help path (no JAX)
    from shardscope.advise.advice import SweepRequest
    from shardscope.advise.maxtext_sweep import advise_maxtext, maxtext_space
    from shardscope.advise.sweep import pricing_target
    from shardscope.cli.case_options import warn

    wrong = options_given(*given)
    if wrong:
        raise ShardscopeError(
            f"{model} is searched over MaxText's ici_*_parallelism sizes, every candidate compiled: "
            f"{', '.join(wrong)} does not apply (hold an axis with --maxtext 'ici_tensor_parallelism=1')"
        )
    if predict_only:
        raise ShardscopeError(
            f"--predict-only: {model} cannot be predicted (the prediction reads the reference models' blocks); "
            "advise compiles every candidate"
        )
    space = maxtext_space(model, topology, maxtext or "", maxtext_path)
    warn(space.case.notes)
    target = pricing_target(topology, hardware, efficiency)
    request = SweepRequest(
        model, topology, (space.case.rule,), hardware=hardware, efficiency=efficiency, maxtext=maxtext or ""
    )
    return lambda jobs, use_cache, tick: advise_maxtext(request, space, target, jobs, use_cache, tick)


def from_maxtext(
    model: str, topology: str, presets: list[str] | None, mesh: str | None, settings: list[str] | None, maxtext: str
) -> tuple[str, list[str] | None, str | None, list[str]]:
    """The search's topology, presets, held axes and settings from MaxText's command line (warnings on stderr).

    Raises:
      ShardscopeError: bad MaxText input, or options that contradict it.
    """
    # lazy: off the --help path
    from shardscope.case.resolve import maxtext_search, parse_overrides
    from shardscope.cli.case_options import warn

    if mesh:
        raise ShardscopeError("--mesh with --maxtext: hold axes with MaxText's ici_*_parallelism keys")
    search = maxtext_search(model, maxtext, None if topology == "cpu-8" else topology)
    if search.preset is not None and presets and presets != [search.preset]:
        raise ShardscopeError(
            f"--preset {presets[0]} and --maxtext custom_mesh_and_rule={search.preset} name other rules"
        )
    warn(search.warnings)
    held = ",".join(f"{axis}={size}" for axis, size in search.pins) or None
    chosen = [search.preset] if search.preset is not None else presets
    return search.topology or topology, chosen, held, search.settings_with(parse_overrides(settings or []))
