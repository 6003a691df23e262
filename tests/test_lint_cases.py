"""Lints on real cases of the reference models: a rule file or setting that triggers each, and one that does
not. (Names in the wrong place never occur in the reference models, which carry MaxText's names; those lints
are shown on hand-made plans in test_lint_checks.py, and the built-in presets show they stay quiet here.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardscope.case import resolve_case
from shardscope.case.hardware import load_hardware
from shardscope.errors import MemoryExhaustedError, ShardingError
from shardscope.golden.planning import lint_case

LINT_DATA = Path(__file__).parent / "data" / "lint"
MAXTEXT = Path(__file__).parent / "data" / "maxtext" / "custom_mesh_and_rule"
QUIET = {"lint.ignore": "dead-rule,unmatched-name,unit-axis-rule"}


def lint(model: str, preset: str, compile: bool = False, mesh=None, **settings):
    case = resolve_case(model, preset, mesh=mesh or {}, overrides={**QUIET, **settings})
    return lint_case(case, compile=compile)


def ids(report) -> set[str]:
    return {f.lint for f in report.findings}


def test_indivisible_dimensions_are_findings_where_planning_stops():
    with pytest.raises(ShardingError):
        from shardscope.golden.planning import plan_resolved_case

        plan_resolved_case(resolve_case("deepseek-tiny", "ep-as-cp", overrides={"model.global_batch": "6"}))
    report = lint("deepseek-tiny", "ep-as-cp", compile=True, **{"model.global_batch": "6"})
    assert ids(report) == {"indivisible-dim"}
    by_subject = {f.subject: f.message for f in report.findings}
    # The batch (6) over fsdp (4): the inputs, and every activation whose batch dimension the rules put there.
    assert "a dimension named activation_embed_and_logits_batch of size 6" in by_subject["inputs/tokens"]
    assert any("activation_batch of size 6 is sharded over fsdp = 4 shards" in m for m in by_subject.values())
    assert not report.compiled and any("only indivisible-dim ran" in note for note in report.notes)
    # A sequence of 33 over expert (2): the MoE's shard_map stops the trace too, after everything before it.
    odd = lint("mixtral-tiny", "ep-as-cp", **{"model.seq_len": "33"})
    assert "activation_norm_length of size 33" in next(f.message for f in odd.findings if f.subject == "inputs/tokens")
    assert "indivisible-dim" not in ids(lint("deepseek-tiny", "ep-as-cp"))


def test_large_replicated_weights_above_the_presets_threshold():
    report = lint("mixtral-tiny", str(LINT_DATA / "batch-only.yaml"))
    replicated = {f.subject for f in report.findings if f.lint == "large-replicated"}
    # Every weight of 32 KiB or more (the file's threshold) per device, each once with its Adam moments.
    assert "params/token_embedder/embedding" in replicated
    assert "params/decoder/layers/MoeBlock_0/wi_0" in replicated
    assert not any(path.startswith("opt_state/") for path in replicated)
    assert all("with its 2 optimizer-state copies" in f.message for f in report.findings)
    higher = lint("mixtral-tiny", str(LINT_DATA / "batch-only.yaml"), **{"lint.max_replicated_bytes": "16MiB"})
    assert "large-replicated" not in ids(higher)
    assert "large-replicated" not in ids(lint("mixtral-tiny", "pure-fsdp", **{"lint.max_replicated_bytes": "32KiB"}))


def test_silently_replicated_when_mlp_takes_fsdp_first():
    report = lint("deepseek-tiny", str(LINT_DATA / "mlp-takes-fsdp.yaml"))
    subjects = {f.subject for f in report.findings if f.lint == "silently-replicated"}
    assert subjects == {
        "params/decoder/dense_layers/mlp/wi_0/kernel",
        "params/decoder/dense_layers/mlp/wo/kernel",
        "params/decoder/moe_layers/DeepSeekMoeBlock_0/shared_experts/wi_0/kernel",
        "params/decoder/moe_layers/DeepSeekMoeBlock_0/shared_experts/wo/kernel",
    }
    # Mixtral has no dense MLP; MaxText's pure-fsdp.yml lists embed alone.
    assert "silently-replicated" not in ids(lint("mixtral-tiny", str(LINT_DATA / "mlp-takes-fsdp.yaml")))
    assert "silently-replicated" not in ids(lint("deepseek-tiny", str(MAXTEXT / "pure-fsdp.yml")))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["deepseek-tiny", "mixtral-tiny"])
def test_expert_weights_gathered_in_the_layer_loop(model):
    report = lint(model, str(LINT_DATA / "experts-gathered.yaml"), compile=True)
    gathers = [f for f in report.findings if f.lint == "expert-gather-in-loop"]
    assert {f.subject.split(" at ")[0].split(" float32")[0] for f in gathers} == {"all-gather over expert"}
    assert {"forward", "backward"} == {f.subject.split()[-3] for f in gathers}
    assert all("rule logical_axis_rules[0] [mlp_no_fsdp, ['expert']] takes 'expert'" in f.message for f in gathers)
    # Under MaxText's ep-as-cp.yml the experts stay on `expert` (gathered over fsdp only, by design).
    clean = lint_case(resolve_case(model, str(MAXTEXT / "ep-as-cp.yml"), mesh={"expert": 2}))
    assert clean.compiled and "expert-gather-in-loop" not in ids(clean)


def test_hbm_overflow_against_the_target_hardware():
    case = resolve_case("deepseek2-16b", "ep-as-cp")
    small = lint_case(case, compile=False, hardware=load_hardware("v5e"))
    (overflow,) = small.findings
    assert overflow.lint == "hbm-overflow" and overflow.subject == "HBM per device on v5e"
    assert "of 16.0 GiB" in overflow.message and "a lower bound" in overflow.message
    assert lint_case(case, compile=False, hardware=load_hardware("tpu7x")).findings == ()


def test_a_compiler_that_cannot_fit_the_step_is_an_hbm_finding(monkeypatch):
    import shardscope.golden.planning as api

    real = api.plan_resolved_case

    def refuse(case, tensors_only=False, use_cache=True):
        if not tensors_only:
            raise MemoryExhaustedError("deepseek-tiny on cpu-8: the compiler cannot fit the step in device memory (x)")
        return real(case, tensors_only, use_cache)

    monkeypatch.setattr(api, "plan_resolved_case", refuse)
    report = lint("deepseek-tiny", "ep-as-cp", compile=True)
    (finding,) = report.findings
    assert finding.lint == "hbm-overflow" and "cannot fit the step" in finding.message
    assert not report.compiled and report.notes


@pytest.mark.slow
def test_fsdp_across_slices_gathers_weights_over_dcn_in_the_layer_loop():
    # Two v5p-8 slices compiled with libtpu; `data` (4) spans them, so each slice's program still has a `data`
    # axis of 2 and shows the collectives over it (its traffic to the other slice travels as host transfers).
    fsdp_over_dcn = str(LINT_DATA / "fsdp-across-slices.yaml")
    across = resolve_case("deepseek-tiny", fsdp_over_dcn, "2xv5p-8", {"data": 4, "fsdp": 2}, QUIET)
    report = lint_case(across)
    names = {f.message.split("'")[1] for f in report.findings if f.lint == "dcn-weight-in-loop"}
    assert names == {"embed", "embed_moe", "q_lora", "kv_lora"}
    collectives = [f for f in report.findings if f.lint == "dcn-collective-in-loop"]
    assert collectives and all(" over data+fsdp " in f.subject for f in collectives)
    # One slice: `data` is then an ordinary axis of the slice.
    one = resolve_case("deepseek-tiny", fsdp_over_dcn, "v5p-16", overrides=QUIET)
    assert not {"dcn-weight-in-loop", "dcn-collective-in-loop"} & ids(lint_case(one, compile=False))
