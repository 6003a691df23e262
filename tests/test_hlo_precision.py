"""A quantized step's 8-bit matmuls are binned by their precision and priced at the chip's peak for it: a
TPU7x multiplies float8 at twice its bfloat16 rate. The modules are hand-written in the compiler's spelling."""

from __future__ import annotations

import dataclasses

import shardscope
from shardscope.case.hardware import load_hardware
from shardscope.cost.step import bin_seconds
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile
from shardscope.plan.json import plan_from_json, plan_to_json

M, K, N = 4096, 8192, 8192
STEP = "jit(train_step)/jvp()"


def module(lhs: str, rhs: str, fused: bool = False) -> str:
    """One matmul [M, K] × [K, N] → bf16[M, N] of the given input types, bare or inside a fusion."""
    a, b, out = f"{lhs}[{M},{K}]", f"{rhs}[{K},{N}]", f"bf16[{M},{N}]"
    dot = f"dot({a}{{1,0}} %p0, {b}{{1,0}} %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
    meta = f'metadata={{op_name="{STEP}/dot_general"}}'
    lines = [f"HloModule jit_train_step, entry_computation_layout={{({a}, {b})->{out}}}", ""]
    if fused:
        lines += [
            f"%fused_dot (p0: {a}, p1: {b}) -> {out} {{",
            f"  %p0 = {a}{{1,0}} parameter(0)",
            f"  %p1 = {b}{{1,0}} parameter(1)",
            f"  ROOT %d = {out}{{1,0}} {dot}, {meta}",
            "}",
            "",
        ]
    lines += [
        f"ENTRY %main (p0: {a}, p1: {b}) -> {out} {{",
        f"  %p0 = {a}{{1,0}} parameter(0)",
        f"  %p1 = {b}{{1,0}} parameter(1)",
    ]
    if fused:
        lines.append(
            f"  ROOT %f = {out}{{1,0}} fusion({a}{{1,0}} %p0, {b}{{1,0}} %p1), kind=kOutput, calls=%fused_dot, {meta}"
        )
    else:
        lines.append(f"  ROOT %d = {out}{{1,0}} {dot}, {meta}")
    return "\n".join([*lines, "}", ""])


def matmul_bin(text: str):
    (found,) = [b for b in work_profile(read_module(text)) if b.kind == "matmul"]
    return found


def test_float8_and_int8_matmuls_are_binned_by_their_precision_bare_or_fused():
    for fused in (False, True):
        assert matmul_bin(module("f8e4m3fn", "f8e4m3fn", fused)).precision == "fp8"
        assert matmul_bin(module("s8", "s8", fused)).precision == "int8"
        assert matmul_bin(module("bf16", "bf16", fused)).precision == ""
        # One 8-bit input is not an 8-bit matmul: the other is widened and the unit runs at bf16.
        assert matmul_bin(module("f8e4m3fn", "bf16", fused)).precision == ""
    assert matmul_bin(module("f8e4m3fn", "f8e4m3fn")).flops == 2 * M * K * N


def test_a_tpu7x_multiplies_float8_at_its_fp8_peak_and_v6e_at_its_bf16_one():
    fp8, bf16 = matmul_bin(module("f8e4m3fn", "f8e4m3fn")), matmul_bin(module("bf16", "bf16"))
    ironwood = load_hardware("tpu7x")
    # Held compute-bound whatever the bytes, so that the rates alone decide.
    fast, slow = (dataclasses.replace(b, bytes=1) for b in (fp8, bf16))
    assert bin_seconds(fast, ironwood) * 2 == bin_seconds(slow, ironwood)
    assert ironwood.peak_fp8_flops == 2 * ironwood.peak_bf16_flops
    trillium = load_hardware("v6e")
    assert bin_seconds(fast, trillium) == bin_seconds(slow, trillium)


def test_precision_round_trips_through_plan_json_and_is_absent_for_bf16():
    plan = shardscope.load_plan(sorted(shardscope_golden_plans())[0])
    with_fp8 = dataclasses.replace(plan, work=(*plan.work, matmul_bin(module("f8e4m3fn", "f8e4m3fn"))))
    text = plan_to_json(with_fp8)
    assert '"precision": "fp8"' in text
    assert plan_from_json(text).work == with_fp8.work
    assert '"precision"' not in plan_to_json(plan)


def shardscope_golden_plans():
    from pathlib import Path

    return (Path(__file__).resolve().parent.parent / "golden").glob("*/cpu-8/default.json")
