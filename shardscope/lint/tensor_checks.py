"""Lints of where the model's tensors end up: indivisible and silently replicated dimensions, logical names
in the wrong place, large replicated weights, and weights of the layer loop sharded across slices."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator

from shardscope.case.rules import entry_axes, explain_logical
from shardscope.case.topology import DCN_AXIS, dcn_axes_of
from shardscope.lint.context import LintContext, LogicalAxes, axes_text, expert_modules, in_moe_block, rule_subject
from shardscope.plan.findings import Finding
from shardscope.plan.records import TensorRecord, is_stack_name
from shardscope.plan.units import human_bytes

ACTIVATION_PREFIX = "activation_"
_KIND_ORDER = {"param": 0, "input": 1, "activation": 2, "opt_state": 3, "output": 4}


def _mirrors(param_path: str, paths: Iterable[str]) -> list[str]:
    """Optimizer-state paths that hold a copy of a parameter (`opt_state/0/mu/<same path>`)."""
    suffix = "/" + param_path.removeprefix("params/")
    return [p for p in paths if p.startswith("opt_state/") and p.endswith(suffix)]


def _named(ctx: LintContext, kinds: tuple[str, ...]) -> Iterator[tuple[str, TensorRecord, LogicalAxes]]:
    for path, tensor in ctx.tensors_of(*kinds):
        if tensor.logical:
            yield path, tensor, tensor.logical


def check_indivisible(ctx: LintContext) -> Iterator[Finding]:
    """`indivisible-dim`: dimensions their mesh axes do not divide (from a lenient trace), one finding per
    (logical name, size, mesh axes), on the first tensor that has it (parameters and inputs first)."""
    groups: dict[tuple[str | None, int, tuple[str, ...], int], list[str]] = defaultdict(list)
    for record in ctx.indivisible:
        if record.path.startswith("opt_state/"):
            continue  # optimizer state mirrors its parameter
        tensor = ctx.tensors.get(record.path)
        logical = tensor.logical if tensor is not None else None
        for dim, size, axes, ways in record.dims:
            name = logical[dim] if logical and dim < len(logical) else None
            groups[(name, size, axes, ways)].append(record.path)
    for (name, size, axes, ways), paths in sorted(groups.items(), key=repr):
        paths = sorted(set(paths), key=lambda p: (_KIND_ORDER.get(p.split("/", 1)[0].rstrip("s"), 2), p))
        more = f" (and {len(paths) - 1} more tensors: {_examples(paths[1:])})" if len(paths) > 1 else ""
        yield Finding(
            "indivisible-dim",
            "error",
            paths[0],
            f"a dimension named {name or '(unnamed)'} of size {size} is sharded over {axes_text(axes)} = {ways} "
            f"shards, which do not divide it{more}",
            "change the mesh (--mesh), the model's shape (--set model.…), or the rule for that dimension "
            "(`shardscope explain` shows which rule decides it)",
        )


def _examples(paths: list[str], count: int = 3) -> str:
    shown = ", ".join(paths[:count])
    return shown + (", …" if len(paths) > count else "")


def check_silently_replicated(ctx: LintContext) -> Iterator[Finding]:
    """`silently-replicated`: dimensions whose rules name a real mesh axis but which end up replicated."""
    indivisible = {record.path for record in ctx.indivisible}
    groups: dict[tuple[LogicalAxes, int], list[str]] = defaultdict(list)
    for path, tensor, logical in _named(ctx, ("param", "input", "activation")):
        if path in indivisible:
            continue
        for dim, name in enumerate(logical):
            if name is None or dim >= len(tensor.spec) or tensor.spec[dim] is not None:
                continue
            wanted = [axes for logical_name, axes in ctx.rules if logical_name == name]
            if any(ctx.size(axis) > 1 for axes in wanted for axis in axes):
                groups[(logical, dim)].append(path)
    for (logical, dim), paths in sorted(groups.items(), key=lambda item: repr(item[0])):
        decisions = explain_logical(logical, ctx.rules)
        decision = decisions[dim]
        if decision.rule_index is not None and not ctx.rules[decision.rule_index][1]:
            continue  # an explicit [name, []] decided: replicated on purpose
        name = logical[dim]
        skipped = []
        for skip in decision.skipped:
            if skip.taken_axis is not None and ctx.size(skip.taken_axis) > 1:
                taker = next(d for d, other in enumerate(decisions) if skip.taken_axis in other.mesh_axes)
                skipped.append(
                    f"rule {_short(ctx, skip.rule_index)} was skipped: {skip.taken_axis!r} is taken by dimension "
                    f"{taker} ({logical[taker]})"
                )
        if not skipped:
            continue
        if decision.rule_index is None:
            outcome = "no other rule applied"
        else:
            outcome = f"rule {_short(ctx, decision.rule_index)} decided, with axes of size 1 only"
        paths.sort(key=lambda p: (_KIND_ORDER.get(ctx.tensors[p].kind, 9), p))
        more = f" (and {len(paths) - 1} more tensors with logical axes {list(logical)})" if len(paths) > 1 else ""
        yield Finding(
            "silently-replicated",
            "warning",
            paths[0],
            f"dimension {dim} ({name}) is replicated{more}: " + "; ".join(skipped) + f"; {outcome}",
            f"add a fallback rule for {name!r} on a free mesh axis, reorder the rules, or put [{name}, []] first "
            "to replicate on purpose",
        )


def _short(ctx: LintContext, index: int) -> str:
    """A rule as findings quote it inline: "[12] [embed, ['fsdp']]"."""
    return rule_subject(index, ctx.rules[index]).removeprefix("logical_axis_rules")


def check_activation_names_on_weights(ctx: LintContext) -> Iterator[Finding]:
    """`activation-name-on-weight`: parameters carrying `activation_*` names."""
    for path, _, logical in _named(ctx, ("param",)):
        names = [n for n in logical if n is not None and n.startswith(ACTIVATION_PREFIX)]
        if names:
            yield Finding(
                "activation-name-on-weight",
                "warning",
                path,
                f"a weight with activation names {', '.join(names)} (logical axes {list(logical)}): the activation "
                "rules shard it",
                "give the weight weight names (embed, mlp, heads, …) in the model",
            )


def check_weight_names_on_activations(ctx: LintContext) -> Iterator[Finding]:
    """`weight-name-on-activation`: activations (and inputs) carrying a name the model's weights carry."""
    weight_names = {
        name
        for _, _, logical in _named(ctx, ("param",))
        for name in logical
        if name is not None and not name.startswith(ACTIVATION_PREFIX)
    }
    for path, _, logical in _named(ctx, ("activation", "input")):
        names = [n for n in logical if n in weight_names]
        if names:
            yield Finding(
                "weight-name-on-activation",
                "warning",
                path,
                f"an activation with weight names {', '.join(names)} (logical axes {list(logical)}): the weight "
                "rules shard it",
                "use the activation_* name of that dimension in the model",
            )


