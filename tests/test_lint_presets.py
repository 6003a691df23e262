"""MaxText's six rule files and every built-in preset, linted on both tiny models.

The expected findings are derived here from the rule files and from the logical names each model uses, as
read off the model code (not from the tool's output): a rule whose name the model never uses is dead; a name
the model uses that no rule mentions is unmatched; rules that apply and name an axis the mesh lacks, or one of
size 1, are reported as such; and the few rules that earlier rules always beat are listed by hand with why.
A built-in preset must come out clean: its findings fixed, or silenced with the reason in the file.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from shardscope.case import resolve_case
from shardscope.case.presets import PRESET_DIR, builtin_preset_names, get_preset, load_preset_file
from shardscope.case.topology import format_mesh
from shardscope.golden.planning import lint_case
from shardscope.lint.family_names import FAMILY_NAMES

DATA = Path(__file__).parent / "data" / "maxtext" / "custom_mesh_and_rule"
MAXTEXT_FILES = sorted(DATA.glob("*.yml"))
MODELS = ("deepseek-tiny", "mixtral-tiny")

# The residual stream (both families), the MoE's tokens, the inputs (MaxText's input sharding) and the loss
# (each token's cross-entropy placed on activation_embed_and_logits_batch, activation_length, as MaxText's).
_COMMON = {
    "activation_length",
    "activation_batch",
    "activation_norm_length",
    "activation_embed",
    "activation_embed_and_logits_batch",
    "activation_batch_attn",
    "activation_kv_batch",
    "activation_kv_heads",
    "activation_kv_head_dim",
    "activation_heads",
    "activation_kv",
    # weights: embedding and logits, norms, attention projections, experts
    "vocab",
    "embed_vocab",
    "norm",
    "embed",
    "q_heads",
    "kv_heads",
    "kv_head_dim",
    "kv",
    "heads",
    "exp",
    "embed_moe",
    "mlp_moe",
    # resolved by the MoE to place its expert weights, (exp, None, mlp_no_fsdp), never recorded on a tensor
    "mlp_no_fsdp",
}
MODEL_NAMES = {
    # MLA (low-rank q and kv), dense MLP layers (mlp, activation_mlp), two layer stacks.
    "deepseek-tiny": _COMMON
    | {"q_lora", "q_lora_up_proj", "kv_lora", "kv_lora_up_proj", "mlp", "activation_mlp"}
    | {"dense_layers", "moe_layers"},
    # GQA attention's own activation names, one layer stack, no dense MLP.
    "mixtral-tiny": _COMMON
    | {"activation_input_length_attn", "activation_embed_attn", "activation_length_attn", "layers"},
}
# Every name some model family uses, per the checked-in table (test_lint_families.py keeps it true).
FAMILY_USED = {name for names in FAMILY_NAMES.values() for name in names}
# Resolved only under Explicit mesh axes (the embedding's and the logits' out_sharding).
EXPLICIT_NAMES = {"activation_vocab"}

# Rules that apply to nothing because earlier rules always win, as (name, which rule for that name, from 1):
SHADOWED = {
    # base.yml: the heads take `tensor` before activation_kv / activation_kv_head_dim can; DeepSeek's q_lora and
    # kv_lora weights never lose fsdp_transpose, so their second rule never applies; Mixtral has no dense MLP to
    # take fsdp_transpose from `embed`, and its only embed_moe tensors are expert weights whose mlp_moe takes it.
    ("default", "deepseek-tiny"): {("activation_kv", 1), ("activation_kv_head_dim", 1), ("q_lora", 2), ("kv_lora", 2)},
    ("default", "mixtral-tiny"): {("activation_kv", 1), ("activation_kv_head_dim", 1), ("embed_moe", 1), ("embed", 2)},
    # The second embed rule is the fallback for weights whose fsdp_transpose mlp takes: Mixtral has none.
    ("ep-as-dp", "mixtral-tiny"): {("embed", 2)},
    # activation_kv and activation_kv_head_dim lose `tensor` to the heads.
    ("pipeline-large-moe", "deepseek-tiny"): {("activation_kv", 1), ("activation_kv_head_dim", 1)},
    ("pipeline-large-moe", "mixtral-tiny"): {("activation_kv", 1), ("activation_kv_head_dim", 1)},
}


def expected_trace_findings(name: str, rules: list, mesh_axes: list, mesh: dict, model: str, explicit: bool):
    """{lint id: set of (rule name, occurrence) or names} a reviewer would list for this file on this model."""
    names = MODEL_NAMES[model] | (EXPLICIT_NAMES if explicit else set())
    seen: Counter = Counter()
    dead, absent, unit = set(), set(), set()
    shadowed = SHADOWED.get((name, model), set())
    for logical, axes in rules:
        axes = [axes] if isinstance(axes, str) else list(axes)
        seen[logical] += 1
        rule = (logical, seen[logical])
        if logical not in names:
            dead.add(rule)
        elif rule not in shadowed:
            if any(axis not in mesh_axes for axis in axes):
                absent.add(rule)
            if any(axis in mesh_axes and mesh.get(axis, 1) == 1 for axis in axes):
                unit.add(rule)
    ruled = {logical for logical, _ in rules}
    # Dead rules whose name a model family uses (the checked-in table), or that MaxText's shared rules (the
    # built-in default preset, its base.yml) carry for its other models, are one summary, not warnings.
    shared = FAMILY_USED | {name for name, _ in get_preset("default").logical_axis_rules}
    for_others = {rule for rule in dead if rule[0] in shared}
    return {
        "dead-rule": dead - for_others,
        "rules-for-other-models": for_others,
        "shadowed-rule": shadowed,
        "absent-axis-rule": absent,
        "unit-axis-rule": unit,
        "unmatched-name": {(n,) for n in names - ruled},
    }


def found_by_lint(report, rules: list) -> dict:
    """The report's findings, as the expectations spell them: rules by (name, occurrence), names by (name,)."""
    occurrence = {}
    seen: Counter = Counter()
    for index, (logical, _) in enumerate(rules):
        seen[logical] += 1
        occurrence[index] = (logical, seen[logical])
    found: dict = {}
    for finding in report.findings:
        if finding.lint == "rules-for-other-models":
            found[finding.lint] = {occurrence[int(i)] for i in re.findall(r"\[(\d+)\] ", finding.message)}
            continue
        if finding.subject.startswith("logical_axis_rules["):
            key = occurrence[int(finding.subject.split("]")[0].split("[")[1])]
        else:
            key = (finding.subject.split("'")[1],)
        found.setdefault(finding.lint, set()).add(key)
    return found


