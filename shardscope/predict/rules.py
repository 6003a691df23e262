"""Which of the preset's rules put a tensor's dimensions on a predicted collective's mesh axes.

The same attribution as a compiled row's cause (`shardscope.extract.causes`), from the plan's tensors and the
preset's rules; a rule counts only where it reproduces the spec the plan records for that dimension, so a
preset that cannot be loaded, or has changed since the plan was made, names no rule rather than a wrong one.
"""

from __future__ import annotations

from shardscope.case.presets import apply_preset_overrides, get_preset
from shardscope.case.rules import Rule, drop_unit_axes
from shardscope.errors import ShardscopeError
from shardscope.extract.causes import placing_rules
from shardscope.plan.document import Plan
from shardscope.plan.records import RuleCause, TensorRecord


def preset_rules(plan: Plan) -> tuple[Rule, ...]:
    """The logical-axis rules the plan's case was placed with; () when its preset cannot be loaded."""
    try:
        preset = get_preset(plan.case.preset_source or plan.case.preset)
        settable = {key: value for key, value in plan.case.overrides if key in ("moe", "shard_mode")}
        return apply_preset_overrides(preset, settable).logical_axis_rules
    except (ShardscopeError, OSError):
        return ()


def preset_moe(plan: Plan) -> str:
    """The case's MoE strategy ("all_to_all" or "ring"): a `--set moe=` override, else the preset's."""
    overrides = dict(plan.case.overrides)
    if "moe" in overrides:
        return overrides["moe"]
    try:
        return get_preset(plan.case.preset_source or plan.case.preset).moe
    except (ShardscopeError, OSError):
        return "all_to_all"


def rules_on(
    plan: Plan,
    path: str,
    record: TensorRecord,
    axes: tuple[str, ...],
    rules: tuple[Rule, ...],
    logical_prefix: str = "",
) -> tuple[RuleCause, ...]:
    """The rules that put a dimension of `path` (whose logical name starts with `logical_prefix`) on `axes`, as
    a compiled row's cause names them, where the rule still reproduces the spec the plan records."""
    sizes = dict(plan.case.mesh)
    return tuple(
        cause
        for dim, spec, cause in placing_rules(path, record, axes, rules)
        if cause.logical.startswith(logical_prefix) and drop_unit_axes((spec,), sizes)[0] == record.spec[dim]
    )
