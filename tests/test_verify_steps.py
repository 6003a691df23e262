"""`verify --step`: hand-written shard_map programs on 8 fake CPU devices, each wrong in a way sharded programs
go wrong (a sum over experts left out, a reduce-scatter over the wrong axis, a pipeline sending backwards, a
gradient all-reduce missing), caught against one device and named; their correct versions pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app

runner = CliRunner()
PROGRAMS = Path(__file__).parent / "data" / "verify"
EXAMPLES = Path(__file__).parent.parent / "examples"


def verify(reference: str, *options: str):
    return runner.invoke(app, ["verify", "--step", reference, *options])


# (program, its broken function, the tensor the step computes first among those that diverge, tensors that
# must still agree)
BUGS = [
    ("moe_psum.py", "make_step_without_psum", "outputs/loss", ()),
    ("ring_reduce_scatter.py", "make_step_scattering_over_fsdp", "outputs/loss", ()),
    ("pipeline_ppermute.py", "make_step_sending_backwards", "outputs/loss", ()),
    # The loss is averaged by hand and stays right: the gradients are where it goes wrong.
    ("grad_allreduce.py", "make_step_without_grad_allreduce", "outputs/grads/w1", ("outputs/loss",)),
]


@pytest.mark.parametrize(("program", "broken", "first", "agreeing"), BUGS, ids=[b[1] for b in BUGS])
def test_a_broken_program_is_caught_and_named(program, broken, first, agreeing):
    result = verify(f"{PROGRAMS / program}:{broken}", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["same"] is False and report["against"] == "one device" and report["steps"] == 1
    diverged = [d["check"]["tensor"] for d in report["divergences"]]
    assert diverged[0] == first
    assert not set(agreeing) & set(diverged)
    assert any(name.startswith("outputs/grads") for name in diverged)
    worst = report["divergences"][0]["check"]
    # Not a rounding difference: the error is of the size of the values themselves.
    assert worst["max_rel_error"] > 1e-3 and worst["ratio"] > 100
    sharded, single = report["divergences"][0]["placements"]
    assert sharded["side"].startswith("8 devices") and single["spec"] == "whole, on one device"
    text = verify(f"{PROGRAMS / program}:{broken}")
    assert text.exit_code == 1 and f"step 1  {first}" in text.stdout


@pytest.mark.parametrize("program", sorted({b[0] for b in BUGS}))
def test_the_correct_program_passes(program):
    result = verify(f"{PROGRAMS / program}:make_step", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["same"] is True and report["divergences"] == []
    assert report["checked"] >= 2 and report["closest"]["ratio"] < 1


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("shardscope: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_abstract_arguments_cannot_run():
    # The example returns jax.ShapeDtypeStructs, which dump plans but verify cannot run.
    result = verify(f"{EXAMPLES / 'mlp_step.py'}:make_step")
    assert_one_line_error(result, "must be arrays", "jax.ShapeDtypeStruct")


def test_arguments_that_differ_between_the_two_calls(tmp_path):
    program = tmp_path / "unseeded.py"
    program.write_text(
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh\n"
        "def make_step(devices):\n"
        "    mesh = Mesh(np.array(devices), ('data',))\n"
        "    x = jnp.full((8, 4), float(len(devices)))  # depends on the devices it is given\n"
        "    return jax.jit(lambda x: x.sum()), (x,), mesh\n"
    )
    assert_one_line_error(verify(f"{program}:make_step"), "differs between", "seed")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (("--preset", "ep-tp"), "--preset does not apply"),
        (("--steps", "3"), "--steps does not apply"),
        (("--against", "default"), "verifies against one device"),
    ],
)
def test_options_a_step_does_not_take(options, fragment):
    assert_one_line_error(verify(f"{PROGRAMS / 'moe_psum.py'}:make_step", *options), fragment)
