"""MaxText's command line (`--maxtext`): keys checked as MaxText checks them, meshes sized as MaxText sizes
them, settings translated. That a command line gives MaxText's own mesh and shardings is held against
MaxText's dumps in test_maxtext_fidelity.py (every dump there is planned from its command line)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import yaml

import shardscope
from shardscope.case.maxtext_run import RUN_ONLY_KEYS, check_maxtext_value, maxtext_defaults, maxtext_run
from shardscope.case.resolve import resolve_case, resolve_maxtext_case
from shardscope.case.tpu import libtpu_version
from shardscope.errors import ShardscopeError
from shardscope.golden.pipeline import plan_case
from shardscope.plan import plan_to_json

TINY = "max_target_length=32 per_device_batch_size=1"


def test_defaults_are_maxtexts_base_yml():
    defaults = maxtext_defaults()
    # Facts of MaxText's base.yml (the file shipped is MaxText's own, unedited).
    assert defaults["per_device_batch_size"] == 12.0 and defaults["max_target_length"] == 2048
    assert defaults["ici_fsdp_parallelism"] == -1 and defaults["dcn_data_parallelism"] == -1
    assert defaults["remat_policy"] == "full" and defaults["sparse_matmul"] is True
    assert all(key in defaults for key in RUN_ONLY_KEYS), sorted(k for k in RUN_ONLY_KEYS if k not in defaults)


def test_values_take_the_type_of_their_default():
    assert check_maxtext_value("per_device_batch_size", "2") == 2.0
    assert check_maxtext_value("ici_fsdp_parallelism", "-1") == -1
    assert check_maxtext_value("use_ring_of_experts", "True") is True
    assert check_maxtext_value("mesh_axes", "['data', 'fsdp']") == ["data", "fsdp"]
    with pytest.raises(ShardscopeError, match="expected an integer"):
        check_maxtext_value("base_num_decoder_layers", "2.5")


def test_a_command_line_plans_the_same_case_as_presets_mesh_and_settings():
    case, run = resolve_maxtext_case(
        "mixtral-tiny", None, None, f"custom_mesh_and_rule=ep-as-cp ici_expert_parallelism=2 {TINY} steps=5"
    )
    # ICI: fsdp (-1 by default) fills the 8 devices the expert axis leaves: 4.
    same = resolve_case(
        "mixtral-tiny",
        "ep-as-cp",
        "cpu-8",
        {"data": 1, "stage": 1, "fsdp": 4, "expert": 2},
        {"model.seq_len": "32", "model.per_device_batch": "1", "model.global_batch": "0"}
        # How the step runs, MaxText's defaults (base.yml): its attention kernel, bfloat16, full remat, and
        # its dropless MoE as capacity factor 1 on the grouped-matmul kernel.
        | {"model.attention_kernel": "autoselected", "model.dtype": "bfloat16", "model.remat": "full"}
        | {"model.capacity_factor": "1", "model.expert_matmul": "grouped"},
    )
    assert case == same
    assert plan_to_json(plan_case(case, tensors_only=True)) == plan_to_json(plan_case(same, tensors_only=True))
    assert not any("steps" in line for line in run.warnings)  # a run-only key changes nothing: no warning


def test_dcn_axes_span_slices_and_ici_axes_fill_a_slice():
    # 2 slices of v5p-8 (4 devices each): ICI fsdp fills what expert=2 leaves of a slice (2); DCN data fills the
    # slices (2); each axis is ICI × DCN.
    run = maxtext_run("ici_expert_parallelism=2", "mixtral-8x7b", ("data", "fsdp", "expert"), 4, 2, True)
    assert dict(run.mesh) == {"data": 2, "fsdp": 2, "expert": 2}
    run = maxtext_run(
        "ici_expert_parallelism=2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2",
        "m",
        ("data", "fsdp", "expert"),
        4,
        2,
        True,
    )
    assert dict(run.mesh) == {"data": 1, "fsdp": 4, "expert": 2}
    # FSDP is the axis across the slices then: the case says so, and places fsdp's halves on the two slices.
    assert dict(run.settings)["dcn_axis"] == "fsdp"
    assert "dcn_axis" not in dict(
        maxtext_run("ici_expert_parallelism=2", "m", ("data", "fsdp", "expert"), 4, 2, True).settings
    )
    with pytest.raises(ShardscopeError, match="multiply to 4, but the topology has 2 slices"):
        maxtext_run("dcn_data_parallelism=4", "m", ("data", "fsdp"), 4, 2, False)
    # DCN sizes on several axes: each axis named with its share of the slices, in mesh order.
    run = maxtext_run("dcn_fsdp_parallelism=2 dcn_data_parallelism=2", "m", ("data", "fsdp"), 4, 4, False)
    assert dict(run.mesh) == {"data": 2, "fsdp": 8} and dict(run.settings)["dcn_axis"] == "data:2,fsdp:2"


def test_pipeline_keys_size_the_stage_axis_and_default_the_microbatches():
    run = maxtext_run("ici_pipeline_parallelism=2", "m", ("data", "stage", "fsdp"), 8, 1, False)
    assert dict(run.mesh) == {"data": 1, "stage": 2, "fsdp": 4}
    assert dict(run.settings)["pipeline.microbatches"] == "2"  # MaxText: -1 means one per stage
    run = maxtext_run(
        "ici_pipeline_parallelism=2 num_pipeline_microbatches=8", "m", ("data", "stage", "fsdp"), 8, 1, False
    )
    assert dict(run.settings)["pipeline.microbatches"] == "8"


@pytest.mark.parametrize(
    ("keys", "repeats"),
    [
        ("", "16"),  # MaxText's defaults: one layer a visit, so 32 layers / 2 stages = 16 visits (circular)
        ("num_layers_per_pipeline_stage=4", "4"),
        ("num_layers_per_pipeline_stage=16", "1"),  # a stage's layers in one visit (GPipe)
        ("num_pipeline_repeats=2", "2"),
    ],
)
def test_pipeline_repeats_are_maxtexts(keys, repeats):
    run = maxtext_run(f"ici_pipeline_parallelism=2 {keys}", "llama2-7b", ("data", "stage", "fsdp"), 8, 1, False)
    assert dict(run.settings)["pipeline.repeats"] == repeats
    assert ("pipeline.repeats" in run.defaulted) == (keys == "")


def test_keys_that_change_the_step_but_are_not_modelled_are_named():
    run = maxtext_run("use_custom_sort_vjp=false steps=3 attention=dot_product", "mixtral-tiny", ("fsdp",), 8, 1, True)
    (line,) = [w for w in run.warnings if "not modelled, planned without them" in w]
    assert "use_custom_sort_vjp=false" in line and "steps" not in line
    assert dict(run.settings)["model.attention_kernel"] == "dot_product"
    # MaxText's own defaults that the plan departs from are said too.
    run = maxtext_run("", "mixtral-tiny", ("fsdp",), 8, 1, True)
    assert any("sparse_matmul" in w for w in run.warnings)
    # Dropless: every routed token computed once, the expert FLOPs of capacity factor 1.
    assert dict(run.settings)["model.capacity_factor"] == "1"
    given = maxtext_run("capacity_factor=1.25", "mixtral-tiny", ("fsdp",), 8, 1, True)
    assert dict(given.settings)["model.capacity_factor"] == "1.25"
    assert not any("sparse_matmul" in w for w in given.warnings)
    # sparse_matmul (base.yml: true) runs the experts as the grouped-matmul kernel, with or without dropping;
    # sparse_matmul=false as einsums over the capacity slots.
    assert dict(run.settings)["model.expert_matmul"] == "grouped"
    assert dict(given.settings)["model.expert_matmul"] == "grouped"
    dense = maxtext_run(
        "sparse_matmul=false megablox=false capacity_factor=1.25", "mixtral-tiny", ("fsdp",), 8, 1, True
    )
    assert "model.expert_matmul" not in dict(dense.settings)
    assert not any("not modelled" in w for w in dense.warnings)
    assert dict(run.settings)["model.attention_kernel"] == "autoselected"  # base.yml's default, modelled
    assert not any("sparse_matmul" in w for w in maxtext_run("", "m", ("fsdp",), 8, 1, False).warnings)


def test_remat_policies_are_maxtexts_and_none_runs_as_full():
    settings = dict(maxtext_run("remat_policy=minimal_offloaded", "m", ("fsdp",), 8, 1, False).settings)
    assert settings["model.remat"] == "minimal_offloaded"
    # MaxText's `none` builds no policy, and nn.remat without one saves nothing but the layer's input: full.
    assert dict(maxtext_run("remat_policy=none", "m", ("fsdp",), 8, 1, False).settings)["model.remat"] == "full"
    run = maxtext_run("remat_policy=custom query_proj=offload mlpwo=device", "m", ("fsdp",), 8, 1, False)
    # base.yml's defaults for the other per-tensor keys: decoder_layer_input on the device, the rest remat.
    assert dict(run.settings)["model.remat_custom"] == "decoder_layer_input:device,mlpwo:device,query_proj:offload"
    run = maxtext_run("remat_policy=custom decoder_layer_input=offload", "m", ("fsdp",), 8, 1, False)
    assert dict(run.settings)["model.remat_custom"] == "decoder_layer_input:offload"
    assert not run.warnings


def test_the_library_takes_a_command_line_and_warns():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plan = shardscope.plan_case(
            "mixtral-tiny", maxtext=f"{TINY} use_custom_sort_vjp=false attention=dot_product", tensors_only=True
        )
    assert any("use_custom_sort_vjp=false" in str(w.message) for w in seen)
    assert dict(plan.case.mesh)["fsdp"] == 8 and plan.case.preset == "default"


@pytest.mark.slow
def test_cli_prints_warnings_on_stderr_and_plans(tmp_path):
    out = tmp_path / "plan.json"
    command = [
        "dump",
        "mixtral-tiny",
        "--tensors-only",
        "--maxtext",
        f"{TINY} use_custom_sort_vjp=false",
        "-o",
        str(out),
    ]
    result = subprocess.run([sys.executable, "-m", "shardscope.cli", *command], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert any("use_custom_sort_vjp=false" in line for line in warnings)
    assert yaml.safe_load(out.read_text())["case"]["overrides"]["model.seq_len"] == "32"


SEED_003 = "compile_topology=v5p-8 ici_pipeline_parallelism=2 num_pipeline_microbatches=8"


@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_seed_003_plans_from_its_command_line(mode):
    # MaxText PR 2744's Llama2-7B runs on v5p-8: two pipeline stages of 16 layers, 8 microbatches of 6 sequences.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = shardscope.plan_case("llama2-7b", maxtext=f"{SEED_003} shard_mode={mode}", tensors_only=True)
    assert dict(plan.case.mesh)["stage"] == 2 and dict(plan.case.mesh)["fsdp"] == 2
    assert plan.case.axis_types == mode
    assert dict(plan.case.overrides)["pipeline.microbatches"] == "8"
    assert dict(plan.case.overrides)["pipeline.repeats"] == "16"  # circular: one layer per visit, as MaxText runs it
    # MaxText's pipeline layout: [16 repeats, 2 stages, …], the stages dimension on `stage`, as MaxText's dump.
    query = dict(plan.tensors)["params/decoder/pipeline_module/layers/self_attention/query/kernel"]
    assert query.shape[:2] == (16, 2) and query.logical[:2] == ("circular_repeats", "layers")
    assert query.spec[0] is None and "stage" in str(query.spec[1])


def test_pipeline_fsdp_ag_once_is_the_pipelines_gather_once_setting():
    # Modelled, not warned: the pipeline gathers the stack's weights over fsdp once, before its schedule.
    words = "ici_pipeline_parallelism=2 num_pipeline_microbatches=4 num_pipeline_repeats=2 per_device_batch_size=4"
    case, run = resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{words} pipeline_fsdp_ag_once=true")
    assert case.preset.pipeline is not None and case.preset.pipeline.fsdp_gather_once
    assert not any("pipeline_fsdp_ag_once" in line for line in run.warnings)
    case, run = resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{words} pipeline_fsdp_ag_once=false")
    assert case.preset.pipeline is not None and not case.preset.pipeline.fsdp_gather_once
    assert not run.warnings


def test_set_may_change_what_maxtexts_defaults_chose_but_not_what_the_command_line_said():
    # remat_policy not given: base.yml's `full` applies, and --set chooses otherwise without contradiction.
    case, run = resolve_maxtext_case("mixtral-tiny", None, None, TINY, {"model.remat": "minimal"})
    assert case.model.remat == "minimal" and "model.remat" in run.defaulted
    with pytest.raises(ShardscopeError, match="contradicts --maxtext"):
        resolve_maxtext_case("mixtral-tiny", None, None, f"{TINY} remat_policy=full", {"model.remat": "minimal"})


def test_weight_dtype_sets_the_parameters_and_the_optimizer_state_that_follows_them():
    def plan(weights: str) -> shardscope.Plan:
        return shardscope.plan_case("llama-tiny", maxtext=f"{TINY} weight_dtype={weights}", tensors_only=True)

    full, half = plan("float32"), plan("bfloat16")
    checked = {"param": 0, "opt_state": 0}
    for path, record in half.tensors:
        if record.kind in checked and record.dtype != "int32":  # adam's step count stays an integer
            reference = full.tensor_map[path]
            assert (record.dtype, record.bytes_per_device) == ("bfloat16", reference.bytes_per_device // 2), path
            checked[record.kind] += 1
    assert checked["param"] > 5 and checked["opt_state"] == 2 * checked["param"], checked


def test_a_renamed_key_is_read_under_maxtexts_current_name():
    # The Ironwood recipes' `fsdp_shard_on_exp` (maxtext-tutorial-v1.5.0) is today's `shard_exp_on_fsdp`.
    words = f"{TINY} ici_fsdp_parallelism=-1"
    for key in ("fsdp_shard_on_exp", "shard_exp_on_fsdp"):
        case, run = resolve_maxtext_case("deepseek-tiny", None, "cpu-8", f"{words} {key}=true")
        assert case.model.shard_experts_on_fsdp, key
        assert not any("not modelled" in line for line in run.warnings), run.warnings
    case, _ = resolve_maxtext_case("deepseek-tiny", None, "cpu-8", words)
    assert not case.model.shard_experts_on_fsdp
    with pytest.raises(ShardscopeError, match="earlier name of shard_exp_on_fsdp"):
        resolve_maxtext_case("deepseek-tiny", None, "cpu-8", f"{words} fsdp_shard_on_exp=true shard_exp_on_fsdp=true")


def test_2d_fsdp_expert_weights_are_modelled_without_tensor_parallelism_only():
    words = f"{TINY} ici_fsdp_parallelism=-1 ici_fsdp_transpose_parallelism=2 use_2d_fsdp_sharding=true"
    case, run = resolve_maxtext_case("deepseek-tiny", None, "cpu-8", words)
    assert case.model.experts_2d_fsdp and not case.model.shard_experts_on_fsdp
    assert not any("not modelled" in line for line in run.warnings), run.warnings
    with pytest.raises(ShardscopeError, match=r"use_2d_fsdp_sharding\) with mlp_no_fsdp on tensor=2 is not modelled"):
        resolve_maxtext_case("deepseek-tiny", None, "cpu-8", f"{words} ici_tensor_parallelism=2")
    # MaxText's MoE takes shard_exp_on_fsdp first when both are set: that layout is modelled at any mesh.
    both, _ = resolve_maxtext_case(
        "deepseek-tiny", None, "cpu-8", f"{words} ici_tensor_parallelism=2 shard_exp_on_fsdp=true"
    )
    assert both.model.shard_experts_on_fsdp


def test_a_pipeline_puts_the_stage_axis_first_as_maxtexts_config_does():
    # MaxText's config, when the stage axis is in use: stage before data in the mesh and in data_sharding,
    # and the embedding/logits batch over (stage, data, fsdp, fsdp_transpose, expert).
    words = "ici_data_parallelism=2 num_pipeline_microbatches=4 num_pipeline_repeats=2 per_device_batch_size=4"
    piped, _ = resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{words} ici_pipeline_parallelism=2")
    plain, _ = resolve_maxtext_case("llama-tiny", None, "cpu-8", words)
    for case, stage_first in ((piped, True), (plain, False)):
        axes = [axis for axis, _ in case.mesh]
        assert list(case.preset.mesh_axes) == axes
        assert (axes.index("stage") < axes.index("data")) == stage_first
        batch = dict(case.preset.logical_axis_rules)["activation_embed_and_logits_batch"]
        assert (batch[0] == "stage") == stage_first, batch
        assert (case.preset.data_sharding[0][0] == "stage") == stage_first
    assert dict(piped.mesh) == {**dict(plain.mesh), "stage": 2, "fsdp": 2}


@pytest.mark.slow
def test_iota_embed_looks_tokens_up_with_a_one_hot_matmul_and_its_backward_matmul():
    # MaxText's use_iota_embed: [tokens × vocab] one-hot rows @ table forward, and the table's gradient as the
    # transposed matmul backward: 2 × 2·T·V·E more FLOPs per device than the gather (plus the one-hot rows).
    from reference_models import MODELS

    words = f"{TINY} ici_fsdp_parallelism=-1"
    flops = {}
    for iota in ("false", "true"):
        case, run = resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{words} use_iota_embed={iota}")
        assert case.model.iota_embed == (iota == "true")
        assert not any("use_iota_embed" in line for line in run.warnings), run.warnings
        flops[iota] = dict(plan_case(case).compute)["flops"]
    model = MODELS["llama-tiny"]
    tokens_per_device = 32  # one sequence of 32 per device
    matmuls = 4 * tokens_per_device * model.vocab_size * model.embed_dim
    assert matmuls <= flops["true"] - flops["false"] < 1.1 * matmuls, (flops, matmuls)


@pytest.mark.slow
@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_the_embedding_tables_gradient_is_summed_in_the_activation_dtype(tmp_path):
    # MaxText casts the table to the activation dtype before the lookup, so its gradient is scattered and summed
    # over the batch's devices in bfloat16 (half the bytes of the float32 gradient it would be after the lookup).
    import json

    out = tmp_path / "plan.json"
    words = f"{TINY} ici_data_parallelism=-1 ici_fsdp_parallelism=1"
    command = [sys.executable, "-m", "shardscope.cli", "dump", "llama-tiny", "--topology", "v5p-8", "--no-cache"]
    subprocess.run([*command, "--maxtext", words, "-o", str(out)], capture_output=True, text=True, check=True)
    rows = json.loads(out.read_text())["collectives"]
    table = "grads/params/token_embedder/embedding"
    summed = [row for row in rows if table in row["cause"]["tensors"]]
    assert summed and all(row["dtype"] == "bfloat16" for row in summed), summed


@pytest.mark.slow
def test_vocab_tiling_recomputes_each_chunks_logits_in_the_backward_pass():
    # MaxText's num_vocab_tiling: the head's forward matmul runs once more per step (each chunk's logits are
    # recomputed to be differentiated): 2·T·E·V more FLOPs per device than the untiled loss.
    from reference_models import MODELS

    words = f"{TINY} ici_fsdp_parallelism=-1"
    flops = {}
    for tiles in (1, 4):
        case, run = resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{words} num_vocab_tiling={tiles}")
        assert case.model.vocab_tiles == tiles
        assert not any("num_vocab_tiling" in line for line in run.warnings), run.warnings
        flops[tiles] = sum(entry.flops for entry in plan_case(case).work)  # matrix FLOPs
    model = MODELS["llama-tiny"]
    head = 2 * 32 * model.embed_dim * model.vocab_size  # one sequence of 32 per device
    assert flops[4] - flops[1] == head, (flops, head)


def test_vocab_tiles_that_do_not_divide_the_batchs_tokens_are_refused():
    with pytest.raises(ShardscopeError, match=r"model.vocab_tiles=3 .*does not divide the batch's 256 tokens"):
        resolve_maxtext_case("llama-tiny", None, "cpu-8", f"{TINY} ici_fsdp_parallelism=-1 num_vocab_tiling=3")


@pytest.mark.slow
@pytest.mark.skipif(libtpu_version() is None, reason="needs the TPU extra (libtpu)")
def test_the_tiled_losss_head_gradient_stays_split_over_fsdp(tmp_path):
    # The head is gathered over fsdp for the tiled loss; its gradient is summed over the devices per chunk and
    # added into an accumulator split as the parameter is stored (as the TPU compiler arranges MaxText's
    # program). Nothing gathers the float32 gradient back to the head's whole shape.
    import json

    from reference_models import MODELS

    model = MODELS["llama-tiny"]
    out = tmp_path / "plan.json"
    words = "ici_fsdp_parallelism=-1 max_target_length=256 per_device_batch_size=2 num_vocab_tiling=4"
    command = [sys.executable, "-m", "shardscope.cli", "dump", "llama-tiny", "--topology", "v5p-8", "--no-cache"]
    subprocess.run([*command, "--maxtext", words, "-o", str(out)], capture_output=True, text=True, check=True)
    rows = json.loads(out.read_text())["collectives"]
    head = [model.embed_dim, model.vocab_size]
    gathered = [row for row in rows if row["op"] == "all-gather" and row["shape"][-2:] == head]
    assert gathered and all(row["dtype"] == "bfloat16" for row in gathered), gathered  # the weights, for the matmuls
    summed = [row for row in rows if row["op"] in ("all-reduce", "reduce-scatter") and row["shape"][-2:] == head]
    assert summed and all(row["loop_trips"] == 4 for row in summed), summed  # once per chunk
