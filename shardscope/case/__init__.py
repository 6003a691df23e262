"""What to plan, validated before JAX starts: a model under a preset on a topology and mesh (a `Case`).

- `rules`: logical → physical axis resolution (Flax's semantics) and each decision's explanation;
- `presets`: preset files (MaxText rule files load as they are) and the built-in ones (`builtin_presets/`);
- `lints`: the lints a preset may name (the catalogue `lint: {ignore: …}` is checked against);
- `settings`: `--set model.<field>=…` values;
- `tpu`, `hardware`: TPU generations by product name, their slices, and their published figures
  (`hardware.yaml`, which the cost model prices with);
- `topology`: topology names, the `--mesh` grammar, a preset's mesh on a topology;
- `resolve`: the resolved `Case`; `explain`: `shardscope explain`.

Nothing here imports JAX: a wrong name or mesh fails in milliseconds.
"""

from shardscope.case.resolve import Case, compiler_options_for, get_model, parse_overrides, resolve_case

__all__ = ["Case", "compiler_options_for", "get_model", "parse_overrides", "resolve_case"]