def check_moe_names_outside_moe(ctx: LintContext) -> Iterator[Finding]:
    """`moe-name-outside-moe`: `*_moe` names on tensors that do not lie inside a MoE block."""
    modules = expert_modules(ctx.plan.tensors)
    for path, _, logical in _named(ctx, ("param", "activation")):
        names = [n for n in logical if n is not None and n.endswith("_moe")]
        if names and not in_moe_block(path, modules):
            yield Finding(
                "moe-name-outside-moe",
                "warning",
                path,
                f"carries {', '.join(names)} outside the MoE block (logical axes {list(logical)}): the MoE's rules "
                "shard it",
                "use the dense name (embed, mlp, activation_batch, …) outside the MoE block",
            )


def _replicated(tensor: TensorRecord) -> bool:
    return all(entry is None for entry in tensor.spec)


def check_large_replicated(ctx: LintContext) -> Iterator[Finding]:
    """`large-replicated`: parameters and optimizer state held whole by every device, above the threshold."""
    if math.prod(size for _, size in ctx.plan.case.mesh) == 1:
        return
    limit = ctx.preset.lint.max_replicated_bytes
    big = {
        path: tensor
        for path, tensor in ctx.tensors_of("param", "opt_state")
        if _replicated(tensor) and tensor.bytes_per_device >= limit and tensor.bytes_per_device > 0
    }
    covered: set[str] = set()
    for path, tensor in big.items():
        if tensor.kind != "param":
            continue
        mirrors = _mirrors(path, big)
        covered.update(mirrors)
        total = tensor.bytes_per_device + sum(big[m].bytes_per_device for m in mirrors)
        also = f", {human_bytes(total)} with its {len(mirrors)} optimizer-state copies" if mirrors else ""
        yield Finding(
            "large-replicated",
            "warning",
            path,
            f"{tensor.dtype}{list(tensor.shape)} is replicated on every device: {human_bytes(tensor.bytes_per_device)} "
            f"per device{also} (threshold {human_bytes(limit)}; logical axes {list(tensor.logical or ())})",
            "shard one of its dimensions (a rule for one of its logical names on the FSDP axes)",
        )
    for path, tensor in big.items():
        if tensor.kind == "opt_state" and path not in covered:
            yield Finding(
                "large-replicated",
                "warning",
                path,
                f"optimizer state {tensor.dtype}{list(tensor.shape)} is replicated on every device: "
                f"{human_bytes(tensor.bytes_per_device)} per device (threshold {human_bytes(limit)})",
                "shard it like its parameter",
            )


def check_dcn_weights(ctx: LintContext) -> Iterator[Finding]:
    """`dcn-weight-in-loop`: with several slices, parameters of scanned layers sharded over the axis that spans
    them (`data` unless the case names another), one finding per logical name so sharded."""
    spanning = dcn_axes_of(ctx.plan.case.overrides)
    across = "+".join(spanning)
    if ctx.slices <= 1:
        return
    groups: dict[str, list[str]] = defaultdict(list)
    for path, tensor, logical in _named(ctx, ("param",)):
        if not any(is_stack_name(name) for name in logical):
            continue
        for dim, entry in enumerate(tensor.spec):
            if any(axis in entry_axes(entry) for axis in spanning):
                groups[str(logical[dim])].append(path)
    # A GPU cluster's "slices" are its NVLink domains, joined by the hosts' network cards.
    slices, network = ("NVLink domains", "network") if ctx.cluster else ("slices", "data-center network")
    for name, paths in sorted(groups.items()):
        more = f" (and {len(paths) - 1} more: {_examples(paths[1:])})" if len(paths) > 1 else ""
        yield Finding(
            "dcn-weight-in-loop",
            "warning",
            paths[0],
            f"weights of the scanned layers have {name!r} sharded over {across!r}, which spans {ctx.slices} "
            f"{slices}: gathered across the {network} in every layer{more}",
            f"take {across!r} out of the rules for {name!r}; keep it to the batch"
            + ("" if across == DCN_AXIS else f", or join the {slices} over {DCN_AXIS!r} (dcn_data_parallelism)"),
        )
