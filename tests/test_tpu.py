"""TPU topologies: product names → slices, the missing-extra error, quiet libtpu, CPU vs TPU plans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.case import topology, tpu
from shardscope.cli import app
from shardscope.cost.price import price_plan
from shardscope.diff import diff_plans
from shardscope.errors import MeshError
from shardscope.golden.store import load_golden

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "deepseek-tiny"

# Product name → devices, as TPU users count them: v4/v5p/tpu7x names count TensorCores (two per chip;
# v4/v5p chips run as one megacore device, a tpu7x chip as two devices), v5e/v6e names count chips.
DEVICES = {"v4-8": 4, "v5p-8": 4, "v5p-16": 8, "v5p-128": 64, "v5e-8": 8, "v6e-8": 8, "v6e-16": 16, "tpu7x-8": 8}


@pytest.mark.parametrize(("name", "devices"), sorted(DEVICES.items()))
def test_product_names_map_to_slices(name, devices):
    assert tpu.parse_tpu_slice(name).num_devices == devices
    assert name in tpu.known_tpu_names()


def test_slice_descriptions():
    v5p = tpu.parse_tpu_slice("v5p-16")
    assert (v5p.topology_name, v5p.chip_config, v5p.wrap) == ("v5:2x2x2", "megacore", (False, False, False))
    assert tpu.parse_tpu_slice("v5p-128").wrap == (True, True, True)
    assert tpu.parse_tpu_slice("v6e-8").topology_name == "v6e:2x4"
    assert tpu.parse_tpu_slice("tpu7x-8").topology_name == "tpu7x:2x2x1"


def test_odd_sizes_are_refused_with_the_known_ones():
    result = CliRunner().invoke(app, ["dump", "deepseek-tiny", "--topology", "v5p-12"])
    assert result.exit_code == 2
    assert "not a standard v5p slice" in result.stderr and "v5p-16" in result.stderr


def test_without_the_extra_a_tpu_topology_names_it(monkeypatch):
    monkeypatch.setattr(topology, "libtpu_version", lambda: None)
    result = CliRunner().invoke(app, ["dump", "deepseek-tiny", "--preset", "ep-as-cp", "--topology", "tpu7x-8"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "shardscope: error: topology 'tpu7x-8' compiles for TPU, which needs libtpu: "
        "install the TPU extra: pip install 'shardscope[tpu]'"
    ]


@pytest.mark.slow
def test_tpu_dump_is_quiet_and_records_the_backend(tmp_path):
    out = tmp_path / "plan.json"
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")} | {"TMPDIR": str(temp)}
    result = subprocess.run(
        [sys.executable, "-m", "shardscope.cli", "dump", "mixtral-tiny", "--topology", "v5p-16", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # nothing from libtpu on a host without TPU chips
    assert list(temp.iterdir()) == []  # nor log files of its own left behind
    plan = load_golden(out)
    provenance = dict(plan.provenance)
    assert provenance["backend"] == "tpu" and provenance["libtpu"] == tpu.libtpu_version()
    assert plan.case.topology == "v5p-16"


def test_cpu_and_tpu_plans_agree_on_shardings_not_on_schedules():
    cpu = load_golden(GOLDEN / "cpu-8" / "ep-as-cp.json")
    tpu_plan = load_golden(GOLDEN / "tpu7x-8" / "ep-as-cp.json")
    diff = diff_plans(cpu, tpu_plan)
    assert not diff.of_kind("tensor_added", "tensor_removed", "spec_changed", "tensor_changed")
    assert diff.of_kind("collective_added", "collective_removed", "collective_changed")
    assert [c.subject for c in diff.of_kind("case")] == ["topology"]
    assert any(note.startswith("backend differs (cpu → tpu)") for note in diff.notes)
    # The TPU compiler writes no trip counts on its loops: they are derived, so MoE rows still have them.
    source = "decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0"
    moe = [r for r in tpu_plan.collectives if r.source == source and r.op == "all-to-all"]
    assert moe and all(r.loop_trips == 4 for r in moe)


@pytest.mark.slow
def test_slices_join_over_the_data_axis(plan_of):
    from shardscope.case import resolve_case
    from shardscope.case.topology import with_slices

    name = with_slices("v5p-16", 2)
    assert name == "2xv5p-16"
    case = resolve_case(
        "mixtral-tiny", "default", name, {"data": 2, "fsdp": -1, "expert": 2}, {"model.global_batch": "16"}
    )
    assert case.topology.num_devices == 16 and case.topology.slices == 2
    plan = plan_of(case)
    assert plan.case.topology == "2xv5p-16" and dict(plan.case.mesh)["data"] == 2
    # Groups are numbered within one slice; mapped on the slice's own mesh they are mesh axes again.
    assert plan.collectives and all(row.axes is not None for row in plan.collectives)
    assert any(row.op == "all-to-all" and row.axes == ("expert",) for row in plan.collectives)


@pytest.mark.slow
def test_slices_join_over_the_axis_the_case_names(plan_of):
    # MaxText's dcn_fsdp_parallelism=2 on two v5p-16 slices: fsdp (8 = 4 in a slice × 2) spans them.
    from shardscope.case import resolve_case
    from shardscope.case.resolve import resolve_maxtext_case

    words = "per_device_batch_size=1 ici_expert_parallelism=2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2"
    topology = "compile_topology=v5p-16 compile_topology_num_slices=2"
    case, _ = resolve_maxtext_case("mixtral-tiny", None, None, f"{words} {topology}")
    assert case.topology.name == "2xv5p-16" and case.dcn_axis == "fsdp"
    assert case.mesh_sizes["fsdp"] == 8 and case.mesh_sizes["data"] == 1
    plan = plan_of(case)
    # Each slice's program sees half the fsdp axis: its groups are mesh axes of that slice's mesh.
    assert plan.collectives and all(row.axes is not None for row in plan.collectives)
    assert any(row.axes == ("fsdp",) for row in plan.collectives)
    priced = price_plan(plan).estimate
    assert priced is not None and {p.row.axes for p in priced.cross_slice} == {("fsdp",)}
    with pytest.raises(MeshError, match="unknown mesh axis 'fsdq'; did you mean 'fsdp'"):
        resolve_case("mixtral-tiny", "default", "2xv5p-16", {"data": 1, "fsdp": -1}, {"dcn_axis": "fsdq"})


def test_slices_need_a_data_axis_they_divide():
    result = CliRunner().invoke(app, ["dump", "mixtral-tiny", "--topology", "v5p-16", "--slices", "2"])
    assert result.exit_code == 2
    assert "joined over mesh axis 'data', whose size 1 is not a multiple of 2" in result.stderr
    cpu = CliRunner().invoke(app, ["dump", "mixtral-tiny", "--slices", "2"])
    assert cpu.exit_code == 2 and "--slices 2: applies to a single TPU slice name" in cpu.stderr


def test_every_published_slice_size_is_a_topology():
    # The largest slices each family sells: v4 4096 chips, v5p 8960 (16x20x28), TPU7x 9216; v5e/v6e 256 a slice.
    from shardscope.case.tpu import parse_tpu_slice
    from shardscope.errors import ShardscopeError

    assert parse_tpu_slice("v5p-1024").num_devices == 512
    assert parse_tpu_slice("v5p-17920").topology_name == "v5:16x20x28"
    assert parse_tpu_slice("v4-8192").topology_name == "v4:16x16x16"
    assert parse_tpu_slice("tpu7x-18432").num_devices == 18432
    for too_big in ("v4-16384", "v5p-18432", "v6e-512"):
        with pytest.raises(ShardscopeError, match="not a standard"):
            parse_tpu_slice(too_big)
    # Between the table's sizes, a 3D slice is whole 4x4x4 cubes, arranged as close to a cube as they go.
    for name, shape in (("v5p-1536", "8x8x12"), ("v4-3072", "8x12x16"), ("tpu7x-1536", "8x8x12")):
        described = parse_tpu_slice(name)
        dims = [int(d) for d in shape.split("x")]
        assert described.topology_name.endswith(f":{shape}") and all(d % 4 == 0 for d in dims)
        chips = dims[0] * dims[1] * dims[2]
        assert described.num_devices == chips * (2 if name.startswith("tpu7x") else 1)
    with pytest.raises(ShardscopeError, match="whole 4x4x4 cubes"):
        parse_tpu_slice("v5p-96")  # 48 chips: neither a listed slice nor whole cubes


@pytest.mark.slow
def test_xla_flags_are_options_of_the_tpu_compile(tmp_path):
    flag = "xla.xla_jf_spmd_threshold_for_windowed_einsum_mib"
    out = tmp_path / "plan.json"
    runner = CliRunner()
    result = runner.invoke(
        app, ["dump", "llama-tiny", "--topology", "v5p-8", "--set", f"{flag}=1000000", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert dict(load_golden(out).provenance)["compiler_options"] == {flag.removeprefix("xla."): "1000000"}
    # One the compiler does not have is refused by the compiler itself, in one line.
    result = runner.invoke(app, ["dump", "llama-tiny", "--topology", "v5p-8", "--set", "xla.xla_no_such_flag=1"])
    assert result.exit_code == 2
    assert "xla.xla_no_such_flag: the v5p-8 compiler has no such option" in result.output
