"""The compiler's involuntary-rematerialisation warnings: captured at the file-descriptor level, parsed from the
lines XLA writes, and their shardings put in mesh axes."""

from __future__ import annotations

import os
import sys

from lint_helpers import plan, preset, run

from shardscope.lint.context import LintContext
from shardscope.lint.remat import parse_remat_warnings, sharding_spec
from shardscope.stages.compiler_log import capture_compiler_log, echo_filter

PREFIX = "W1123 02:44:33.431553   26390 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. "
TAIL = (
    ". As the last resort, SPMD will replicate the tensor and then partition it to obtain the target sharding, which "
    "is inefficient. This issue will be fixed by Shardy partitioner in the future."
)
# As XLA wrote them for deepseek-tiny under MaxText's ep-as-cp.yml (fsdp=4, expert=2): the embedding lookup twice
# (once from a helper computation without metadata), and the layer loop's backward pass.
GATHER_BARE = (
    PREFIX + "The compiler cannot go from sharding {devices=[1,1,8]<=[8]} to {devices=[4,2,1]<=[8]} efficiently "
    "for HLO operation %gather = f32[8,32,8]{2,1,0} gather(%fake_parameter.0, %all-gather), offset_dims={2}, "
    "sharding={devices=[1,1,8]<=[8]}" + TAIL
)
GATHER = (
    PREFIX + "The compiler cannot go from sharding {devices=[1,1,8]<=[8]} to {devices=[4,2,1]<=[8]} efficiently "
    "for HLO operation %gather = f32[8,32,8]{2,1,0} gather(%param, %all-gather), slice_sizes={1,8}, "
    'sharding={devices=[1,1,8]<=[8]}, metadata={op_name="jit(train_step)/jvp(Transformer)/token_embedder/gather" '
    "stack_frame_id=14}" + TAIL
)
LOOP = (
    PREFIX + "The compiler cannot go from sharding {devices=[8,1,1]<=[8]} to {devices=[1,1,4,2]<=[8] "
    "last_tile_dim_replicate} efficiently for HLO operation %get-tuple-element = f32[1,32,64]{2,1,0} "
    'get-tuple-element(%while), index=1, sharding={devices=[8,1,1]<=[8]}, metadata={op_name="jit(train_step)/'
    'transpose(jvp(Transformer))/decoder/while" stack_frame_id=20}' + TAIL
)
MESH = (("data", 1), ("stage", 1), ("fsdp", 4), ("expert", 2))


def test_warnings_are_parsed_and_a_bare_repeat_is_dropped():
    log = "\n".join(["I1123 unrelated", GATHER_BARE, GATHER, LOOP, "continuation line", GATHER])
    gather, loop = parse_remat_warnings(log)
    assert (gather.opcode, gather.shape, gather.source, gather.pass_) == (
        "gather",
        "f32[8,32,8]",
        "token_embedder",
        "forward",
    )
    assert (gather.from_sharding, gather.to_sharding) == ("{devices=[1,1,8]<=[8]}", "{devices=[4,2,1]<=[8]}")
    assert (loop.opcode, loop.source, loop.pass_) == ("get-tuple-element", "decoder", "backward")
    assert loop.to_sharding == "{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}"
    assert parse_remat_warnings("W1123 something else entirely\n") == ()


def test_hlo_shardings_in_mesh_axes():
    assert sharding_spec("{devices=[1,1,8]<=[8]}", MESH, 3) == "P(None, None, ('fsdp', 'expert'))"
    assert sharding_spec("{devices=[4,2,1]<=[8]}", MESH, 3) == "P('fsdp', 'expert', None)"
    assert sharding_spec("{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}", MESH, 3) == "P(None, None, 'fsdp')"
    assert sharding_spec("{devices=[4,2]0,1,2,3,4,5,6,7}", MESH, 2) == "P('fsdp', 'expert')"
    assert sharding_spec("{devices=[2,4]0,2,4,6,1,3,5,7}", MESH, 2) == "P('expert', 'fsdp')"
    assert sharding_spec("{devices=[2,1,4]<=[4,2]T(1,0)}", MESH, 3) == "P('expert', None, 'fsdp')"
    assert sharding_spec("{replicated}", MESH, 2) == "P(None, None)"
    # Transposed device order: mesh fsdp=2, context=2, expert=2 (MaxText's cp-as-ep).
    cp = (("fsdp", 2), ("context", 2), ("expert", 2))
    assert sharding_spec("{devices=[4,2,1]<=[2,2,2]T(0,2,1)}", cp, 3) == "P(('fsdp', 'expert'), 'context', None)"
    # What matches no mesh axes (half of fsdp) stays in XLA's spelling.
    assert sharding_spec("{devices=[2,4]0,1,2,3,4,5,6,7}", MESH, 2) == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    assert sharding_spec("{maximal device=0}", MESH, 2) == "{maximal device=0}"


def test_findings_name_the_module_pass_and_both_shardings():
    chosen = preset([["embed", ["fsdp"]]], ("data", "stage", "fsdp", "expert"))
    ctx = LintContext(preset=chosen, plan=plan({}, MESH), compiler_log="\n".join([GATHER_BARE, GATHER, LOOP]))
    first, second = run("involuntary-remat", ctx)
    assert first.subject == "gather f32[8,32,8] at token_embedder (forward pass)"
    assert "from P(None, None, ('fsdp', 'expert')) to P('fsdp', 'expert', None)" in first.message
    assert second.subject == "get-tuple-element f32[1,32,64] at decoder (backward pass)"
    clean = LintContext(preset=chosen, plan=plan({}, MESH), compiler_log="I1123 nothing to see\n")
    assert run("involuntary-remat", clean) == []
    assert run("involuntary-remat", LintContext(preset=chosen, plan=plan({}, MESH))) == []


def test_capture_reads_file_descriptor_2_and_writes_back_what_the_user_asked_for(capfd, monkeypatch):
    monkeypatch.setenv("SHARDSCOPE_SHOWN_LOG_LEVEL", "2")
    with capture_compiler_log() as log:
        os.write(2, (GATHER + "\n").encode())  # as XLA's C++ code writes: below sys.stderr
        os.write(2, b"E1123 02:44:33.4 1 x.cc:1] an error the user sees\n")
        sys.__stderr__.write("a Python warning\n")  # Python's own stderr is file descriptor 2 too
    assert "Involuntary full rematerialization" in log.text and "a Python warning" in log.text
    err = capfd.readouterr().err
    assert "Involuntary" not in err
    assert "an error the user sees" in err and "a Python warning" in err


def test_echo_filter_keeps_continuation_lines_with_their_log_line():
    text = "W1123 02:44:33.4 1 x.cc:1] warned\n  more of it\nE1123 02:44:33.4 1 x.cc:1] failed\n  detail\n"
    assert echo_filter(text, 2) == "E1123 02:44:33.4 1 x.cc:1] failed\n  detail\n"
    assert echo_filter(text, 1) == text
