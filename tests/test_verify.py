"""`shardscope verify MODEL`: every built-in preset's real train steps equal one device's, two presets equal each
other, a broken collective in a reference model is caught and placed on the plan, wrong inputs exit 2."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

from shardscope.case import resolve_case
from shardscope.case.presets import builtin_preset_names
from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.stages.state import unplaced_state
from shardscope.verify.cases import check_verifiable, verify_case
from shardscope.verify.records import (
    Divergence,
    Placement,
    StepLoss,
    TensorCheck,
    VerifyReport,
    report_to_json,
)

runner = CliRunner()
MODELS = ("deepseek-tiny", "mixtral-tiny", "llama-tiny")
STEPS = 2


def run(*args: str):
    return runner.invoke(app, list(args))


def expected_checks(case, steps: int) -> int:
    """Per step: the loss, and per parameter its gradient, its update and AdamW's two moments, and the
    optimizer's two step counts."""
    state, _ = unplaced_state(case)
    params = len(jax.tree.leaves(state["params"]))
    return steps * (1 + 4 * params + 2)


@pytest.mark.slow
@pytest.mark.parametrize("preset", builtin_preset_names())
@pytest.mark.parametrize("model", MODELS)
def test_every_builtin_preset_trains_as_one_device_does(model, preset):
    case = resolve_case(model, preset)
    try:
        report = verify_case(case, None, STEPS)
    except ShardscopeError:
        # Only what dump refuses too may be skipped.
        from shardscope.stages.compile import compile_case

        with pytest.raises(ShardscopeError):
            compile_case(case)
        pytest.skip(f"{preset} does not apply to {model}")
    assert report.same, [d.check for d in report.divergences[:3]]
    assert report.checked == expected_checks(case, STEPS)
    assert [loss.step for loss in report.losses] == [1, 2]
    for loss in report.losses:
        # A next-token loss over a vocabulary of V from random weights starts near log(V).
        assert abs(loss.loss - math.log(case.model.vocab_size)) < 1.0
        assert loss.loss == pytest.approx(loss.reference, rel=1e-5)
    assert report.closest is not None and report.closest.ratio < 1


@pytest.mark.slow
def test_two_presets_against_each_other_in_different_layouts():
    # A pipelined preset keeps the main stack's layers as [stages, …]: its numbers are compared with the
    # unpipelined preset's in its own layout.
    result = run("verify", "mixtral-tiny", "--preset", "explicit-pipeline", "--against", "ep-tp", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["same"] is True and report["steps"] == STEPS
    assert report["side"].startswith("explicit-pipeline on stage=2") and report["against"].startswith("ep-tp on ")
    case = resolve_case("mixtral-tiny", "explicit-pipeline")
    assert report["checked"] == expected_checks(case, STEPS)
    assert "pipeline_module" in report["closest"]["tensor"] or report["closest"]["tensor"] == "loss"
    text = run("verify", "deepseek-tiny", "--preset", "default", "--against", "ep-as-cp", "--steps", "1")
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("verify deepseek-tiny: default on ") and "against ep-as-cp on " in text.stdout
    assert "same: all " in text.stdout


def _reduce_scatter_without_the_sum(x, axis_name, scatter_dimension=0, tiled=False):
    """A ring of experts' reduce-scatter that forgets to sum: each device keeps its slice of its own partial
    outputs."""
    count = jax.lax.axis_size(axis_name)
    piece = x.shape[scatter_dimension] // count
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis_name) * piece, piece, axis=scatter_dimension)


def test_a_broken_reduce_scatter_in_the_reference_moe_is_caught_and_placed(monkeypatch):
    case = resolve_case("mixtral-tiny", "default", overrides={"moe": "ring"})
    monkeypatch.setattr(jax.lax, "psum_scatter", _reduce_scatter_without_the_sum)
    report = verify_case(case, None, 1)
    assert not report.same
    first = report.divergences[0].check
    assert (first.step, first.tensor, first.kind) == (1, "loss", "loss")
    by_tensor = {d.check.tensor: d for d in report.divergences}
    expert_grad = by_tensor["grads/params/decoder/layers/MoeBlock_0/wi_0"]
    sharded, single = expert_grad.placements
    assert single.side == "one device"
    # Its sharding on the preset side is the one the rules give the parameter.
    from shardscope.extract.tensors import normalize_spec
    from shardscope.plan.frames import spec_axes_text
    from shardscope.stages.compile import lower_case

    stored = lower_case(case).abstract.state_shardings["params"]["decoder"]["layers"]["MoeBlock_0"]["wi_0"]
    assert sharded.spec == spec_axes_text(normalize_spec(stored.spec, 4))
    # The collectives named are the plan's that move this gradient, with the MoE's own model line among them.
    assert sharded.collectives and all(note.line for note in sharded.collectives)
    assert any(note.line.startswith("reference_models/moe.py:") for note in sharded.collectives)
    assert set(expert_grad.lines) == {note.line for note in sharded.collectives}
    # Gradients come in backward order: the output head's before the layers'.
    grads = [d.check.tensor for d in report.divergences if d.check.kind == "gradient"]
    assert grads.index("grads/params/decoder/logits_dense/kernel") < grads.index(
        "grads/params/decoder/layers/MoeBlock_0/wi_0"
    )
    kinds = [d.check.kind for d in report.divergences]
    assert kinds == sorted(kinds, key=["loss", "gradient", "parameter", "first moment", "second moment"].index)


def assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("shardscope: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("deepseek-tiny", "--against", "one_device"), ("unknown --against 'one_device'", "did you mean 'one-device'")),
        (("deepseek-tiny", "--against", "ep-as-cpp"), ("did you mean 'ep-as-cp'",)),
        (("deepseek-tin",), ("unknown model 'deepseek-tin'", "did you mean 'deepseek-tiny'")),
        (("deepseek-tiny", "--steps", "0"), ("--steps 0",)),
        (("deepseek3-671b",), ("parameters", "tiny flavor")),
        (("deepseek-tiny", "--step", "x.py:make_step"), ("model name or --step",)),
        ((), ("model name or --step",)),
    ],
)
def test_wrong_inputs_exit_2_with_one_line(args, fragments):
    assert_user_error(run("verify", *args), *fragments)


def test_presets_that_train_on_different_batches_are_refused():
    eight = resolve_case("deepseek-tiny", "default", overrides={"model.global_batch": "8"})
    sixteen = resolve_case("deepseek-tiny", "ep-tp", overrides={"model.global_batch": "16"})
    with pytest.raises(ShardscopeError, match="different batches"):
        check_verifiable(eight, sixteen, 1)
    deeper = resolve_case("deepseek-tiny", "ep-tp", overrides={"model.seq_len": "64"})
    with pytest.raises(ShardscopeError, match="seq_len: 32 vs 64"):
        check_verifiable(eight, deeper, 1)


def test_the_json_report_is_plain_data():
    check = TensorCheck(1, "grads/params/w", "gradient", (2, 3), "float32", 0.5, float("inf"), 1e-6, 5e5)
    report = VerifyReport(
        subject="deepseek-tiny",
        side="default on fsdp=8",
        against="one device",
        topology="cpu-8",
        steps=1,
        checked=3,
        losses=(StepLoss(1, 5.5, 5.4),),
        closest=None,
        divergences=(Divergence(check, (Placement("default on fsdp=8", "(fsdp, -)"),), ("m.py:3",)),),
        rule="rule",
    )
    text = report_to_json(report)
    data = json.loads(text)
    assert text.endswith("\n") and report.exit_code == 1
    assert data["same"] is False and data["schema"] == "shardscope.verify/1"
    (divergence,) = data["divergences"]
    assert divergence["check"]["max_rel_error"] == "inf" and divergence["check"]["shape"] == [2, 3]
    assert divergence["placements"][0]["collectives"] == [] and divergence["lines"] == ["m.py:3"]


def test_help_states_the_tolerance_rule():
    result = run("verify", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for fragment in ("8 × eps × √K × max|reference|", "Exit 0 same, 1 diverged, 2 bad input", "--against"):
        assert fragment in text


def test_a_step_over_the_pipelined_layout_reads_back_as_the_stacked_one():
    # Both sides start from the same numbers whatever their layout: the starting point is stacked.
    from shardscope.verify.inputs import starting_point
    from shardscope.verify.layout import to_case_layout, to_stacked

    case = resolve_case("llama-tiny", "explicit-pipeline")
    start = starting_point(case.model, case.global_batch, 1)
    again = starting_point(case.model, case.global_batch, 1)
    laid = to_case_layout(case.model, start.params)
    assert "pipeline_module" in laid["decoder"]
    for a, b in zip(jax.tree.leaves(to_stacked(case.model, laid)), jax.tree.leaves(again.params), strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(start.batches[0]["targets"][:, :-1], start.batches[0]["tokens"][:, 1:])
