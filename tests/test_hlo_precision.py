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


def grouped_module(lhs: str, rhs: str) -> str:
    """A grouped-matmul kernel call as a quantized MoE compiles it (tokamax's `gmm_megablox`): group sizes,
    the tokens [4096, 2048], their scales, the experts' weights [128, 2048, 768] and theirs."""
    a, b = f"{lhs}[4096,2048]", f"{rhs}[128,2048,768]"
    sa, sb = ("bf16[16,128]", "bf16[1,16,128]") if lhs != "bf16" else ("", "")
    params = [("s32[129]", "%g"), (a, "%a"), *([(sa, "%sa")] if sa else []), (b, "%b"), *([(sb, "%sb")] if sb else [])]
    lines = [
        f"HloModule jit_train_step, entry_computation_layout={{({', '.join(s for s, _ in params)})->bf16[4096,768]}}"
    ]
    lines += ["", f"ENTRY %main ({', '.join(f'{n[1:]}: {s}' for s, n in params)}) -> bf16[4096,768] {{"]
    lines += [
        f"  {n} = {s}{{{','.join(map(str, reversed(range(s.count(',') + 1))))}}} parameter({i})"
        for i, (s, n) in enumerate(params)
    ]
    operands = ", ".join(f"{s} {n}" for s, n in params)
    lines.append(
        f"  ROOT %gmm_megablox.5 = bf16[4096,768]{{1,0}} custom-call({operands}), "
        f'custom_call_target="tpu_custom_call", metadata={{op_name="{STEP}/gmm_megablox"}}'
    )
    return "\n".join([*lines, "}", ""])


def test_a_quantized_grouped_kernel_is_read_at_its_matrices_precision_not_its_scales():
    """tokamax's grouped matmul under MaxText's fp8_full takes float8 tokens and weights with bfloat16 scales
    beside them: it runs at the fp8 rate (the scales, a few KiB, are not what the matrix units multiply)."""

    def grouped_bin(lhs: str, rhs: str):
        (found,) = [b for b in work_profile(read_module(grouped_module(lhs, rhs))) if b.kind == "grouped"]
        return found

    assert grouped_bin("f8e4m3fn", "f8e4m3fn").precision == "fp8"
    assert grouped_bin("bf16", "bf16").precision == ""
    assert grouped_bin("f8e4m3fn", "bf16").precision == ""
    assert grouped_bin("f8e4m3fn", "f8e4m3fn").flops == 2 * 4096 * 2048 * 768
