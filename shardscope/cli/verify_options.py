"""`verify`'s options that do not go together, checked before anything is built."""

from __future__ import annotations

from pathlib import Path

from shardscope.cli.case_options import options_given
from shardscope.errors import ShardscopeError, unknown_name
from shardscope.verify.records import AGAINST_ONE_DEVICE as ONE_DEVICE


def check_options(
    model: str | None,
    step: str | None,
    preset: str,
    against: str,
    steps: int | None,
    mesh: str | None,
    settings: list[str] | None,
    maxtext_model: bool = False,
) -> None:
    """A model or --step, never both; a step brings its own mesh and runs once against one device; a
    `maxtext:` model compares against one device or MaxText keys.

    Raises:
      ShardscopeError: what does not go together, or an --against that names nothing known.
    """
    if (model is None) == (step is None):
        raise ShardscopeError("verify needs a model name or --step module:function (one of them)")
    if step is not None:
        given = options_given(
            ("--preset", preset != "default"), ("--mesh", mesh), ("--set", settings), ("--steps", steps is not None)
        )
        if given:
            raise ShardscopeError(
                f"--step brings its own mesh and shardings and runs once: {', '.join(given)} does not apply"
            )
        if against != ONE_DEVICE:
            raise ShardscopeError(f"--step verifies against one device: --against {against} does not apply")
    if maxtext_model:
        if against != ONE_DEVICE and "=" not in against:
            raise ShardscopeError(
                f"--against {against}: a maxtext: model is verified against one-device or MaxText keys that change "
                "its command line (e.g. --against 'ici_fsdp_parallelism=8 ici_tensor_parallelism=1', or "
                "'custom_mesh_and_rule=ep-as-cp')"
            )
        return
    if against != ONE_DEVICE and not Path(against).suffix:
        from shardscope.case.presets import builtin_preset_names  # lazy: off the --help path

        if against not in builtin_preset_names():
            raise unknown_name("--against", against, [*builtin_preset_names(), ONE_DEVICE])
