"""shardscope.predict against the compiled goldens, its plan's JSON round-trip, and `dump --predicted`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardscope.golden.cases import load_manifest
from shardscope.golden.store import golden_path, load_golden
from shardscope.plan.json import plan_from_json, plan_to_json
from shardscope.predict import PREDICTED, predicted_plan
from shardscope.predict.measure import AxesError, axes_errors, gather_matches, tensors_only

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"


def _goldens():
    for case in load_manifest(GOLDEN):
        path = golden_path(GOLDEN, case)
        if path.exists():
            plan = load_golden(path)
            if plan.collectives:
                yield path.relative_to(GOLDEN).as_posix(), plan


CASES = tuple(_goldens())


# The MoE models' explicit pipelines, whose compiled collectives the prediction does not yet follow: the
# stages run as a vmap, as MaxText's do, and JAX 0.10 batches the MoE's shard_map inside it with the stage
# dimension replicated, so each stage gathers every stage's tokens and expert weights for it (9.6 and 13.7
# MiB a step over `stage` on the tiny models, predicted 0.3 and 0.2); the prediction still has the weights
# gathered whole at the edge of a shard_map over the stages, as the pipeline ran before (+38% to +90% over
# fsdp and fsdp+expert, -17% and -34% over expert).
UNFOLLOWED_PIPELINES = ("deepseek-tiny/cpu-8/explicit-pipeline.json", "mixtral-tiny/cpu-8/explicit-pipeline.json")


def test_forward_weight_gathers_match_compiled_rows():
    # Measured: every predicted forward weight all-gather matches a compiled one (op, axes, shape up to unit
    # dims, loop trips, cause naming the weight), but in the pipelines above (27 of 33 and 11 of 17 there).
    matched = total = 0
    for name, golden in CASES:
        found, count = gather_matches(golden, predicted_plan(tensors_only(golden)))
        assert count, name
        if name in UNFOLLOWED_PIPELINES:
            assert found < count, f"{name}: every gather matched; take it out of UNFOLLOWED_PIPELINES"
            continue
        matched += found
        total += count
    assert matched == total and total >= 300


def test_default_case_traffic_per_axis_within_two_percent():
    # deepseek-tiny default: weights gathered over fsdp+expert, experts over fsdp, tokens over expert.
    golden = dict(CASES)["deepseek-tiny/cpu-8/default.json"]
    errors = axes_errors(golden, predicted_plan(tensors_only(golden)))
    assert {e.axes for e in errors} == {("expert",), ("fsdp",), ("fsdp", "expert")}
    for entry in errors:
        assert entry.error is not None and abs(entry.error) < 0.02, entry


def test_traffic_per_axis_within_twenty_percent_on_the_golden_matrix():
    # Every case and mesh-axis set the compiled goldens move data over, the token lookup's ways included
    # (a pipeline's stages and ep-as-dp's expert axis splitting the ids but not the table; cp-as-ep's ids
    # tiled in another device order than the table).
    misses = set()
    pairs = 0
    for name, golden in CASES:
        for entry in axes_errors(golden, predicted_plan(tensors_only(golden))):
            if entry.compiled:
                pairs += 1
                if entry.error is None or abs(entry.error) > 0.20:
                    misses.add((name, entry.axes))
    assert pairs >= 60
    # The pipelines the prediction does not yet follow miss on their stage axis (and others); nothing else.
    assert {name for name, _ in misses} == set(UNFOLLOWED_PIPELINES)
    assert all((name, ("stage",)) in misses for name in UNFOLLOWED_PIPELINES)


def test_predicted_plan_round_trips_and_says_it_is_predicted():
    golden = dict(CASES)["mixtral-tiny/cpu-8/default.json"]
    plan = predicted_plan(tensors_only(golden))
    assert dict(plan.provenance)[PREDICTED] is True
    assert plan.parts == ("tensors", "collectives")
    assert plan_from_json(plan_to_json(plan)) == plan
    assert all(row.cause is not None and row.cause.tensors for row in plan.collectives)


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "shardscope.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_dump_predicted_writes_a_predicted_plan_and_diffs_against_the_golden(tmp_path):
    out = tmp_path / "predicted.json"
    result = _cli("dump", "deepseek-tiny", "--predicted", "-o", str(out), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = plan_from_json(out.read_text())
    assert dict(plan.provenance)[PREDICTED] is True and plan.collectives
    summary = _cli("dump", "deepseek-tiny", "--predicted", "--hardware", "v5p", tmp_path=tmp_path)
    assert "collectives and work predicted from the placement, not compiled" in summary.stdout
    assert "estimate from a prediction (no compile)" in summary.stdout.replace("\n", " ")
    diff = _cli("diff", str(GOLDEN / "deepseek-tiny/cpu-8/default.json"), str(out), tmp_path=tmp_path)
    assert diff.returncode in (0, 1), diff.stderr


def test_dump_predicted_with_tensors_only_is_a_one_line_error(tmp_path):
    result = _cli("dump", "deepseek-tiny", "--predicted", "--tensors-only", tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--predicted" in result.stderr


def test_seed_003_tpu_compiles_traffic_per_axis_within_ten_percent():
    # Seed 003's four TPU compiles (v5p-8; pipeline_fsdp_ag_once; FSDP or ZeRO-1; Auto or Explicit): the
    # weights gathered once (over fsdp before the schedule, over data after ZeRO-1's update), their gradients
    # summed once for every visit after the schedule (Auto) or at every iteration as stored (Explicit, in
    # float32, as MaxText's own compiles do), and the embedding table's gradient summed over the stages and
    # the batch axis. Measured: all within 1%, but on the batch axis of the Auto compiles, which also
    # gather the logits and sum a logits-sized buffer over it around the output head (6.3 GB a step that
    # MaxText's own Auto programs do not move): -31% and -30%, held within their own bound so that closing
    # the gap shows.
    known_gaps = {("fsdp-pp-auto", ("fsdp",)): 0.35, ("zero1-pp-auto", ("data",)): 0.35}
    plans = ROOT / "benchmarks" / "plans"
    for name in ("fsdp-pp-auto", "fsdp-pp-explicit", "zero1-pp-auto", "zero1-pp-explicit"):
        compiled = plan_from_json((plans / f"seed003-{name}.tpu.json").read_text())
        errors = axes_errors(compiled, predicted_plan(tensors_only(compiled)))
        assert len([e for e in errors if e.compiled]) >= 3, name
        for entry in errors:
            bound = known_gaps.get((name, entry.axes), 0.10)
            assert entry.compiled > 0 and entry.error is not None and abs(entry.error) < bound, (name, entry)


def test_real_size_tpu_compiles_traffic_per_axis_within_ten_percent():
    # Default-preset TPU compiles of real-size MoE models (tests/data/compiled, written by
    # `shardscope dump MODEL --topology T -o FILE` with libtpu) and every TPU-route plan of MaxText's
    # published runs (benchmarks/plans). Mixtral-8x7B on v5p-128 regathers each attention projection twice
    # in the backward pass (for the recomputed matmul and for its input gradient): predicted once, its
    # fsdp+expert traffic was 22.6% short. Measured: every axis within 5%.
    # An axis set carrying under 0.1% of a program's traffic is left out: DeepSeek-V3's TPU7x-512 program
    # reduce-scatters three small attention gradients ([7168, 256|576|1536]) over fsdp x fsdp_transpose as a
    # fused reduce-scatter followed by a ring of collective-permutes over fsdp alone; the reduce-scatter alone
    # already carries the predicted bytes (within 0.05%), and the ring's 147 MB is 0.004% of the step's 4 TB.
    # Known gaps, each held within its own bound here (and named, so that closing one shows). Under memory
    # pressure a TPU program gathers a recomputed weight again for its gradient's matmul, where the
    # prediction has it gathered once in the backward pass for both (it counts twice only the attention
    # projections every TPU compile regathers): Llama 3.1 405B on v5p-1024 (backward all-gathers 1.63x the
    # forward's, predicted 1.17x: -13.1% over fsdp), Llama 2 70B on v6e-256 under full remat at a peak of
    # 32.7 GB of the chip's 33.5 (1.92x: -19.2% over fsdp_transpose), Llama 3.1 405B on two v6e-256 slices
    # (-22.6% and -25.7% over fsdp). Llama 3.1 70B with the same policy on v6e-128 gathers its MLP once
    # (0.97x), so the count follows the compiler's memory budget, which a prediction does not have. Llama
    # 3.1 70B at 128k tokens gathers its output head over `context` in every chunk of the tiled loss, both
    # passes (16.8 GB, not predicted: -11.5%).
    known_gaps = {
        ("llama3.1-405b_v5p-1024_tr.tpu.json", ("fsdp",)): 0.15,
        ("llama3.1-70b_tpu7x-512_128k_iw.tpu.json", ("context",)): 0.15,
        ("llama2-70b_v6e-256_2024-10.tpu.json", ("fsdp_transpose",)): 0.25,
        ("llama3.1-405b_2xv6e-256_tr010.tpu.json", ("fsdp",)): 0.30,
        ("llama3.1-405b_2xv6e-256_2024-10.tpu.json", ("fsdp",)): 0.30,
        ("llama3.1-405b_2xv6e-256_tiering.tpu.json", ("fsdp",)): 0.30,
        # Seed 003's Auto compiles (see test_seed_003_tpu_compiles_traffic_per_axis_within_ten_percent).
        ("seed003-fsdp-pp-auto.tpu.json", ("fsdp",)): 0.35,
        ("seed003-zero1-pp-auto.tpu.json", ("data",)): 0.35,
        # MaxText's own programs (`maxtext:`) are predicted without their case where MaxText is not installed
        # (it needs Python 3.12): without the routing, every expert is given every token a device holds, and
        # Llama 4 Maverick's experts, split over `tensor`, sum that many slots (predicted 18.9x the compile).
        ("llama4-17b-128e_v5p-256_tr.tpu.json", ("tensor",)): 20.0,
        # Llama 3.1 70B in fp8 at 128k tokens on tpu7x-512 (fsdp=64 x context=8): the prediction gathers 257.7 GB
        # over `context` in the backward pass, the compiled program 43.0 GB (as much as its forward pass, as the
        # bf16 run of the same shape gathers 51.4 GB each way, predicted within 15%); +167% over context alone.
        # Not yet explained.
        ("llama3.1-70b_tpu7x-512_128k_fp8_full_iw.tpu.json", ("context",)): 1.8,
    }
    # Axis sets a compiler reduces over in one collective where the prediction reduces over each apart, compared
    # as their union: gpt-oss-120b's program (MaxText 0.2.5 on tpu7x-128, data=2 x fsdp=64) sums its gradients
    # over data x fsdp in one all-reduce (233.7 GB), where the prediction sums them over fsdp (232.4 GB) and
    # then over data (3.6 GB): over the union of the three sets, within 0.4%.
    merged = {"gpt-oss-120b_tpu7x-128_8k_iw.tpu.json": (("data",), ("fsdp",), ("data", "fsdp"))}
    # Held apart (`test_deepseek_v3_fp8_on_fsdp_and_fsdp_transpose_is_not_yet_predicted` names the gap).
    unpredicted = {DEEPSEEK_FP8_512}
    compiled_dir = Path(__file__).resolve().parent / "data" / "compiled"
    paths = [*sorted(compiled_dir.glob("*.tpu.json")), *sorted((ROOT / "benchmarks" / "plans").glob("*.tpu.json"))]
    assert len(paths) >= 15
    for path in paths:
        if path.name in unpredicted:
            continue
        compiled = plan_from_json(path.read_text())
        errors = axes_errors(compiled, predicted_plan(tensors_only(compiled)))
        if path.name in merged:
            union = [e for e in errors if e.axes in merged[path.name]]
            whole = AxesError(
                tuple(sorted({a for e in union for a in e.axes})),
                sum(e.compiled for e in union),
                sum(e.predicted for e in union),
            )
            errors = (*(e for e in errors if e.axes not in merged[path.name]), whole)
        total = sum(entry.compiled for entry in errors)
        # Quantized training (MaxText's fp8_full) gathers its weights already in float8, half the bytes of
        # the bfloat16 gathers the prediction counts (Llama 3.1 70B on tpu7x-128: +56% over fsdp); the
        # prediction has no quantization yet.
        quantized = any(row.dtype.startswith("float8") for row in compiled.collectives)
        for entry in errors:
            if entry.compiled < 1e-3 * total and entry.predicted < 1e-3 * total:
                continue
            bound = known_gaps.get((path.name, entry.axes), 0.60 if quantized else 0.10)
            assert entry.compiled > 0 and entry.error is not None and abs(entry.error) < bound, (path.name, entry)


DEEPSEEK_FP8_512 = "deepseek3-671b_tpu7x-512_4k_fp8_full_iw.tpu.json"


@pytest.mark.xfail(strict=True, reason="the prediction does not yet gather quantized experts over two fsdp axes")
def test_deepseek_v3_fp8_on_fsdp_and_fsdp_transpose_is_not_yet_predicted():
    """DeepSeek-V3 in fp8 (qwix fp8_full) on tpu7x-512, fsdp=256 x fsdp_transpose=2: the compiled program gathers
    its float8 experts over fsdp_transpose (654 GB forward) and over fsdp (327 GB forward) apart, and
    reduce-scatters their gradients the same way, 4.0 TB in all; the prediction gathers no expert and comes to
    133 GB. The bf16 run of the same shape gathers its experts over both axes at once, and the prediction has it
    within 0.1%. Strict: this fails (and says so) once the prediction covers it."""
    compiled = plan_from_json((ROOT / "benchmarks" / "plans" / DEEPSEEK_FP8_512).read_text())
    errors = axes_errors(compiled, predicted_plan(tensors_only(compiled)))
    total = sum(entry.compiled for entry in errors)
    assert all(
        entry.compiled > 0 and entry.error is not None and abs(entry.error) < 0.60
        for entry in errors
        if entry.compiled >= 1e-3 * total or entry.predicted >= 1e-3 * total
    )


def test_a_tpu_program_regathers_recomputed_attention_projections_twice():
    # The same placement predicted for a TPU program and for a CPU one: only the TPU's backward pass gathers a
    # stacked attention projection twice; the experts' weights (gathered where the MoE block constrains
    # them) once on both.
    path = Path(__file__).resolve().parent / "data" / "compiled" / "mixtral-8x7b_v5p-128_default.tpu.json"
    tpu = predicted_plan(tensors_only(plan_from_json(path.read_text())))
    cpu_plan = plan_from_json(path.read_text())
    cpu_plan = dataclasses.replace(
        cpu_plan, provenance=(*((k, v) for k, v in cpu_plan.provenance if k != "backend"), ("backend", "cpu"))
    )
    cpu = predicted_plan(tensors_only(cpu_plan))

    def backward_gathers(plan, leaf):
        rows = [r for r in plan.collectives if r.op == "all-gather" and r.pass_ == "backward" and r.cause]
        return sum(r.count for r in rows if r.cause.tensors[0].endswith(leaf))

    assert backward_gathers(tpu, "self_attention/query/kernel") == 2
    assert backward_gathers(cpu, "self_attention/query/kernel") == 1
    assert backward_gathers(tpu, "MoeBlock_0/wi_0") == backward_gathers(cpu, "MoeBlock_0/wi_0") == 1


def test_maxtexts_own_program_is_predicted_as_the_reference_model_under_the_same_case():
    """MaxText records its activations apart from its weights (`activations/moe/…`, `activations/attention_mla/…`:
    modules named after its layers' classes, one for every layer of a class). Paired with their blocks by
    what they record, MaxText's program of DeepSeek2-16B and Llama 3.1 8B, given the reference model's case
    (the same configuration: MaxText's model file), predict as the reference model's programs of the same
    command line do: the same attention blocks, expert layouts and traffic, and the step within 5%."""
    from shardscope.cost.price import price_plan
    from shardscope.predict.layout import placement_of, resolved
    from shardscope.predict.roles import expert_layout, paired_module, unplaced_modules

    plans = ROOT / "benchmarks" / "plans"
    for stem, generation in (("deepseek2-16b_v5p-8_doc", "v5p"), ("llama3.1-8b_v6e-8_tr014", "v6e")):
        maxtext = tensors_only(plan_from_json((plans / f"{stem}.maxtext.json").read_text()))
        reference = tensors_only(plan_from_json((plans / f"{stem}.tpu.json").read_text()))
        case = resolved(reference)
        assert case is not None and resolved(maxtext) is None  # MaxText is not what resolves it here
        assert unplaced_modules(maxtext) and not unplaced_modules(reference)
        found, expected = placement_of(maxtext, case), placement_of(reference, case)
        assert len(found.attention) == len(expected.attention) > 0
        assert all(paired_module(maxtext, block.module) for block in found.attention)
        assert all(block.inputs is not None for block in found.attention)
        for weight in (w for w in found.weights if w.is_expert):
            assert expert_layout(maxtext, weight.module, weight.record) is not None
        assert found.tokens == expected.tokens and found.dtype == expected.dtype
        predicted = price_plan(predicted_plan(maxtext, case=case), generation).estimate
        wanted = price_plan(predicted_plan(reference, case=case), generation).estimate
        assert predicted is not None and wanted is not None
        assert predicted.communication == pytest.approx(wanted.communication, rel=0.02)
        assert predicted.expected == pytest.approx(wanted.expected, rel=0.05)


def test_tensor_sequence_splits_the_weights_inside_the_layers_as_tensor_parallelism():
    """MaxText's `tensor_sequence` splits the residual stream's length and, inside the layers, their heads and
    MLP features (`layout.sequence_parallel_axes`): the layers run on the tokens gathered over it and keep
    their weights split on it, so an output projection's partial output is all-reduced over it, as the TPU
    compile does (it moves more: it also gathers the sequence over `context_usp_ulysses` first), and no
    weight split on it is gathered over it."""
    from shardscope.predict.layout import placement_of, sequence_parallel_axes

    stem = (
        "default__diloco1_data1_stage1_fsdp1_fsdp_transpose1_context1_context_usp_ulysses8_"
        "context_autoregressive1_tensor1_tensor_sequence8_expert1_autoregressive1.tpu.json"
    )
    compiled = plan_from_json((ROOT / "benchmarks" / "plans" / "advise" / stem).read_text())
    plan = tensors_only(compiled)
    found = placement_of(plan)
    assert sequence_parallel_axes(plan, found.batch_axes) == ("tensor_sequence",)
    assert found.layer_tokens == found.tokens * 8
    predicted = predicted_plan(plan)

    def sums(rows, source):
        return [r for r in rows if r.op == "all-reduce" and r.axes == ("tensor_sequence",) and r.source == source]

    for source in ("decoder/moe_layers/self_attention/out", "decoder/moe_layers/DeepSeekMoeBlock_0/shared_experts/wo"):
        forward = [r for r in sums(predicted.collectives, source) if r.pass_ == "forward"]
        assert [r.shape for r in forward] == [(found.layer_tokens, 2048)]
        assert sums(compiled.collectives, source)
    split = {w.path for w in found.weights if "tensor_sequence" in w.kept_axes}
    assert split and not any(
        "tensor_sequence" in r.axes and r.op == "all-gather" and set(r.cause.tensors) & split
        for r in predicted.collectives
        if r.cause is not None
    )
