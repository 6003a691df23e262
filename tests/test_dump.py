"""Plans of the tiny cases: complete, showing each preset's meaning, deterministic across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import PRESETS, TINY_MODELS
from shardscope.plan import plan_from_json, plan_to_json

ROUTED_EXPERTS = {
    "deepseek-tiny": "params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0",
    "mixtral-tiny": "params/decoder/layers/MoeBlock_0/wi_0",
}
MAIN_STACK = {"deepseek-tiny": "moe_layers", "mixtral-tiny": "layers"}
QUERY = {
    "deepseek-tiny": "activations/decoder/moe_layers/self_attention/query",
    "mixtral-tiny": "activations/decoder/layers/self_attention/query",
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("model", (*TINY_MODELS, "llama-tiny"))
def test_plan_is_complete_and_round_trips(model, preset, tiny_plans):
    plan = tiny_plans(model, preset)
    kinds = {t.kind for _, t in plan.tensors}
    assert kinds == {"param", "opt_state", "input", "activation", "output"}
    assert plan_from_json(plan_to_json(plan)) == plan
    for path, tensor in plan.tensors:
        assert len(tensor.spec) == len(tensor.shape) == len(tensor.shard_shape), path
        assert all(e is None or isinstance(e, (str, tuple)) for e in tensor.spec), path
    # Every parameter has its logical axes, its optimizer moments the same spec, and an output twin.
    tensors = plan.tensor_map
    params = {p: t for p, t in tensors.items() if t.kind == "param"}
    assert params
    for path, param in params.items():
        assert param.logical is not None and len(param.logical) == len(param.shape), path
        leaf = path.removeprefix("params/")
        assert tensors[f"opt_state/0/mu/{leaf}"].spec == param.spec
        assert tensors[f"outputs/params/{leaf}"].spec == param.spec
    assert dict(plan.memory)["argument_bytes"] > 0


@pytest.mark.parametrize("model", TINY_MODELS)
def test_shard_exp_on_fsdp_puts_routed_experts_on_expert_and_fsdp(model, tiny_plans):
    wi = tiny_plans(model, "shard-exp-on-fsdp").tensor_map[ROUTED_EXPERTS[model]]
    # [experts, layers, embed, mlp]: the stacked layer dimension sits at index 1, as in MaxText.
    assert wi.logical == ("exp", MAIN_STACK[model], "embed_moe", "mlp_moe")
    assert wi.spec[0] == ("expert", "fsdp")
    assert wi.spec[2] is None  # embed_moe is on `context`, of size 1
    default = tiny_plans(model, "default").tensor_map[ROUTED_EXPERTS[model]]
    assert default.spec[0] == "expert" and default.spec[2] == "fsdp"
    assert wi.bytes_per_device == default.bytes_per_device


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ep_as_cp_shards_attention_sequence_over_expert(model, tiny_plans):
    query = tiny_plans(model, "ep-as-cp").tensor_map[QUERY[model]]
    # MLA's query is on `activation_length`, grouped-query attention's on `activation_length_attn`.
    assert query.logical[1] == {"deepseek-tiny": "activation_length", "mixtral-tiny": "activation_length_attn"}[model]
    assert query.spec[1] == "expert"
    assert tiny_plans(model, "default").tensor_map[QUERY[model]].spec[1] is None
    tokens = tiny_plans(model, "ep-as-cp").tensor_map["inputs/tokens"]
    assert tokens.spec == ("fsdp", "expert")  # data and stage have size 1: they shard nothing


@pytest.mark.slow
@pytest.mark.parametrize("model", TINY_MODELS)
def test_explicit_pipeline_splits_the_main_stack_over_stages_and_rotates_microbatches(model, tiny_plans):
    plan = tiny_plans(model, "explicit-pipeline")
    assert plan.case.axis_types == "explicit"
    mesh = dict(plan.case.mesh)
    stages, microbatches = mesh["stage"], 2
    assert stages == 2
    params = {p: t for p, t in plan.tensor_map.items() if t.kind == "param"}
    # MaxText's pipeline layout: one visit per stage, two layers a visit, [stages, …] under `layers_0`, `layers_1`.
    assert not any(p.startswith(f"params/decoder/{MAIN_STACK[model]}/") for p in params)
    stack = {p: t for p, t in params.items() if p.startswith("params/decoder/pipeline_module/layers/")}
    assert {p.split("/")[4] for p in stack} == {"layers_0", "layers_1"}
    for path, tensor in stack.items():
        assert tensor.logical is not None and tensor.logical[0] == "layers", path
        assert tensor.spec[0] == "stage", path
        assert tensor.shape[0] == stages and tensor.shard_shape[0] == 1, path
    # DeepSeek's leading dense layers stay outside the pipeline (their stacked dimension is `dense_layers`).
    for path, tensor in params.items():
        if path.startswith("params/decoder/dense_layers/"):
            assert tensor.logical is not None and tensor.logical[1] == "dense_layers", path
            assert tensor.spec[1] is None, path
    # One visit per stage, MaxText's loop state: at each of microbatches + stages - 1 iterations `shift` carries
    # each stage's output to the next and `state_io` hands each stage's slot of microbatches to the one before
    # (two rotations over `stage`, by one place, the next iteration waiting for the first only); the backward
    # pass runs both transposed (the schedule keeps each layer's input, so its forward loop is not run again).
    permutes = [r for r in plan.collectives if r.op == "collective-permute" and r.axes == ("stage",)]
    trips = microbatches + stages - 1
    runs = {p: sum(r.count * r.loop_trips for r in permutes if r.pass_ == p) for p in ("forward", "backward")}
    assert runs == {"forward": 2 * trips, "backward": 2 * trips}
    assert all(r.shift == 1 and r.loop_trips == trips for r in permutes)
    assert [r.handoff for r in permutes if r.pass_ == "forward"].count(True) == 1
    # The outputs leave the loop state split over the stages and are gathered over `stage` (with Explicit axes
    # the batch after the pipeline is not split over it): no sum over the stages.
    stage_rows = [r for r in plan.collectives if r.axes == ("stage",) and r.source.startswith("decoder")]
    assert any(r.op == "all-gather" and r.pass_ == "forward" for r in stage_rows)
    assert not any(r.op == "all-reduce" and r.pass_ == "forward" for r in stage_rows)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["explicit", "auto"])
@pytest.mark.parametrize("model", TINY_MODELS)
def test_a_circular_pipeline_rotates_once_per_step_of_its_longer_schedule(model, mode, plan_of):
    from shardscope.case import resolve_case

    plan = plan_of(resolve_case(model, "explicit-pipeline", overrides={"pipeline.repeats": "2", "shard_mode": mode}))
    stages, microbatches, repeats = dict(plan.case.mesh)["stage"], 2, 2
    permutes = [r for r in plan.collectives if r.op == "collective-permute" and r.axes == ("stage",)]
    assert stages == 2
    # microbatches · repeats + stages - 1 steps, each ending in the loop state's two rotations (as many
    # microbatches as stages: `shift` takes the last stage's output straight round to stage 0, no circular
    # storage), and the backward pass runs each transposed: every step is one loop (each picks its visit's
    # weights at a traced index, with Auto axes as with Explicit ones).
    steps = microbatches * repeats + stages - 1
    runs = {p: sum(r.count * r.loop_trips for r in permutes if r.pass_ == p) for p in ("forward", "backward")}
    assert runs == {"forward": 2 * steps, "backward": 2 * steps}


def test_shard_shape_and_bytes_follow_the_spec(tiny_plans):
    wi = tiny_plans("deepseek-tiny", "default").tensor_map[ROUTED_EXPERTS["deepseek-tiny"]]
    # [experts, layers, embed, mlp] with experts over expert=2 and embed over fsdp=4.
    experts, layers, embed, mlp = wi.shape
    assert wi.shard_shape == (experts // 2, layers, embed // 4, mlp)
    assert wi.bytes_per_device == (experts // 2) * layers * (embed // 4) * mlp * 4


def _dump_in_fresh_process(tmp_path, name):
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(
        [sys.executable, "-m", "shardscope.cli", "dump", "mixtral-tiny", "--preset", "ep-as-cp", "-o", str(out)],
        check=True,
        capture_output=True,
        env=env,
    )
    data = json.loads(out.read_text())
    data.pop("provenance")
    return json.dumps(data, sort_keys=True, indent=2), out.read_text()


@pytest.mark.slow
def test_two_processes_give_byte_identical_json(tmp_path):
    first, first_raw = _dump_in_fresh_process(tmp_path, "a")
    second, second_raw = _dump_in_fresh_process(tmp_path, "b")
    assert first == second
    # Provenance is deterministic too on one machine, so the whole file matches byte for byte.
    assert first_raw == second_raw
    assert first_raw.endswith("}\n")


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("model", TINY_MODELS)
def test_tensors_only_plan_has_exactly_the_compiled_plans_tensors(model, preset, tiny_plans):
    from shardscope.case import resolve_case
    from shardscope.golden.pipeline import plan_case

    full = tiny_plans(model, preset)
    partial = plan_case(resolve_case(model, preset), tensors_only=True)
    assert partial.tensors == full.tensors
    assert partial.parts == ("tensors",) and partial.collectives == () and partial.memory == ()
    assert plan_from_json(plan_to_json(partial)) == partial
