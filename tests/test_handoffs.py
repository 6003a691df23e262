"""Hand-offs between loop iterations: which collectives of a loop body nothing can hide."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from shardscope import load_plan
from shardscope.hlo.collectives import parse_collectives
from shardscope.hlo.handoffs import Handoffs
from shardscope.hlo.module import read_module

PROGRAMS = Path(__file__).resolve().parent.parent / "benchmarks" / "maxtext_programs"
# shardscope's own TPU-route plans of the same command lines.
PLANS = PROGRAMS.parent / "plans"

# A loop whose state is (counter, activations, weights, accumulator). `{send}` is the body's use of the
# stage hand-off; the other collectives are each of a kind that must not be one.
LOOP = """HloModule loop, num_partitions=4

cond {{
  p = (s32[], f32[8,8]{{1,0}}, f32[8,8]{{1,0}}, f32[8,8]{{1,0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  p = (s32[], f32[8,8]{{1,0}}, f32[8,8]{{1,0}}, f32[8,8]{{1,0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,8]{{1,0}} get-tuple-element(p), index=1
  w = f32[8,8]{{1,0}} get-tuple-element(p), index=2
  acc = f32[8,8]{{1,0}} get-tuple-element(p), index=3
  one = s32[] constant(1)
  next = s32[] add(i, one)
  gathered = f32[8,8]{{1,0}} all-gather(w), replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}
{send}
  grad = f32[8,8]{{1,0}} dot(y, gathered), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  reduced = f32[8,8]{{1,0}} all-reduce(grad), replica_groups={{{{0,1,2,3}}}}, to_apply=sum
  stored = f32[8,8]{{1,0}} add(acc, reduced)
  ROOT t = (s32[], f32[8,8]{{1,0}}, f32[8,8]{{1,0}}, f32[8,8]{{1,0}}) tuple(next, out, w, stored)
}}

sum {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  z = s32[] constant(0)
  x0 = f32[8,8]{{1,0}} parameter(0)
  w0 = f32[8,8]{{1,0}} parameter(1)
  a0 = f32[8,8]{{1,0}} parameter(2)
  init = (s32[], f32[8,8]{{1,0}}, f32[8,8]{{1,0}}, f32[8,8]{{1,0}}) tuple(z, x0, w0, a0)
  ROOT loop = (s32[], f32[8,8]{{1,0}}, f32[8,8]{{1,0}}, f32[8,8]{{1,0}}) while(init), condition=cond, body=body
}}
"""
PAIRS = "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"
# The stage's output is sent at the end of the iteration, and the next iteration's matmul starts from it.
AT_END = f"""  y = f32[8,8]{{1,0}} dot(x, gathered), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  out = f32[8,8]{{1,0}} collective-permute(y), {PAIRS}"""
# What the last iteration's matmul made is sent at the start of this one, whose matmuls all wait for it.
AT_START = f"""  received = f32[8,8]{{1,0}} collective-permute(x), {PAIRS}
  y = f32[8,8]{{1,0}} dot(received, gathered), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  out = f32[8,8]{{1,0}} copy(y)"""
# As AT_START, but a matmul of this iteration does not need what arrives: the transfer can hide behind it.
HIDDEN = f"""  received = f32[8,8]{{1,0}} collective-permute(x), {PAIRS}
  early = f32[8,8]{{1,0}} dot(gathered, gathered), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  y = f32[8,8]{{1,0}} dot(received, gathered), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  out = f32[8,8]{{1,0}} add(y, early)"""


def handoff_ops(send: str) -> set[str]:
    parsed = parse_collectives(LOOP.format(send=send))
    return {row.op for row in parsed.collectives if row.handoff}


@pytest.mark.parametrize("send", [AT_END, AT_START], ids=["at the end", "at the start"])
def test_a_stage_send_is_a_handoff_and_weights_and_gradients_are_not(send):
    assert handoff_ops(send) == {"collective-permute"}


def test_a_send_another_matmul_can_hide_is_no_handoff():
    assert handoff_ops(HIDDEN) == set()


def test_nothing_outside_a_loop_body_is_a_handoff():
    module = read_module(LOOP.format(send=AT_END))
    assert Handoffs(module).of("main") == frozenset()
    assert Handoffs(module).of("body") == frozenset({"out"})


@pytest.mark.parametrize("run", sorted(p.name for p in PROGRAMS.glob("*.hlo.txt.gz")))
def test_maxtexts_pipeline_programs_hand_off_once_per_forward_step(run):
    """In MaxText's own compiled pipelines (seed 003), of the three sends per iteration (the stage's output,
    the loop state and the circular storage) only the forward stage output is one: the backward pass's
    arrives while the step's forward pass is recomputed."""
    parsed = parse_collectives(gzip.decompress((PROGRAMS / run).read_bytes()))
    handoffs = [(r.op, r.pass_, r.loop_trips, r.count) for r in parsed.collectives if r.handoff]
    assert handoffs == [("collective-permute", "forward", 129, 1)]
    permutes = sum(r.count for r in parsed.collectives if r.op == "collective-permute" and r.loop_trips == 129)
    assert permutes == 6


@pytest.mark.parametrize("run", sorted(p.name for p in PROGRAMS.glob("*.hlo.txt.gz")))
def test_our_seed_003_plans_rotate_the_loop_state_as_maxtexts_programs_do(run):
    """shardscope's pipeline keeps MaxText's loop state, so its TPU compile of the same command line (the
    stored TPU-route plan, recompiled whenever the model changes) moves it as MaxText's own program does: per
    iteration, how many sends of how many bytes in each pass, and which of them the next iteration waits
    for."""
    theirs = parse_collectives(gzip.decompress((PROGRAMS / run).read_bytes())).collectives
    ours = load_plan(PLANS / f"{run.removesuffix('.hlo.txt.gz')}.tpu.json").collectives

    def sends(rows):
        permutes = [r for r in rows if r.op == "collective-permute" and r.loop_trips == 129]
        return sorted((r.pass_, r.count, r.bytes, r.handoff) for r in permutes)

    assert sends(ours) == sends(theirs) and len(sends(ours)) >= 3
