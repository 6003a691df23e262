"""Fidelity to MaxText: shardscope plans MaxText's own cases exactly as MaxText's sharding dump does.

Every directory under data/maxtext/sharding_info is a dump that MaxText's `tests/utils/sharding_dump.py`
wrote (its checked-in goldens for deepseek2-16b, and further cases; see data/maxtext/README.md). For each,
the same case is planned here (tensors only: shardings need no compile) and compared entry by entry: the
train state's paths, shapes, logical axes and physical specs, and every activation constraint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reference_models import MODELS
from shardscope.case import resolve_case
from shardscope.case.presets import builtin_preset_names, get_preset
from shardscope.case.resolve import resolve_maxtext_case
from shardscope.case.rules import drop_unit_axes
from shardscope.extract.maxtext_dump import (
    UNNAMED,
    DumpActivation,
    equivalent_mesh_and_settings,
    parse_dump_path,
    read_dump,
)
from shardscope.golden.pipeline import plan_case
from shardscope.plan import Plan

# The quick lane (`-m "not slow"`) leaves these out: every MaxText dump's case planned from its command line.
pytestmark = pytest.mark.slow

MAXTEXT = Path(__file__).parent / "data" / "maxtext"
ALL_DUMPS = sorted(path.parent for path in (MAXTEXT / "sharding_info").rglob("named_shardings.json"))
# The dumps of models shardscope has (MaxText's goldens also cover gpt-oss-20b and qwen3-0.6b).
DUMPS = [d for d in ALL_DUMPS if parse_dump_path(d).model in MODELS]
# Rule files of our own that some dumps were made with (MaxText's own are built-in presets).
RULES = MAXTEXT / "rules"

# The source file MaxText names an activation after, by the module that makes the constraint here.
_FILE_OF_PARENT = {
    "self_attention": {"deepseek": "attention_mla", "mixtral": "attentions", "llama": "attentions"},
    "mlp": {"deepseek": "linears", "llama": "linears"},
    "shared_experts": {"deepseek": "linears"},
    "MoeBlock_0": {"deepseek": "moe", "mixtral": "moe"},
    # A pipeline's loop state (`state_io`, `shift`).
    "pipeline_module": {"deepseek": "pipeline", "mixtral": "pipeline", "llama": "pipeline"},
}
_LAYER_STACKS = ("dense_layers", "moe_layers", "layers")
# MaxText's Mixtral layer constrains its residual stream with nn.with_logical_constraint, which its dump does
# not record; DeepSeek's layer records it (as "deepseek/…"); Llama's records it without a name ("Unknown",
# one entry per distinct type and spec, as a set of ours with the name "Unknown" is).
_RECORDED_LAYER_FILE = {"deepseek": "deepseek", "llama": UNNAMED}
# Constraints MaxText makes inside its TPU attention kernel, which the plain attention here does not have.
UNMODELLED_FILES = {"attention_op"}

Entry = tuple[str, str, tuple[int, ...], str, tuple[str | None, ...] | None, tuple]


def maxtext_file(path: str, family: str) -> str | None:
    """The MaxText source file whose dump names this activation, or None if MaxText does not record it."""
    parts = path.removeprefix("activations/").split("/")
    parent = parts[-2] if len(parts) > 1 else ""
    if parent in _LAYER_STACKS:
        return _RECORDED_LAYER_FILE.get(family)
    return _FILE_OF_PARENT.get(parent, {}).get(family)


def maxtext_command_line(directory: Path) -> tuple[str | None, str]:
    """The preset file (for a rule file of a user's) and the MaxText command line the dump was made with: its
    rule as `custom_mesh_and_rule`, its topology as `compile_topology`, its overrides as written."""
    case = parse_dump_path(directory)
    words = [f"compile_topology={case.topology}", f"compile_topology_num_slices={case.slices}"]
    preset = None
    if case.rule in builtin_preset_names():
        words.append(f"custom_mesh_and_rule={case.rule}")
    else:
        preset = str(RULES / f"{case.rule}.yml")
    words += [f"{key}={value}" for key, value in case.overrides]
    return preset, " ".join(words)


def maxtext_name(path: str, file: str) -> str:
    """The name MaxText's dump gives this activation: its variable's, unless MaxText could not name it."""
    return UNNAMED if file == UNNAMED else path.rsplit("/", 1)[-1]


def plan_like_dump(directory: Path) -> Plan:
    """The case planned from MaxText's own command line (`--maxtext`), as a user would give it."""
    preset, command = maxtext_command_line(directory)
    case, _ = resolve_maxtext_case(parse_dump_path(directory).model, preset, None, command)
    return plan_case(case, tensors_only=True)


def their_entry(activation: DumpActivation, sizes: dict[str, int]) -> Entry:
    spec = drop_unit_axes(activation.spec, sizes)
    return (activation.module_file, activation.name, activation.shape, activation.dtype, activation.logical, spec)


@pytest.fixture(scope="module", params=DUMPS, ids=lambda d: "/".join(d.relative_to(MAXTEXT / "sharding_info").parts))
def dump_and_plan(request):
    return read_dump(request.param), plan_like_dump(request.param)


def test_dumps_cover_the_goldens_and_every_model():
    assert len(DUMPS) >= 8
    # Seed 003's pipelines: one circular layer a visit (auto, explicit, ZeRO-1), four, and one visit (GPipe).
    pipelined = [d for d in DUMPS if dict(parse_dump_path(d).overrides).get("ici_pipeline_parallelism") == "2"]
    assert len(pipelined) >= 5
    models = {parse_dump_path(d).model for d in DUMPS}
    assert {"deepseek2-16b", "deepseek3-671b", "mixtral-8x7b", "mixtral-8x22b", "llama2-7b", "llama3-8b"} <= models
    goldens = [d for d in DUMPS if parse_dump_path(d).model == "deepseek2-16b"]
    assert {parse_dump_path(d).rule for d in goldens} >= {
        "default",
        "pure-fsdp",
        "ep-as-cp",
        "cp-as-ep",
        "ep-as-dp",
        "shard-exp-on-fsdp",
        "pipeline-large-moe",
    }


def test_mesh_is_maxtexts(dump_and_plan):
    dump, plan = dump_and_plan
    assert plan.case.mesh == dump.mesh


def test_train_state_is_maxtexts(dump_and_plan, request):
    dump, plan = dump_and_plan
    directory = request.node.callspec.params["dump_and_plan"]
    sizes = dict(dump.mesh)
    ours = {path: t for path, t in plan.tensors if t.kind in ("param", "opt_state")}
    # MaxText's train state also counts steps (`step`); the optimizer's own counts are compared.
    theirs = {t.path: t for t in dump.tensors if t.path != "step"}
    assert sorted(ours) == sorted(theirs)
    if dict(parse_dump_path(directory).overrides).get("shard_optimizer_over_data") == "true":
        # ZeRO-1: MaxText's dump writes the parameters as the rules place them; its train step stores them as
        # their first Adam moment is stored (`maybe_update_params_sharding_with_opt`), and so does a plan.
        theirs = {
            path: dataclasses.replace(t, spec=theirs[f"opt_state/0/mu/{path.removeprefix('params/')}"].spec)
            if path.startswith("params/")
            else t
            for path, t in theirs.items()
        }
    # Llama has the fewest parameters: embedding, 2 layer norms, q/k/v/out, wi_0/wi_1/wo, final norm, logits.
    assert sum(1 for path in theirs if path.startswith("params/")) >= 12
    assert sum(1 for path in theirs if "/mu/" in path or "/nu/" in path) == 2 * sum(
        1 for path in theirs if path.startswith("params/")
    )
    different = {
        path: ((ours[path].shape, ours[path].logical or (), ours[path].spec), (t.shape, t.logical, want))
        for path, t in theirs.items()
        if (ours[path].shape, ours[path].logical or (), ours[path].spec)
        != (t.shape, t.logical, want := drop_unit_axes(t.spec, sizes))
    }
    assert not different


def test_activations_are_maxtexts(dump_and_plan):
    dump, plan = dump_and_plan
    sizes = dict(dump.mesh)
    family = MODELS[plan.case.model].family
    theirs = {their_entry(a, sizes) for a in dump.activations if a.module_file not in UNMODELLED_FILES}
    ours = set()
    for path, t in plan.tensors:
        # MaxText's dump of a pipelined run records the pipeline's loop state and nothing from inside its
        # stages (the layers run under the stages' vmap there).
        inside = "/pipeline_module/layers/" in path
        if t.kind == "activation" and not inside and (file := maxtext_file(path, family)) is not None:
            ours.add((file, maxtext_name(path, file), t.shape, t.dtype, t.logical, t.spec))
    assert ours == theirs
    pipelined = "pipeline" in {a.module_file for a in dump.activations}
    named = [a for a in dump.activations if a.logical is not None and a.module_file not in UNMODELLED_FILES]
    assert len(named) >= (2 if pipelined else 8)
    # What is left out is MaxText's attention kernel only.
    assert {a.module_file for a in dump.activations} - {entry[0] for entry in ours} <= UNMODELLED_FILES


def test_the_comparison_catches_one_changed_rule(tmp_path):
    """The checks above can fail: one rule edited in a copy of ep-as-cp moves exactly what it names."""
    directory = next(d for d in DUMPS if parse_dump_path(d).model == "deepseek2-16b" and "rule_ep-as-cp" in d.name)
    dump = read_dump(directory)
    rules = tmp_path / "ep-as-cp.yml"
    text = (MAXTEXT / "custom_mesh_and_rule" / "ep-as-cp.yml").read_text()
    rules.write_text(text.replace("['activation_kv_batch', ['data', 'fsdp']],", "['activation_kv_batch', []],"))
    case = parse_dump_path(directory)
    mesh, settings = equivalent_mesh_and_settings(case, get_preset(str(rules)).mesh_axes)
    plan = plan_case(resolve_case(case.model, str(rules), case.topology, mesh, settings), tensors_only=True)
    sizes = dict(dump.mesh)
    theirs = {their_entry(a, sizes) for a in dump.activations if a.module_file not in UNMODELLED_FILES}
    ours = {
        (maxtext_file(p, "deepseek"), p.rsplit("/", 1)[-1], t.shape, t.dtype, t.logical, t.spec)
        for p, t in plan.tensors
        if t.kind == "activation" and maxtext_file(p, "deepseek") is not None
    }
    moved = {entry[1] for entry in theirs - ours}
    # Exactly the attention's queries, keys and values (their batch is activation_kv_batch) differ.
    assert moved == {"q_nope", "q_pe", "query", "key_nope", "key_rope", "key", "value"}
