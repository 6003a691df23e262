"""`maxtext:MODEL` on GPU clusters: MaxText's own step built for the cluster (hardware=gpu, its ici_* keys
inside an NVLink domain and its dcn_* keys across), compiled with no GPU by XLA's GPU compiler, extracted and
priced on the GPU's figures. Skipped, saying so, where MaxText (Python 3.12) or the GPU extra is missing."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

if sys.version_info < (3, 12) or importlib.util.find_spec("maxtext") is None:
    pytest.skip("maxtext: models need Python 3.12 with MaxText installed", allow_module_level=True)
if importlib.util.find_spec("jax_cuda12_plugin") is None:
    pytest.skip("the GPU extra is not installed: pip install '.[gpu]'", allow_module_level=True)

import jax

import shardscope
from shardscope.case.gpu import load_gpu_hardware
from shardscope.cli import app
from shardscope.cost.gpu import flops_seconds

# The quick lane (`-m "not slow"`) leaves these out: MaxText's own programs built and compiled.
pytestmark = pytest.mark.slow

jax.devices()  # the session's fake CPU pool (conftest) starts first, as the other maxtext: tests expect

# Two small layers and short sequences: each compile takes seconds.
SMALL = (
    "override_model_config=true base_num_decoder_layers=2 base_emb_dim=256 base_mlp_dim=512 "
    "base_num_query_heads=4 base_num_kv_heads=2 head_dim=64 vocab_size=512 per_device_batch_size=1 "
    "max_target_length=128 attention=dot_product"
)
runner = CliRunner()


def links_by_axes(plan: shardscope.Plan) -> dict[tuple[str, ...], set[str | None]]:
    links: dict[tuple[str, ...], set[str | None]] = defaultdict(set)
    for row in plan.collectives:
        if row.axes:
            links[row.axes].add(row.link)
    return dict(links)


@pytest.fixture(scope="module")
def across_hosts() -> shardscope.Plan:
    """FSDP inside each host, data across the two (MaxText's defaults: ici_fsdp -1, dcn_data -1)."""
    return shardscope.plan_case("maxtext:llama3.1-8b", topology="h100-2x8", maxtext=SMALL)


def test_ici_axes_stay_on_nvlink_and_dcn_axes_cross_the_network(across_hosts):
    plan = across_hosts
    assert {axis: size for axis, size in plan.case.mesh if size > 1} == {"data": 2, "fsdp": 8}
    assert dict(plan.provenance)["backend"] == "gpu"
    links = links_by_axes(plan)
    assert links[("fsdp",)] == {"nvlink"}  # the weights' gathers and gradients' scatters, inside a host
    assert links[("data",)] == {"network"}  # the gradients' sum between the hosts
    memory = dict(plan.memory)
    assert memory["argument_bytes"] > 0


def test_hosts_over_fsdp_put_its_gathers_on_the_network():
    # `hardware=gpu`, as a GPU run's own command line says it, is what the route sets: taken as given.
    words = f"{SMALL} hardware=gpu ici_fsdp_parallelism=8 dcn_data_parallelism=1 dcn_fsdp_parallelism=2"
    plan = shardscope.plan_case("maxtext:llama3.1-8b", topology="h100-2x8", maxtext=words)
    assert {axis: size for axis, size in plan.case.mesh if size > 1} == {"fsdp": 16}
    assert links_by_axes(plan)[("fsdp",)] == {"network"}


def test_the_estimate_is_a_gpu_compile_priced_as_the_gpu(across_hosts):
    from shardscope.cost.price import price_plan

    estimate = price_plan(across_hosts).estimate
    assert estimate is not None and estimate.expected is not None
    assert estimate.route.startswith("GPU compile priced as h100 (uncalibrated")
    assert estimate.hardware == "h100"


def test_fp8_matmuls_compile_to_cublaslt_fp8_and_are_priced_at_the_fp8_peak():
    words = f"{SMALL} quantization=fp8 compile_xla_flags=--xla_gpu_enable_triton_gemm=false"
    plan = shardscope.plan_case("maxtext:llama3.1-8b", topology="b200-1x8", maxtext=words)
    fp8 = sum(b.flops for b in plan.work if b.precision == "fp8")
    matmul = sum(b.flops for b in plan.work if b.kind == "matmul")
    # Every projection's matmul is float8 (the attention's einsums and the logits are not quantized).
    assert fp8 > 0.7 * matmul
    b200 = load_gpu_hardware("b200")
    flops = dict(plan.compute)["flops"]
    all_bf16 = flops / (b200.peak_bf16_flops * b200.efficiency)
    assert flops_seconds(plan, flops, b200) == pytest.approx(
        all_bf16 - fp8 / (2 * b200.peak_bf16_flops * b200.efficiency)
    )


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ("hardware=tpu", "the GPU route builds MaxText's step as one program for every GPU (hardware=gpu)"),
        ("num_slices=4", "on h100-2x8 MaxText's slices are its 2 NVLink domains"),
        ("internal_compile_num_devices=8", "on h100-2x8 MaxText's slices are its 2 NVLink domains"),
        ("dcn_data_parallelism=4", "MaxText"),
        pytest.param(
            "attention=cudnn_flash_te",
            "NVIDIA Transformer Engine's attention, and Transformer Engine (transformer_engine.jax) is not installed",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is installed"
            ),
        ),
    ],
)
def test_what_the_gpu_route_cannot_honour_is_one_line_and_exit_2(words, message):
    small = SMALL.replace(" attention=dot_product", "") if words.startswith("attention=") else SMALL
    result = runner.invoke(
        app, ["dump", "maxtext:llama3.1-8b", "--topology", "h100-2x8", "--maxtext", f"{small} {words}"]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_gpu_pages_maxtext_commands_run(tmp_path):
    """The GPU how-to page's `maxtext:` commands (tests/test_gpu.py runs its others), each a plan written."""
    page = Path(__file__).parents[1] / "docs" / "how-to" / "gpu-clusters.md"
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    commands = [line for b in blocks for line in b.splitlines() if line.startswith("shardscope dump maxtext:")]
    assert len(commands) == 2
    for command in commands:
        args = shlex.split(command)
        out = tmp_path / args[args.index("-o") + 1]
        result = runner.invoke(app, [*args[1 : args.index("-o")], "-o", str(out)])
        assert result.exit_code == 0, f"{command}\n{result.output[-2000:]}"
        plan = shardscope.load_plan(out)
        assert dict(plan.provenance)["backend"] == "gpu"
    fp8 = shardscope.load_plan(tmp_path / "llama-fp8.json")
    assert any(b.precision == "fp8" for b in fp8.work)
    assert links_by_axes(fp8)[("fsdp",)] == {"network"}  # fsdp over both hosts (dcn_fsdp_parallelism=2)
