"""Each lint on the smallest hand-made case that triggers it, and on one that does not (no JAX)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from lint_helpers import placed, plan, preset, row, run

from shardscope.case.gpu import load_gpu_hardware, parse_gpu_cluster
from shardscope.case.hardware import load_hardware
from shardscope.case.lints import LINT_IDS, LINTS, get_lint
from shardscope.case.rules import Indivisible
from shardscope.lint.context import LintContext, in_moe_block
from shardscope.lint.family_names import FAMILY_NAMES
from shardscope.lint.registry import CHECKS
from shardscope.lint.run import run_checks, silenced
from shardscope.lint.unsized_mesh import unsized_mesh_note
from shardscope.plan import tensor_record
from shardscope.plan.findings import Finding, sort_findings
from shardscope.plan.json import load_plan, plan_from_json, plan_to_json

MESH = (("fsdp", 4), ("expert", 2))


def ctx_for(rules, tensors, mesh=MESH, mesh_axes=("fsdp", "expert"), **extra) -> LintContext:
    """A context whose tensors are placed by `rules`: {path: (kind, shape, logical)}."""
    chosen = preset(rules, mesh_axes)
    records = {path: placed(kind, shape, logical, chosen, mesh) for path, (kind, shape, logical) in tensors.items()}
    return LintContext(preset=chosen, plan=plan(records, mesh), **extra)


def test_every_lint_has_a_check_an_explanation_and_a_severity():
    assert tuple(CHECKS) == LINT_IDS
    for lint in LINTS.values():
        assert lint.severity in ("info", "warning", "error")
        assert len(lint.explanation) > 200 and lint.explanation.endswith(".")
    with pytest.raises(Exception, match="did you mean 'dead-rule'"):
        get_lint("dead-rul")


# dead-rule


def test_dead_rule_and_its_misspelling_hint():
    ctx = ctx_for(
        [["embed", ["fsdp"]], ["mpl", ["expert"]], ["scratch_dim", []]],
        {"params/w": ("param", (64, 32), ("embed", "mlp"))},
    )
    found = run("dead-rule", ctx)
    assert [f.subject for f in found] == [
        "logical_axis_rules[1] [mpl, ['expert']]",
        "logical_axis_rules[2] [scratch_dim, []]",
    ]
    assert "did you mean 'mlp'" in found[0].message and found[0].fix == "rename it to 'mlp'"
    assert "did you mean" not in found[1].message


def test_a_name_the_model_only_resolves_keeps_its_rule_alive():
    # The MoE resolves (exp, None, mlp_no_fsdp) to place its expert weights without recording those names.
    rules = [["embed", ["fsdp"]], ["mlp_no_fsdp", ["expert"]]]
    tensors = {"params/w": ("param", (64, 32), ("embed", None))}
    # Unresolved, the rule is dead here; the MoE families use the name, so it is summarised, not warned about.
    (summary,) = run("rules-for-other-models", ctx_for(rules, tensors))
    assert "[1] mlp_no_fsdp" in summary.message and run("dead-rule", ctx_for(rules, tensors)) == []
    resolved = ctx_for(rules, tensors, resolved=frozenset({("exp", None, "mlp_no_fsdp")}))
    assert run("dead-rule", resolved) == [] and run("rules-for-other-models", resolved) == []


# rules-for-other-models


def families_of(name: str) -> list[str]:
    """The families the checked-in table says use a name (what the summary must list)."""
    return [family for family, names in FAMILY_NAMES.items() if name in names]


def test_rules_other_families_use_are_one_info_summary_and_never_renamed():
    # DeepSeek's layer stacks are moe_layers and dense_layers; `layers` is Llama's and Mixtral's stack.
    rules = [["embed", ["fsdp"]], ["layers", ["expert"]], ["activation_length_attn", []], ["mlpp", []]]
    tensors = {"params/moe_layers/w": ("param", (4, 64, 32), ("moe_layers", "embed", "mlp"))}
    ctx = ctx_for(rules, tensors)
    (summary,) = run("rules-for-other-models", ctx)
    assert summary.severity == "info" and summary.subject == "rules for other model families"
    assert summary.fix.startswith("nothing to fix: the file serves several model families")
    families = families_of("layers")
    assert families and families == families_of("activation_length_attn") and "deepseek" not in families
    assert f"{', '.join(families)}: [1] layers, [2] activation_length_attn" in summary.message
    assert summary.message.startswith("2 rules name logical names m does not use")
    # Only the name no family uses is a dead rule; its rename goes towards a name this model uses.
    (dead,) = run("dead-rule", ctx)
    assert dead.subject == "logical_axis_rules[3] [mlpp, []]" and dead.fix == "rename it to 'mlp'"
    # No finding suggests moving `layers` onto the model's own stack name.
    unmatched = {f.subject: f.message for f in run("unmatched-name", ctx)}
    assert "may be meant" not in unmatched["logical name 'moe_layers'"]
    assert "the rule for 'mlpp' may be meant for it" in unmatched["logical name 'mlp'"]


def test_a_preset_that_silences_dead_rules_silences_their_summary():
    rules = [["embed", ["fsdp"]], ["layers", []], ["activation_length_attn", []]]
    tensors = {"params/w": ("param", (64,), ("embed",))}
    ctx = ctx_for(rules, tensors)
    assert {f.lint for f in run_checks(ctx)} == {"rules-for-other-models"}
    assert run_checks(ctx, preset([], lint={"ignore": ["dead-rule"]}).lint) == ()
    one = preset(rules, lint={"ignore": [{"id": "dead-rule", "subject": "[layers,"}]})
    (summary,) = run("rules-for-other-models", LintContext(preset=one, plan=ctx.plan))
    assert "[2] activation_length_attn" in summary.message and "layers" not in summary.message


# shadowed-rule


def test_shadowed_by_an_earlier_rule_for_the_same_name():
    ctx = ctx_for([["embed", ["fsdp"]], ["embed", ["expert"]]], {"params/w": ("param", (64, 32), ("embed", None))})
    (found,) = run("shadowed-rule", ctx)
    assert found.subject == "logical_axis_rules[1] [embed, ['expert']]"
    assert "an earlier rule for 'embed' decides first ([0] [embed, ['fsdp']])" in found.message


def test_shadowed_because_its_axes_are_always_taken():
    rules = [["heads", ["expert"]], ["kv", ["expert"]]]
    ctx = ctx_for(rules, {"params/w": ("param", (4, 64), ("heads", "kv"))})
    (found,) = run("shadowed-rule", ctx)
    assert found.subject == "logical_axis_rules[1] [kv, ['expert']]"
    assert "its mesh axes (expert) are taken by other dimensions" in found.message


def test_a_fallback_that_applies_somewhere_is_not_shadowed():
    # mlp takes fsdp first in [embed, mlp] weights, where the second embed rule applies.
    rules = [["mlp", ["fsdp"]], ["embed", ["fsdp"]], ["embed", ["expert"]]]
    tensors = {"params/a": ("param", (64,), ("embed",)), "params/b": ("param", (64, 32), ("embed", "mlp"))}
    assert run("shadowed-rule", ctx_for(rules, tensors)) == []


# unmatched-name


def test_a_name_no_rule_mentions():
    ctx = ctx_for([["embed", ["fsdp"]], ["nrom", []]], {"params/scale": ("param", (64,), ("norm",))})
    (found,) = run("unmatched-name", ctx)
    assert found.subject == "logical name 'norm'" and found.severity == "info"
    assert "used by 1 parameters, inputs or activations (e.g. params/scale)" in found.message
    assert "the rule for 'nrom' may be meant for it" in found.message
    assert run("unmatched-name", ctx_for([["norm", []]], {"params/scale": ("param", (64,), ("norm",))})) == []


# absent-axis-rule and unit-axis-rule


def test_absent_axes_are_reported_on_rules_that_apply():
    rules = [["embed", ["fsdp", "tensor"]], ["qkv", ["context"]]]  # qkv is dead: reported as dead only
    ctx = ctx_for(rules, {"params/w": ("param", (64,), ("embed",))}, mesh=(("fsdp", 8),), mesh_axes=("fsdp",))
    (found,) = run("absent-axis-rule", ctx)
    assert found.subject == "logical_axis_rules[0] [embed, ['fsdp', 'tensor']]"
    assert "'tensor', which mesh_axes ['fsdp'] lacks" in found.message
    ok = ctx_for([["embed", ["fsdp"]]], {"params/w": ("param", (64,), ("embed",))}, mesh=(("fsdp", 8),))
    assert run("absent-axis-rule", ok) == []


UNIT_RULES = [["embed", ["stage", "fsdp"]], ["mlp", ["stage"]]]
UNIT_TENSORS = {"params/w": ("param", (64,), ("embed",)), "params/v": ("param", (32,), ("mlp",))}


def unit_ctx(mesh, **sizes) -> LintContext:
    """The unit-axis case on `mesh`, under a preset that sets `sizes` (none: as a MaxText rule file)."""
    chosen = preset(UNIT_RULES, ("stage", "fsdp", "expert"), **({"mesh": sizes} if sizes else {}))
    records = {path: placed(kind, shape, names, chosen, mesh) for path, (kind, shape, names) in UNIT_TENSORS.items()}
    return LintContext(preset=chosen, plan=plan(records, mesh))


def test_unit_axes_on_this_mesh():
    found = run("unit-axis-rule", unit_ctx((("stage", 1), ("fsdp", 8), ("expert", 1)), fsdp=-1))
    assert [f.severity for f in found] == ["info", "info"]
    assert "here the rule shards 'embed' over fsdp only" in found[0].message
    assert "here the rule replicates 'mlp'" in found[1].message
    assert run("unit-axis-rule", unit_ctx((("stage", 2), ("fsdp", 4), ("expert", 1)), fsdp=-1)) == []


def test_a_file_without_mesh_sizes_on_the_defaults_gets_one_note_instead():
    defaults = (("stage", 1), ("fsdp", 8), ("expert", 1))  # FSDP takes every device, as MaxText's defaults
    ctx = unit_ctx(defaults)
    assert run("unit-axis-rule", ctx) == []
    note = unsized_mesh_note(ctx.preset, defaults, "rules.yml")
    assert note == (
        "rules.yml sets no mesh sizes: planned on fsdp=8; its rules over stage shard nothing here — size them "
        "with --mesh, e.g. --mesh stage=2 (MaxText: ici_pipeline_parallelism=2)"
    )
    # Sized by the user (--mesh or ici_*_parallelism), the same file gets its per-rule findings and no note.
    sized = (("stage", 1), ("fsdp", 4), ("expert", 2))
    assert len(run("unit-axis-rule", unit_ctx(sized))) == 2
    assert unsized_mesh_note(ctx.preset, sized, "rules.yml") is None
    assert unsized_mesh_note(unit_ctx(defaults, fsdp=-1).preset, defaults, "rules.yml") is None


# indivisible-dim


def test_indivisible_dimensions_grouped_by_name():
    ctx = ctx_for([["embed", ["fsdp"]]], {"params/w": ("param", (64, 6), ("embed", "vocab"))})
    bad = (0, 6, ("fsdp",), 4)
    records = (
        Indivisible("inputs/tokens", (6, 32), ("fsdp", None), (bad,)),
        Indivisible("activations/a/x", (6, 32, 8), ("fsdp", None, None), (bad,)),
        Indivisible("activations/b/x", (6, 32, 8), ("fsdp", None, None), (bad,)),
        Indivisible("opt_state/0/mu/w", (6,), ("fsdp",), (bad,)),
    )
    found = run("indivisible-dim", LintContext(preset=ctx.preset, plan=ctx.plan, indivisible=records))
    assert [f.subject for f in found] == ["inputs/tokens"]
    assert found[0].severity == "error"
    assert "of size 6 is sharded over fsdp = 4 shards" in found[0].message
    assert "and 2 more tensors: activations/a/x, activations/b/x" in found[0].message
    assert run("indivisible-dim", ctx) == []


# silently-replicated


def test_a_dimension_whose_axis_another_dimension_took():
    rules = [["mlp", ["fsdp"]], ["embed", ["fsdp"]]]
    tensors = {"params/w": ("param", (64, 32), ("embed", "mlp")), "params/v": ("param", (64, 32), ("embed", "mlp"))}
    (found,) = run("silently-replicated", ctx_for(rules, tensors))
    assert found.subject == "params/v"
    assert "dimension 0 (embed) is replicated (and 1 more tensors" in found.message
    assert "rule [1] [embed, ['fsdp']] was skipped: 'fsdp' is taken by dimension 1 (mlp)" in found.message


def test_a_fallback_or_a_deliberate_replication_is_not_silent():
    tensors = {"params/w": ("param", (64, 32), ("embed", "mlp"))}
    fallback = [["mlp", ["fsdp"]], ["embed", ["fsdp"]], ["embed", ["expert"]]]
    deliberate = [["embed", []], ["mlp", ["fsdp"]], ["embed", ["fsdp"]]]
    size_one = [["mlp", ["fsdp"]], ["embed", ["stage"]]]
    assert run("silently-replicated", ctx_for(fallback, tensors)) == []
    assert run("silently-replicated", ctx_for(deliberate, tensors)) == []
    assert run("silently-replicated", ctx_for(size_one, tensors, mesh_axes=("stage", "fsdp", "expert"))) == []


# activation-name-on-weight, weight-name-on-activation, moe-name-outside-moe


def test_names_in_the_wrong_place():
    rules = [["embed", ["fsdp"]]]
    tensors = {
        "params/decoder/mlp/wi": ("param", (64, 32), ("activation_embed", "mlp")),
        "params/decoder/attn/q": ("param", (64, 32), ("embed", "heads")),
        "activations/decoder/attn/out": ("activation", (8, 64), ("activation_batch", "embed")),
        "activations/decoder/x": ("activation", (8, 64), ("activation_batch", "activation_embed")),
    }
    ctx = ctx_for(rules, tensors)
    assert [f.subject for f in run("activation-name-on-weight", ctx)] == ["params/decoder/mlp/wi"]
    (found,) = run("weight-name-on-activation", ctx)
    assert found.subject == "activations/decoder/attn/out" and "weight names embed" in found.message


def test_moe_names_belong_inside_the_moe_block():
    shared = "params/decoder/moe_layers/DeepSeekMoeBlock_0/shared_experts/wi_0/kernel"
    tensors = {
        "params/decoder/moe_layers/MoeBlock_0/wi_0": ("param", (8, 64, 32), ("exp", "embed_moe", "mlp_moe")),
        shared: ("param", (64, 32), ("embed", "mlp")),
        "params/decoder/moe_layers/self_attention/out": ("param", (4, 16, 64), ("heads", "kv", "embed_moe")),
        "activations/decoder/moe_layers/x": ("activation", (8, 32, 64), ("activation_batch_moe", None, None)),
    }
    found = run("moe-name-outside-moe", ctx_for([["embed", ["fsdp"]]], tensors))
    assert [f.subject for f in found] == [
        "activations/decoder/moe_layers/x",
        "params/decoder/moe_layers/self_attention/out",
    ]
    assert in_moe_block("params/decoder/layers/moe/wi") and not in_moe_block("params/decoder/moe_layers/mlp/wi")


# large-replicated


def test_large_replicated_parameters_with_their_optimizer_state():
    rules = [["embed", ["fsdp"]]]
    big = ("param", (2048, 4096), ("vocab", "mlp"))  # 32 MiB, no rule shards it
    tensors = {
        "params/emb": big,
        "opt_state/0/mu/emb": ("opt_state", (2048, 4096), ("vocab", "mlp")),
        "opt_state/0/nu/emb": ("opt_state", (2048, 4096), ("vocab", "mlp")),
        "params/w": ("param", (4096, 4096), ("embed", "mlp")),  # sharded over fsdp
        "params/small": ("param", (64,), ("norm",)),
    }
    (found,) = run("large-replicated", ctx_for(rules, tensors))
    assert found.subject == "params/emb"
    assert "32.0 MiB per device, 96.0 MiB with its 2 optimizer-state copies (threshold 16.0 MiB" in found.message
    higher = ctx_for(rules, tensors, mesh_axes=("fsdp", "expert"))
    higher = LintContext(preset=preset(rules, lint={"max_replicated_bytes": "64 MiB"}), plan=higher.plan)
    assert run("large-replicated", higher) == []
    one_device = ctx_for(rules, {"params/emb": big}, mesh=(("fsdp", 1), ("expert", 1)))
    assert run("large-replicated", one_device) == []


# dcn-weight-in-loop and dcn-collective-in-loop


def test_layer_weights_sharded_across_slices():
    rules = [["embed", ["data", "fsdp"]], ["vocab", ["data"]]]
    mesh = (("data", 2), ("fsdp", 4))
    tensors = {
        "params/decoder/layers/w": ("param", (64, 4, 32), ("embed", "layers", "mlp")),
        "params/embedding": ("param", (256, 64), ("vocab", None)),  # outside the layer loop
    }
    two = ctx_for(rules, tensors, mesh=mesh, mesh_axes=("data", "fsdp"), slices=2)
    (found,) = run("dcn-weight-in-loop", two)
    assert found.subject == "params/decoder/layers/w" and "have 'embed' sharded over 'data'" in found.message
    assert run("dcn-weight-in-loop", ctx_for(rules, tensors, mesh=mesh, mesh_axes=("data", "fsdp"))) == []
    # With fsdp spanning the slices (MaxText's dcn_fsdp_parallelism), the weights split over fsdp are the ones
    # gathered across them; data is an ordinary axis of each slice then.
    across = ctx_for(rules, tensors, mesh=mesh, mesh_axes=("data", "fsdp"), slices=2)
    case = dataclasses.replace(across.plan.case, overrides=(("dcn_axis", "fsdp"),))
    across = dataclasses.replace(across, plan=dataclasses.replace(across.plan, case=case))
    (found,) = run("dcn-weight-in-loop", across)
    assert "have 'embed' sharded over 'fsdp', which spans 2 slices" in found.message
    assert found.fix.endswith("or join the slices over 'data' (dcn_data_parallelism)")


def test_collectives_over_the_dcn_axis_inside_the_loop():
    rules = [["embed", ["fsdp"]]]
    base = ctx_for(rules, {"params/w": ("param", (64,), ("embed",))}, mesh=(("data", 2), ("fsdp", 4)))
    rows = [
        row("all-gather", ["data"], [8, 64], 4),
        row("all-reduce", ["data"], [64], 1),  # the gradient all-reduce, once per step
        row("all-gather", ["fsdp"], [64], 4),
    ]
    inside = plan(base.plan.tensor_map, base.plan.case.mesh, rows)
    found = run("dcn-collective-in-loop", LintContext(preset=base.preset, plan=inside, slices=2))
    assert [f.subject for f in found] == ["all-gather over data forward at decoder"]
    assert "inside loops of 4 trips: 1 rows (float32[8,64]), 2.0 KiB per iteration" in found[0].message
    assert run("dcn-collective-in-loop", LintContext(preset=base.preset, plan=inside, slices=1)) == []


# expert-gather-in-loop


def _expert_case(rows, rules=(("exp", ["expert"]), ("embed_moe", ["fsdp"]))):
    mesh = (("fsdp", 4), ("expert", 2))
    chosen = preset([list(r) for r in rules])
    weight = placed("param", (8, 4, 64, 32), ("exp", "moe_layers", "embed_moe", "mlp_moe"), chosen, mesh)
    return LintContext(preset=chosen, plan=plan({"params/decoder/moe_layers/MoeBlock_0/wi_0": weight}, mesh, rows))


def test_expert_weights_gathered_over_their_expert_axis_in_the_loop():
    ctx = _expert_case([row("all-gather", ["expert"], [1, 8, 64, 32], 4)])
    (found,) = run("expert-gather-in-loop", ctx)
    assert found.subject == "all-gather over expert float32[1,8,64,32] forward at decoder"
    assert "expert weights (wi_0, sharded over expert by their `exp` rule) are gathered over expert" in found.message


@pytest.mark.parametrize(
    "gather",
    [
        row("all-gather", ["fsdp"], [1, 4, 64, 32], 4),  # over FSDP: MaxText's own design
        row("all-gather", ["expert"], [8, 32, 64], 4),  # tokens, not a weight slice
        row("all-gather", ["expert"], [1, 8, 64, 32], 1),  # outside the layer loop
        row("all-to-all", ["expert"], [1, 8, 64, 32], 4),
    ],
)
def test_what_is_not_an_expert_gather(gather):
    assert run("expert-gather-in-loop", _expert_case([gather])) == []


def test_expert_gathers_need_the_compiled_step():
    ctx = _expert_case([row("all-gather", ["expert"], [1, 8, 64, 32], 4)])
    tensors_only = plan(ctx.plan.tensor_map, ctx.plan.case.mesh, compiled=False)
    assert run("expert-gather-in-loop", LintContext(preset=ctx.preset, plan=tensors_only)) == []


# hbm-overflow


def test_plans_that_do_not_fit_the_hardware():
    v5e = load_hardware("v5e")  # 16 GiB per chip, one device each
    sizes = dict(MESH)
    huge = tensor_record("param", (2**30, 3), "float32", ("embed", None), (None, None), sizes)  # 12 GiB
    small = tensor_record("param", (1024,), "float32", ("embed",), (None,), sizes)
    chosen = preset([["embed", ["fsdp"]]])
    (found,) = run("hbm-overflow", LintContext(preset=chosen, plan=plan({"params/w": huge}), hardware=v5e))
    assert found.severity == "error" and found.subject == "HBM per device on v5e"
    assert "a lower bound" in found.message and "params 12.0 GiB" in found.message
    assert run("hbm-overflow", LintContext(preset=chosen, plan=plan({"params/w": small}), hardware=v5e)) == []
    assert run("hbm-overflow", LintContext(preset=chosen, plan=plan({"params/w": huge}))) == []


def test_gpu_plans_are_held_against_their_gpus_memory_as_the_compiler_adds_it_up():
    h100 = load_gpu_hardware("h100")  # 80 GB
    chosen = preset([["embed", ["fsdp"]]])
    memory = (("argument_bytes", 30 * 10**9), ("output_bytes", 30 * 10**9), ("alias_bytes", 30 * 10**9))
    over = plan({}, memory=(*memory, ("temp_bytes", 60 * 10**9)), backend="gpu", topology="h100-1x8")
    ctx = LintContext(preset=chosen, plan=over, cluster=parse_gpu_cluster("h100-1x8"), gpu=h100)
    (found,) = run("hbm-overflow", ctx)
    assert found.subject == "HBM per device on h100" and "the GPU compiler's figures" in found.message
    assert "temp 55.9 GiB" in found.message
    under = dataclasses.replace(ctx, plan=plan({}, memory=(*memory, ("temp_bytes", 40 * 10**9)), backend="gpu"))
    assert run("hbm-overflow", under) == []


# network-collective-in-loop and tensor-parallel-across-network (GPU clusters)


def _gpu_ctx(rows, mesh=(("data", 2), ("fsdp", 4), ("tensor", 2)), cluster="h100-2x8"):
    chosen = preset([["embed", ["fsdp"]]], mesh_axes=[axis for axis, _ in mesh])
    on_gpu = plan({}, mesh, rows, backend="gpu", topology=cluster)
    return LintContext(preset=chosen, plan=on_gpu, slices=2, cluster=parse_gpu_cluster(cluster))


def _linked(op, axes, shape, trips, link):
    return dataclasses.replace(row(op, axes, shape, trips), link=link)


def test_loop_collectives_over_the_network_where_nvlink_could_carry_them():
    rows = [
        _linked("all-gather", ["fsdp"], [8, 64], 4, "network"),  # 4 GPUs: one host of 8 would hold them
        _linked("all-gather", ["fsdp"], [8, 64], 4, "nvlink"),
        _linked("all-reduce", ["data"], [64], 1, "network"),  # once per step: data parallelism
        _linked("all-reduce", ["data"], [64], 4, "network"),  # its gradient sum, layer by layer: still once
        _linked("all-gather", ["data", "fsdp"], [64], 4, "network"),  # 8 GPUs: would fit one host too
    ]
    found = run("network-collective-in-loop", _gpu_ctx(rows))
    assert [f.subject for f in found] == [
        "all-gather over data+fsdp forward at decoder",
        "all-gather over fsdp forward at decoder",
    ]
    assert "inside loops of 4 trips (1 rows, 2.0 KiB per iteration), although its 4 GPUs would fit one domain of 8" in (
        found[1].message
    )
    wide = [_linked("all-gather", ["data", "fsdp"], [64], 4, "network")]  # 16 GPUs: no host holds them
    assert run("network-collective-in-loop", _gpu_ctx(wide, mesh=(("data", 4), ("fsdp", 4)))) == []
    # TPU plans: the cross-slice lint's; GPU plans: never the cross-slice lint's
    assert run("network-collective-in-loop", dataclasses.replace(_gpu_ctx(rows), cluster=None)) == []
    assert run("dcn-collective-in-loop", _gpu_ctx(rows)) == []


def test_tensor_parallel_groups_split_across_nvlink_domains():
    rows = [
        _linked("all-reduce", ["tensor"], [8, 64], 4, "network"),
        _linked("all-reduce", ["tensor"], [64], 4, "network"),
        _linked("all-gather", ["fsdp"], [64], 4, "nvlink"),
    ]
    (found,) = run("tensor-parallel-across-network", _gpu_ctx(rows))
    assert found.subject == "tensor parallelism over tensor"
    assert "2 collective rows over tensor cross the network" in found.message
    assert "2 GPUs laid across hosts, where one domain of 8 would hold them): 9.0 KiB per device" in found.message
    big = run("tensor-parallel-across-network", _gpu_ctx(rows, mesh=(("fsdp", 1), ("tensor", 16))))
    assert "16 GPUs, more than one domain's 8" in big[0].message
    # the tensor rows are this lint's only: the loop lint leaves them out
    assert run("network-collective-in-loop", _gpu_ctx(rows)) == []
    on_nvlink = [dataclasses.replace(r, link="nvlink") for r in rows]
    assert run("tensor-parallel-across-network", _gpu_ctx(on_nvlink)) == []


# silencing, ordering and JSON


def test_silencing_by_lint_and_by_subject():
    rules = [["embed", ["fsdp"]], ["scratch_dim", []], ["spare_dim", []]]  # names no model uses
    ctx = ctx_for(rules, {"params/w": ("param", (64,), ("embed",))})
    assert {f.lint for f in run_checks(ctx)} == {"dead-rule"}
    settings = preset([], lint={"ignore": [{"id": "dead-rule", "subject": "[scratch_dim,"}]}).lint
    assert [f.subject for f in run_checks(ctx, settings)] == ["logical_axis_rules[2] [spare_dim, []]"]
    assert run_checks(ctx, preset([], lint={"ignore": ["dead-rule"]}).lint) == ()
    finding = Finding("dead-rule", "warning", "logical_axis_rules[2] [spare_dim, []]", "m", "f")
    assert silenced(finding, settings) is False


def test_findings_sort_most_severe_first_and_rules_in_file_order_and_round_trip():
    findings = [
        Finding("unit-axis-rule", "info", "logical_axis_rules[3] [a, ['x']]", "m", "f"),
        Finding("dead-rule", "warning", "logical_axis_rules[12] [b, []]", "m", "f"),
        Finding("dead-rule", "warning", "logical_axis_rules[2] [c, []]", "m", "f"),
        Finding("hbm-overflow", "error", "HBM per device on v5e", "m", "f"),
    ]
    ordered = sort_findings(findings)
    assert [f.subject for f in ordered] == [
        "HBM per device on v5e",
        "logical_axis_rules[2] [c, []]",
        "logical_axis_rules[12] [b, []]",
        "logical_axis_rules[3] [a, ['x']]",
    ]
    # Each finding reads back from a plan's JSON as it was written.
    golden = Path(__file__).resolve().parent.parent / "golden" / "deepseek-tiny" / "cpu-8" / "default.json"
    plan = dataclasses.replace(load_plan(golden), findings=tuple(findings))
    assert sorted(plan_from_json(plan_to_json(plan)).findings, key=repr) == sorted(findings, key=repr)
    # A rule's identity across plans ignores its position.
    assert findings[1].key == ("dead-rule", "logical_axis_rules [b, []]")
