"""A GPU program's cuBLAS calls count as the dots they stand for, with their inputs' precision, and a float8 one
is priced at the GPU's fp8 peak. The modules are hand-written in the GPU compiler's spelling (a cuBLASLt call's
result is (product, workspace); its dot is in its backend config)."""

from __future__ import annotations

import dataclasses

import pytest

from shardscope.case.gpu import load_gpu_hardware
from shardscope.hlo.module import read_module
from shardscope.hlo.profile import work_profile
from shardscope.hlo.work import step_work

B, M, K, N = 4, 256, 512, 128
STEP = "jit(train_step)/jvp()/while/body"


def cublas_module(target: str, lhs: str, rhs: str, batched: bool = False, scales: bool = False) -> str:
    """One cuBLAS call: [M, K] × [K, N] → bf16[M, N] (or batched over B) of the given input types."""
    if batched:
        a, b, out = f"{lhs}[{B},{M},{K}]", f"{rhs}[{B},{K},{N}]", f"bf16[{B},{M},{N}]"
        dims = (
            '"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],'
            '"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]'
        )
    else:
        a, b, out = f"{lhs}[{M},{K}]", f"{rhs}[{K},{N}]", f"bf16[{M},{N}]"
        dims = '"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[]'
    params = [f"  %p0 = {a} parameter(0)", f"  %p1 = {b} parameter(1)"]
    operands = "%p0, %p1"
    if scales:  # an fp8 call also takes its inputs' scales
        params += ["  %s0 = f32[] parameter(2)", "  %s1 = f32[] parameter(3)"]
        operands += ", %s0, %s1"
    config = (
        '{"operation_queue_id":"0","gemm_backend_config":{"selected_algorithm":"0","alpha_real":1,"beta":0,'
        f'"dot_dimension_numbers":{{{dims}}},"precision_config":{{"operand_precision":["DEFAULT","DEFAULT"]}},'
        '"epilogue":"DEFAULT"}}'
    )
    call = (
        f'  %gemm = ({out}, s8[4194304]{{0}}) custom-call({operands}), custom_call_target="{target}", '
        f'metadata={{op_name="{STEP}/dot_general"}}, backend_config={config}'
    )
    return "\n".join(
        [
            "HloModule jit_train_step",
            "",
            "ENTRY %main () -> bf16[] {",
            *params,
            call,
            f"  ROOT %out = {out} get-tuple-element(%gemm), index=0",
            "}",
            "",
        ]
    )


def matmul_bin(text: str):
    (found,) = [b for b in work_profile(read_module(text)) if b.kind == "matmul"]
    return found


@pytest.mark.parametrize("target", ["__cublas$gemm", "__cublas$lt$matmul"])
def test_a_cublas_call_counts_as_its_dot(target):
    text = cublas_module(target, "bf16", "bf16")
    found = matmul_bin(text)
    assert (found.flops, found.precision) == (2 * M * K * N, "")
    assert step_work(read_module(text)).flops == 2 * M * K * N
    batched = matmul_bin(cublas_module(target, "bf16", "bf16", batched=True))
    assert batched.flops == 2 * B * M * K * N


def test_a_cublaslt_fp8_call_is_an_fp8_matmul_its_scales_aside():
    found = matmul_bin(cublas_module("__cublas$lt$matmul$f8", "f8e4m3fn", "f8e4m3fn", scales=True))
    assert (found.flops, found.precision) == (2 * M * K * N, "fp8")
    # float8 × float8 with one e5m2 input (a gradient's) is still fp8.
    assert matmul_bin(cublas_module("__cublas$lt$matmul$f8", "f8e5m2", "f8e4m3fn", scales=True)).precision == "fp8"


def test_another_custom_call_counts_no_flops():
    text = cublas_module("__cudnn$convForward", "bf16", "bf16")
    assert step_work(read_module(text)).flops == 0


def test_a_b200_multiplies_float8_at_twice_its_bf16_rate():
    from shardscope.cost.gpu import flops_seconds
    from shardscope.plan.document import Plan
    from shardscope.plan.records import CaseRecord

    b200 = load_gpu_hardware("b200")
    assert b200.peak_flops("fp8") == 2 * b200.peak_flops("") == 4.5e15
    fp8 = matmul_bin(cublas_module("__cublas$lt$matmul$f8", "f8e4m3fn", "f8e4m3fn", scales=True))
    case = CaseRecord(model="m", preset="p", topology="b200-1x8", mesh=(("fsdp", 8),), axis_types="auto")
    plan = Plan(case=case, provenance=(), tensors=(), work=(fp8,))
    bf16 = dataclasses.replace(plan, work=(dataclasses.replace(fp8, precision=""),))
    assert flops_seconds(plan, fp8.flops, b200) * 2 == pytest.approx(flops_seconds(bf16, fp8.flops, b200))
    # FLOPs beyond the fp8 matmuls' (elementwise, bf16 matmuls) stay at the bf16 peak.
    assert flops_seconds(plan, 2 * fp8.flops, b200) == pytest.approx(1.5 * flops_seconds(bf16, fp8.flops, b200))