def _lint(model: str, preset: str, mesh: dict):
    case = resolve_case(model, preset, mesh={k: v for k, v in mesh.items()})
    return lint_case(case, compile=False)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("path", MAXTEXT_FILES, ids=lambda p: p.stem)
def test_maxtext_rule_files(path, model):
    raw = yaml.safe_load(path.read_text())
    # Linted on the mesh the built-in preset of the same name plans it on.
    mesh = {axis: size for axis, size in get_preset(path.stem).mesh if size != -1}
    report = _lint(model, str(path), mesh)
    sizes = dict(resolve_case(model, str(path), mesh=mesh).mesh)
    expected = expected_trace_findings(path.stem, raw["logical_axis_rules"], raw["mesh_axes"], sizes, model, False)
    found = found_by_lint(report, raw["logical_axis_rules"])
    assert {lint: keys for lint, keys in found.items()} == {lint: keys for lint, keys in expected.items() if keys}
    assert not report.compiled


def test_ep_as_cp_leaves_ten_rules_dead_on_deepseek():
    # The count: 10 of the rules in MaxText's ep-as-cp.yml match no tensor of DeepSeek. Three name what
    # Llama's and Mixtral's GQA attention and layer stack use; seven what MaxText's other models use (its
    # shared base.yml rules carry them). All ten are one summary, none a warning.
    report = _lint("deepseek-tiny", str(DATA / "ep-as-cp.yml"), {"expert": 2})
    assert [f for f in report.findings if f.lint == "dead-rule"] == []
    (summary,) = [f for f in report.findings if f.lint == "rules-for-other-models"]
    maxtext = (
        "[1] activation_embed_and_logits_batch_sequence, [8] activation_q_length, [9] activation_kv_length, "
        "[17] qkv, [24] activation_batch_moe, [25] activation_exp, [33] activation_stage"
    )
    listed = "[7] activation_length_attn, [10] activation_embed_attn, [35] layers"
    assert f"MaxText's other models: {maxtext}; llama, mixtral: {listed}" in summary.message


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", builtin_preset_names())
def test_builtin_presets_are_clean_and_silence_only_what_they_explain(name, model):
    preset = get_preset(name)
    report = _lint(model, name, {})
    assert report.findings == ()
    # What a built-in silences, it silences with the reason written next to it.
    if preset.lint.ignore or preset.lint.ignore_subjects:
        assert _lint_block_comments(name)


def _lint_block_comments(name: str) -> list[str]:
    """The comment lines just above a preset file's `lint:` key and inside its block."""
    lines = (PRESET_DIR / f"{name}.yaml").read_text().splitlines()
    start = lines.index("lint:")
    above = []
    for line in reversed(lines[:start]):
        if not line.startswith("#"):
            break
        above.append(line)
    inside = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        inside.append(line.strip())
    return above + [line for line in inside if line.startswith("#")]


@pytest.mark.parametrize("name", ["ep-tp", "explicit-pipeline"])
def test_shardscopes_own_presets_have_no_rule_dead_for_both_families(name):
    # They serve both families (so each leaves some of the other's rules dead, which they silence), but a rule
    # that no family uses in any shard mode is a mistake to fix, not to silence.
    preset = load_preset_file(PRESET_DIR / f"{name}.yaml")
    used = MODEL_NAMES["deepseek-tiny"] | MODEL_NAMES["mixtral-tiny"] | EXPLICIT_NAMES
    assert [logical for logical, _ in preset.logical_axis_rules if logical not in used] == []


@pytest.mark.slow
def test_builtin_golden_plans_carry_no_findings(plan_for_golden_case):
    # The compiled lints (collectives, the compiler's warnings) on every built-in case of the golden matrix.
    from shardscope.golden.cases import load_manifest

    for case in load_manifest(Path(__file__).parent.parent / "golden"):
        assert plan_for_golden_case(case).findings == (), case.case_id


def test_maxtexts_ep_as_cp_file_compiled_shows_the_embeddings_rematerialisation():
    # embed_vocab puts the embedding table's embed dimension on fsdp×expert, so the lookup comes out sharded
    # on its last dimension; the residual stream wants batch on fsdp (activation_batch) and the sequence on
    # expert (activation_norm_length). XLA cannot move between the two with collectives.
    case = resolve_case("deepseek-tiny", str(DATA / "ep-as-cp.yml"), mesh={"expert": 2})
    report = lint_case(case)
    remat = [f for f in report.findings if f.lint == "involuntary-remat"]
    assert remat[0].subject == "gather f32[8,32,8] at token_embedder (forward pass)"
    assert "from P(None, None, ('fsdp', 'expert')) to P('fsdp', 'expert', None)" in remat[0].message
    assert report.compiled and format_mesh(case.mesh) == "data=1,stage=1,fsdp=4,expert=2"
