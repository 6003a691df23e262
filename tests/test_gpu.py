"""GPU clusters without a GPU: cluster names, the mesh laid NVLink domain first, and deviceless compiles for
H100 hosts (skipped, saying so, where the GPU extra is not installed)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shardscope.case.gpu import GpuCluster, known_gpu_names, load_gpu_hardware, parse_gpu_cluster, with_gpu_domains
from shardscope.case.hardware import HardwareError
from shardscope.case.topology import dcn_parts, get_topology, with_slices
from shardscope.cli import app
from shardscope.errors import ShardscopeError
from shardscope.extract.links import NETWORK, NVLINK, link_of
from shardscope.stages.devices import gpu_grid

runner = CliRunner()
HAS_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
needs_plugin = pytest.mark.skipif(not HAS_PLUGIN, reason="the GPU extra is not installed: pip install '.[gpu]'")


@pytest.mark.parametrize(
    ("name", "hosts", "per_host", "domains", "domain_gpus", "compiler"),
    [
        ("h100-1x8", 1, 8, 1, 8, "1x1x8"),
        ("h100-2x8", 2, 8, 2, 8, "1x2x8"),
        ("h200-32x8", 32, 8, 32, 8, "1x32x8"),
        ("b200-4x8", 4, 8, 4, 8, "1x4x8"),
        ("h100-1x4", 1, 4, 1, 4, "1x1x4"),
        ("gb200-18x4", 18, 4, 1, 72, "1x18x4"),
        ("gb200-36x4", 36, 4, 2, 72, "1x36x4"),
        ("gb200-4x4", 4, 4, 1, 16, "1x4x4"),
    ],
)
def test_gpu_cluster_names(name, hosts, per_host, domains, domain_gpus, compiler):
    cluster = parse_gpu_cluster(name)
    assert (cluster.hosts, cluster.gpus_per_host, cluster.domains, cluster.domain_gpus) == (
        hosts,
        per_host,
        domains,
        domain_gpus,
    )
    assert cluster.num_devices == hosts * per_host
    assert cluster.topology == compiler
    assert "gpu_device_info" in cluster.target_config()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("h100-2x16", "a h100 host has 1, 2, 4, 8 GPUs, found 16"),
        ("h100-0x8", "the number of hosts must be 1..4096"),
        ("gb200-20x4", "give up to 18 hosts or whole domains (e.g. gb200-36x4)"),
        ("gb200-18x8", "a gb200 host has 4 GPUs, found 8"),
    ],
)
def test_wrong_gpu_cluster_is_one_line(name, message):
    with pytest.raises(ShardscopeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_gpu_cluster(name)


def test_unknown_topology_suggests_a_gpu_cluster():
    with pytest.raises(ShardscopeError, match="did you mean 'h100-2x8'"):
        get_topology("h10-2x8")
    assert {"h100-2x8", "h200-2x8", "b200-2x8", "gb200-18x4"} <= set(known_gpu_names())


def test_slices_are_nvlink_domains():
    assert with_gpu_domains("h100-1x8", 4) == "h100-4x8"
    assert with_slices("gb200-18x4", 2) == "gb200-36x4"
    with pytest.raises(ShardscopeError, match="applies to one NVLink domain"):
        with_gpu_domains("h100-2x8", 2)


def test_cli_wrong_gpu_topology_exits_2():
    result = runner.invoke(app, ["dump", "llama-tiny", "--topology", "h100-2x16"])
    assert result.exit_code == 2
    assert "a h100 host has 1, 2, 4, 8 GPUs, found 16" in result.output
    assert "Traceback" not in result.output


class _Device:
    def __init__(self, id_: int):
        self.id = id_


def test_mesh_is_laid_nvlink_domain_first():
    cluster = GpuCluster("h100-2x8", "h100", hosts=2, gpus_per_host=8, hosts_per_domain=1)
    devices = [_Device(i) for i in reversed(range(16))]
    grid = gpu_grid(cluster, (("data", 2), ("fsdp", 4), ("expert", 2)), devices, "data")
    ids = np.vectorize(lambda d: d.id)(grid)
    # data takes the hosts; fsdp and expert stay inside one host, in device order.
    assert ids[0].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ids[1].tolist() == [[8, 9], [10, 11], [12, 13], [14, 15]]
    domains = ids // cluster.domain_gpus
    names = ["data", "fsdp", "expert"]
    assert link_of(("fsdp", "expert"), names, domains) == NVLINK
    assert link_of(("expert",), names, domains) == NVLINK
    assert link_of(("data",), names, domains) == NETWORK
    assert link_of(("data", "fsdp"), names, domains) == NETWORK


def test_dcn_axis_spreads_over_domains_as_its_outer_part():
    cluster = GpuCluster("h100-2x8", "h100", hosts=2, gpus_per_host=8, hosts_per_domain=1)
    grid = gpu_grid(cluster, (("data", 1), ("fsdp", 4), ("expert", 4)), [_Device(i) for i in range(16)], "fsdp")
    ids = np.vectorize(lambda d: d.id)(grid)[0]
    assert ids[:, 0].tolist() == [0, 4, 8, 12]  # fsdp: 2 per host × 2 hosts, hosts outermost
    assert (ids[:2] < 8).all() and (ids[2:] >= 8).all()


def test_hosts_laid_over_two_axes_as_a_hybrid_mesh():
    # MaxText's ici_data=2 ici_fsdp=2 ici_expert=2 dcn_data=2 dcn_fsdp=2 on 4 hosts of 8: each axis = ICI × DCN,
    # the DCN part outermost; the hosts form a 2 × 2 grid (data, fsdp), numbered in mesh order.
    cluster = parse_gpu_cluster("h100-4x8")
    mesh = (("data", 4), ("fsdp", 4), ("expert", 2))
    grid = gpu_grid(cluster, mesh, [_Device(i) for i in reversed(range(32))], "data:2,fsdp:2")
    ids = np.vectorize(lambda d: d.id)(grid)
    assert ids[:, 0, 0].tolist() == [0, 4, 16, 20]  # data: hosts 0, 0, 2, 2
    assert ids[0, :, 0].tolist() == [0, 2, 8, 10]  # fsdp: hosts 0, 0, 1, 1
    assert ids[0, 0].tolist() == [0, 1]  # expert: inside host 0
    assert ids[3, 3].tolist() == [30, 31]
    assert sorted(ids.ravel().tolist()) == list(range(32))
    domains = ids // cluster.domain_gpus
    for host in range(4):  # each host holds a 2 × 2 × 2 block: the ICI parts
        d, f, _ = np.nonzero(domains == host)
        assert (sorted(set(d.tolist())), sorted(set(f.tolist()))) == (
            [2 * (host // 2), 2 * (host // 2) + 1],
            [2 * (host % 2), 2 * (host % 2) + 1],
        )
    names = [axis for axis, _ in mesh]
    assert link_of(("expert",), names, domains) == NVLINK
    assert link_of(("data",), names, domains) == NETWORK
    assert link_of(("fsdp",), names, domains) == NETWORK
    assert link_of(("fsdp", "expert"), names, domains) == NETWORK
    # one axis given: all the hosts, as before
    one = np.vectorize(lambda d: d.id)(gpu_grid(cluster, mesh, [_Device(i) for i in range(32)], "data"))
    two = np.vectorize(lambda d: d.id)(gpu_grid(cluster, mesh, [_Device(i) for i in range(32)], "data:4"))
    assert (one == two).all() and one[:, 0, 0].tolist() == [0, 8, 16, 24]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("data:2,fsdp:4", "the counts multiply to 8, but the topology has 4 slices"),
        ("data:2,data:2", "an axis is named twice"),
        ("data:2,fsdp", "expected axis:count pairs"),
        ("data:0,fsdp:4", "expected axis:count pairs"),
    ],
)
def test_hosts_over_several_axes_wrong_settings(value, message):
    with pytest.raises(ShardscopeError, match=re.escape(message)):
        dcn_parts(value, 4)


def test_gpu_hardware_figures():
    h100, h200, b200 = (load_gpu_hardware(name) for name in ("h100", "h200-2x8", "b200"))
    assert (h100.hbm_bytes, h200.hbm_bytes, b200.hbm_bytes) == (80e9, 141e9, 180e9)
    assert h100.nvlink_bandwidth == 450e9 and h100.network_bandwidth == 50e9
    assert b200.peak_bf16_flops > h200.peak_bf16_flops == h100.peak_bf16_flops
    with pytest.raises(HardwareError, match="did you mean 'h100'"):
        load_gpu_hardware("h10")


def _dump(topology: str, out: Path, *extra: str, model: str = "llama-tiny") -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    env.pop("SHARDSCOPE_CACHE_DIR", None)
    command = [sys.executable, "-m", "shardscope.cli", "dump", model, "--topology", topology, "-o", str(out)]
    result = subprocess.run([*command, *extra, "--no-cache"], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cudart_stub" not in result.stderr  # the plugin's note about a missing driver stays hidden


@pytest.fixture(scope="module")
def h100_plans(tmp_path_factory) -> dict[str, Path]:
    if not HAS_PLUGIN:
        pytest.skip("the GPU extra is not installed: pip install '.[gpu]'")
    folder = tmp_path_factory.mktemp("gpu")
    plans = {
        "h100-1x8": folder / "one.json",
        "h100-2x8": folder / "two.json",
        "h100-2x8 again": folder / "two-again.json",
    }
    _dump("h100-1x8", plans["h100-1x8"])
    for key in ("h100-2x8", "h100-2x8 again"):
        _dump("h100-2x8", plans[key], "--mesh", "data=2", "--set", "model.global_batch=16")
    return plans


@needs_plugin
@pytest.mark.slow
def test_one_host_plan_is_the_gpu_compilers(h100_plans):
    from shardscope.plan.json import load_plan

    plan = load_plan(h100_plans["h100-1x8"])
    assert dict(plan.provenance)["backend"] == "gpu"
    assert plan.collectives and all(row.axes is not None for row in plan.collectives)
    assert {row.link for row in plan.collectives} == {NVLINK}  # one host: everything on NVLink
    assert {"all-gather", "reduce-scatter"} <= {row.op for row in plan.collectives}
    assert dict(plan.compute)["flops"] > 0
    assert dict(plan.memory)["temp_bytes"] > 0
    estimate = plan.estimate
    assert estimate is not None and estimate.hardware == "h100"
    assert "GPU compile priced as h100" in estimate.route and "uncalibrated" in estimate.route
    assert estimate.memory.capacity == 80_000_000_000 and estimate.memory.fits
    assert estimate.communication > 0 and estimate.unpriced_rows == 0


@needs_plugin
@pytest.mark.slow
def test_two_hosts_cross_the_network_on_data_only(h100_plans):
    from shardscope.plan.json import load_plan

    plan = load_plan(h100_plans["h100-2x8"])
    links = {(row.axes, row.link) for row in plan.collectives}
    assert (("data",), NETWORK) in links
    assert all(link == NVLINK for axes, link in links if axes is not None and "data" not in axes)
    assert all(link == NETWORK for axes, link in links if axes is not None and "data" in axes)
    assert any("(network)" in label for label, _ in plan.estimate.by_axes)


@needs_plugin
@pytest.mark.slow
def test_gpu_lints_read_the_compiled_links(h100_plans, tmp_path):
    from shardscope.plan.json import load_plan

    def lints(path: Path) -> set[str]:
        return {finding.lint for finding in load_plan(path).findings}

    network = {"network-collective-in-loop", "tensor-parallel-across-network"}
    assert not network & lints(h100_plans["h100-2x8"])  # data across hosts: once per step, as it should be
    batch = ("--set", "model.global_batch=16")
    _dump("h100-2x8", tmp_path / "fsdp.json", "--mesh", "data=8,fsdp=2,expert=1", "--set", "dcn_axis=fsdp", *batch)
    assert "network-collective-in-loop" in lints(tmp_path / "fsdp.json")
    tensor = ("--mesh", "data=1,fsdp=8,tensor=2,expert=1", "--set", "dcn_axis=tensor")
    _dump("h100-2x8", tmp_path / "tp.json", *tensor, *batch)
    found = {f.lint: f for f in load_plan(tmp_path / "tp.json").findings}
    assert "2 GPUs laid across hosts" in found["tensor-parallel-across-network"].message


@needs_plugin
@pytest.mark.slow
def test_gpu_plan_is_deterministic(h100_plans):
    assert h100_plans["h100-2x8"].read_bytes() == h100_plans["h100-2x8 again"].read_bytes()


@needs_plugin
@pytest.mark.slow
def test_hosts_over_data_and_fsdp_compile(tmp_path):
    # 4 hosts of 8 H100s as a 2 × 2 grid: data spans 2 hosts, fsdp 4 GPUs of a host × 2 hosts, tensor stays in
    # the host; the compiler's groups cross the network exactly where the hybrid layout puts hosts.
    from shardscope.plan.json import load_plan

    out = tmp_path / "hybrid.json"
    maxtext = "ici_fsdp_parallelism=4 ici_tensor_parallelism=2 dcn_data_parallelism=2 dcn_fsdp_parallelism=2"
    _dump("h100-4x8", out, "--maxtext", f"{maxtext} per_device_batch_size=1")
    plan = load_plan(out)
    mesh = {axis: size for axis, size in plan.case.mesh if size > 1}
    assert mesh == {"data": 2, "fsdp": 8, "tensor": 2}
    assert dict(plan.case.overrides)["dcn_axis"] == "data:2,fsdp:2"
    links = {(row.op, row.axes, row.link) for row in plan.collectives if row.axes is not None}
    assert {("reduce-scatter", ("fsdp",), NETWORK), ("all-gather", ("fsdp",), NETWORK)} <= links
    assert ("all-reduce", ("data",), NETWORK) in links
    assert ("all-gather", ("tensor",), NVLINK) in links
    assert all((link == NVLINK) == (axes == ("tensor",)) for _, axes, link in links)
    assert {label for label, _ in plan.estimate.by_axes} >= {"fsdp (network)", "tensor (NVLink)", "data (network)"}


def _page_commands() -> list[str]:
    page = Path(__file__).parents[1] / "docs" / "how-to" / "gpu-clusters.md"
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    # `maxtext:` commands need MaxText too: tests/test_maxtext_gpu.py runs them, in the maxtext: lane.
    return [
        line.split("  #", 1)[0].strip()
        for b in blocks
        for line in b.splitlines()
        if line.startswith("shardscope ") and "maxtext:" not in line
    ]


@needs_plugin
@pytest.mark.slow
def test_gpu_page_commands_run(tmp_path):
    """The how-to page's commands, in order (the later ones read what the earlier wrote)."""
    commands = _page_commands()
    assert len(commands) == 3
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    for command in commands:
        args = shlex.split(command)
        result = subprocess.run(
            [sys.executable, "-m", "shardscope.cli", *args[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr
    assert (tmp_path / "h100-2x8.json").exists()


@needs_plugin
def test_gpu_compiler_reads_boolean_options_as_written():
    from shardscope.case.resolve import compiler_options_for, resolve_case

    case = resolve_case(
        "llama-tiny", "default", "b200-1x8", {}, {"xla.xla_gpu_enable_triton_gemm": "false", "xla.xla_dump_to": "x"}
    )
    assert compiler_options_for(case) == {"xla_gpu_enable_triton_gemm": False, "xla_dump_to": "x"}


@needs_plugin
@pytest.mark.slow
def test_diff_of_two_gpu_plans_pairs_nvlink_and_network(h100_plans):
    from shardscope.diff.plans import diff_plans
    from shardscope.plan.json import load_plan

    one, two = load_plan(h100_plans["h100-1x8"]), load_plan(h100_plans["h100-2x8"])
    diff = diff_plans(one, two)
    assert [name for name, _ in diff.networks_before] == ["NVLink", "network"]
    assert dict(diff.networks_before)["network"] == 0  # one host: nothing leaves it
    assert dict(diff.networks_after)["network"] > 0
    assert sum(traffic for _, traffic in diff.networks_after) == diff.totals_after.total
    assert not any("different platforms" in note for note in diff.notes)


@pytest.fixture(scope="module")
def tpu_and_gpu_plans(tmp_path_factory, h100_plans) -> tuple[Path, Path]:
    """llama-tiny on two v5p-16 slices joined over data, beside the same case on two H100 hosts."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("the TPU extra is not installed: pip install '.[tpu]'")
    tpu = tmp_path_factory.mktemp("tpu") / "tpu.json"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    env.pop("SHARDSCOPE_CACHE_DIR", None)
    command = ["dump", "llama-tiny", "--topology", "v5p-16", "--slices", "2", "--mesh", "data=2"]
    command += ["--set", "model.global_batch=16", "-o", str(tpu), "--no-cache"]
    result = subprocess.run(
        [sys.executable, "-m", "shardscope.cli", *command], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return tpu, h100_plans["h100-2x8"]


@needs_plugin
@pytest.mark.slow
def test_diff_of_a_tpu_plan_and_a_gpu_plan_reads_by_network(tpu_and_gpu_plans):
    from shardscope.diff.changes import ChangeKind
    from shardscope.diff.plans import diff_plans
    from shardscope.plan.json import load_plan

    tpu, gpu = (load_plan(path) for path in tpu_and_gpu_plans)
    diff = diff_plans(tpu, gpu)
    # Tensors equal: the same case places every tensor alike on either platform.
    assert not [c for c in diff.changes if c.kind.name.startswith(("TENSOR", "SPEC"))]
    assert len(diff.unchanged_tensors) == len(gpu.tensors)
    assert [c.subject for c in diff.changes if c.kind == ChangeKind.CASE] == ["topology"]
    # Collectives regrouped by the network they cross: the slices' DCN against the hosts' network.
    assert [name for name, _ in diff.networks_before] == ["ICI → NVLink", "DCN → network"]
    assert [name for name, _ in diff.networks_after] == ["ICI → NVLink", "DCN → network"]
    assert dict(diff.networks_before)["DCN → network"] > 0 and dict(diff.networks_after)["DCN → network"] > 0
    assert sum(traffic for _, traffic in diff.networks_after) == diff.totals_after.total
    # Each side priced on its own hardware, and said so.
    assert (diff.cost_before.hardware, diff.cost_after.hardware) == ("v5p", "h100")
    assert any("different platforms (tpu → gpu)" in note for note in diff.notes)
    added = [c.after for c in diff.changes if c.kind == ChangeKind.COLLECTIVE_ADDED]
    assert added and all(side.axes_label.endswith(("(NVLink)", "(network)")) for side in added)

    result = runner.invoke(app, ["diff", *map(str, tpu_and_gpu_plans)], terminal_width=200)
    assert result.exit_code == 1, result.output  # the plans differ (their collectives)
    assert "Traffic per network" in result.output and "DCN → network" in result.output
    assert "on 2 × v5p 2x2x2 → h100 2x8" in result.output


@needs_plugin
@pytest.mark.slow
def test_a_real_moe_shape_on_two_hosts(tmp_path):
    """deepseek2-16b at its own batch on two H100 hosts: FSDP and EP inside each host, data across them."""
    from shardscope.plan.json import load_plan

    out = tmp_path / "deepseek2-16b.json"
    _dump("h100-2x8", out, "--mesh", "data=2,fsdp=4,expert=2", model="deepseek2-16b")
    plan = load_plan(out)
    assert dict(plan.provenance)["backend"] == "gpu"
    links = {(row.op, row.axes, row.link) for row in plan.collectives}
    assert ("all-to-all", ("expert",), NVLINK) in links  # EP's dispatch stays on NVLink
    assert all(link == NETWORK for _, axes, link in links if axes is not None and "data" in axes)
    assert all(link == NVLINK for _, axes, link in links if axes is not None and "data" not in axes)
    memory = plan.estimate.memory
    assert memory.capacity == 80_000_000_000 and memory.source.startswith("gpu compiler")
    figures = dict(plan.memory)
    assert memory.total == figures["argument_bytes"] + figures["temp_bytes"] + max(
        0, figures["output_bytes"] - figures["alias_bytes"]
    )
    assert 30e9 < memory.total < 80e9 and memory.fits  # its optimizer state alone is over 7 GiB per GPU


def test_gpu_shapes_table_is_generated_from_its_record():
    """The how-to page's table of real shapes is what `benchmarks/gpu_shapes.py --write` makes of its record."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    try:
        import gpu_shapes
    finally:
        sys.path.pop(0)
    assert gpu_shapes.main(["--check"]) == 0
    record = gpu_shapes.load_record()["shapes"]
    assert set(record) == set(gpu_shapes.SHAPES)
    for shape, found in record.items():
        assert found["backend"] == "gpu" and found["fits"] == (found["hbm_need_bytes"] <= found["hbm_capacity_bytes"])
        assert found["command"] == " ".join(gpu_shapes.command(shape, Path("x"))[:-3])
