"""A catalogue of wrong inputs: each is exit 2, at most three lines on stderr, no traceback, and leaves every
existing file as it was (a plan written before, a golden directory).

Commands run through the console-script entry point (`shardscope.cli.main`), so usage mistakes (an unknown
option, a missing argument) are held to the same rule as every other wrong input.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from shardscope.cli import main

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "deepseek-tiny" / "cpu-8"

# Files each case starts with (relative to its working directory).
STEP_FILES = {
    "steps_bad.py": (
        "import jax\n"
        "import numpy as np\n"
        "def returns_int(devices):\n    return 3\n"
        "def raises(devices):\n    raise ValueError('no such layer')\n"
        "def not_jitted(devices):\n"
        "    return (lambda x: x), (), jax.sharding.Mesh(np.array(devices), ('data',))\n"
        "def small_mesh(devices):\n"
        "    return jax.jit(lambda x: x), (), jax.sharding.Mesh(np.array(devices[:2]), ('data',))\n"
    ),
    "steps_broken.py": "undefined_name\n",
}

PRESET_FILES = {
    "bad.yaml": "mesh_axes: [fsdp\n",
    "unknown_key.yaml": "mesh_axes: [fsdp]\nlogical_axis_rule: []\n",
    "twice_mesh.yaml": "mesh_axes: [fsdp, fsdp]\n",
    "twice_rule.yaml": "mesh_axes: [fsdp, expert]\nlogical_axis_rules: [[embed, [fsdp, fsdp]]]\n",
    "sizes_missing_axis.yaml": "mesh_axes: [fsdp]\nmesh: {fsdp: -1, expert: 2}\n",
    "not_mapping.yaml": "- fsdp\n- expert\n",
    "rule_shape.yaml": "mesh_axes: [fsdp]\nlogical_axis_rules: [[embed]]\n",
    "bad_moe.yaml": "mesh_axes: [fsdp]\nmoe: ragged\n",
    "no_mesh_axes.yaml": "logical_axis_rules: []\n",
    "pipeline_key.yaml": "mesh_axes: [stage, fsdp]\npipeline: {stages: 2}\n",
    "typo_axis.yaml": "mesh_axes: [fsdp, expert]\nlogical_axis_rules: [[embed, [fsdpp]]]\n",
}

# An HLO module on 4 devices: one all-gather over pairs.
FOUR_DEVICES = """HloModule four, num_partitions=4

ENTRY main {
  p = f32[8] parameter(0)
  ROOT ag = f32[16] all-gather(p), dimensions={0}, replica_groups={{0,1},{2,3}}
}
"""

CASES: list[tuple[tuple[str, ...], str]] = [
    # MaxText's command line (--maxtext)
    (("dump", "mixtral-tiny", "--maxtext", "per_device_batchsize=1"), "did you mean per_device_batch_size?"),
    (("dump", "mixtral-tiny", "--maxtext", "remat_policy"), "expected key=value"),
    (
        ("dump", "mixtral-tiny", "--maxtext", "ici_fsdp_parallelism=four"),
        "ici_fsdp_parallelism=four: expected an integer",
    ),
    (("dump", "mixtral-tiny", "--maxtext", "sparse_matmul=maybe"), "sparse_matmul=maybe: expected true or false"),
    (("dump", "mixtral-tiny", "--maxtext", "remat_policy=fulll"), "remat_policy=fulll: expected one of full"),
    (("dump", "mixtral-tiny", "--maxtext", "ici_fsdp_parallelism=3"), "multiply to 3, but a slice has 8 devices"),
    (("dump", "mixtral-tiny", "--maxtext", "ici_fsdp_parallelism=-1 ici_expert_parallelism=3"), "does not divide"),
    (
        ("dump", "mixtral-tiny", "--maxtext", "custom_mesh_and_rule=ep-as-cp ici_tensor_parallelism=2"),
        "no 'tensor' axis",
    ),
    (("dump", "mixtral-tiny", "--maxtext", "steps=1 steps=2"), "steps is given twice"),
    (("dump", "mixtral-tiny", "--maxtext", "model_name=llama2-7b"), "the model planned is mixtral-tiny"),
    (("dump", "mixtral-tiny", "--maxtext", "custom_mesh_and_rule=ep-as-cpp"), "did you mean 'ep-as-cp'"),
    (("dump", "mixtral-tiny", "--mesh", "fsdp=8", "--maxtext", "steps=1"), "size the mesh with MaxText's ici_"),
    (("lint", "mixtral-tiny", "--maxtext", "per_device_batch_size=x"), "per_device_batch_size=x: expected a number"),
    # compare of MaxText's own program: variants of its command line
    (("compare", "maxtext:qwen3-0.6b"), "name MaxText keys to compare with --preset"),
    (("compare", "maxtext:qwen3-0.6b", "-p", "ep-as-cp"), "(e.g. --preset 'custom_mesh_and_rule=ep-as-cp')"),
    (("compare", "maxtext:qwen3-0.6b", "-p", "steps=1", "-p", "steps=1"), "each variant once"),
    (("compare", "llama-tiny", "--maxtext-path", "/tmp"), "--maxtext-path plans a maxtext:MODEL"),
    (
        ("dump", "mixtral-tiny", "--topology", "v5p-8", "--slices", "4", "--maxtext", "dcn_fsdp_parallelism=2"),
        "dcn_axis=data:2,fsdp:2 (--set, or MaxText's dcn_*_parallelism): TPU slices are joined over one",
    ),
    (("dump", "mixtral-tiny", "--set", "dcn_axis=fsdq"), "unknown mesh axis 'fsdq'; did you mean 'fsdp'?"),
    # XLA flags (`--set xla.<flag>`): options of the TPU compiler only
    (("dump", "llama-tiny", "--set", "xla.xla_tpu_enable_foo=true"), "give a TPU --topology to use them"),
    (("dump", "llama-tiny", "--set", "xla.--xla_foo=1"), "expected xla.<flag name>"),
    # names
    (("dump", "deepseek-tin"), "did you mean 'deepseek-tiny'"),
    (("dump", "deepseek-tiny", "--preset", "ep-as-cpp"), "did you mean 'ep-as-cp'"),
    (("dump", "deepseek-tiny", "--topology", "cpu8"), "did you mean 'cpu-8'"),
    (("dump", "deepseek-tiny", "--topology", "cpu-0"), "device count must be"),
    (("dump", "deepseek-tiny", "--topology", "v5p-17"), "v5p-17"),
    (("dump", "deepseek-tiny", "--slices", "2"), "--slices 2"),
    (("explain", "--preset", "nope", "embed"), "unknown preset 'nope'"),
    # meshes
    (("dump", "deepseek-tiny", "--mesh", "fsdp=3,expert=2"), "uses 6 devices but the topology has 8"),
    (("dump", "deepseek-tiny", "--mesh", "fsdp=-1,expert=3"), "does not fit 8 devices"),
    (("dump", "deepseek-tiny", "--mesh", "fsdp=-1,expert=-1"), "only one axis may be -1"),
    (("dump", "deepseek-tiny", "--mesh", "fsdp=0"), "must be positive or -1"),
    (("dump", "deepseek-tiny", "--mesh", "fsdp:4"), "expected axis=size pairs"),
    (("dump", "deepseek-tiny", "--preset", "ep-as-cp", "--mesh", "tensor=2"), "missing mesh axis"),
    (("explain", "--preset", "default", "--mesh", "fdsp=2", "embed"), "did you mean 'fsdp'"),
    # --set
    (("dump", "deepseek-tiny", "--set", "model.seq_len=abc"), "expected a positive integer"),
    (("dump", "deepseek-tiny", "--set", "model.seq_len=-5"), "expected a positive integer"),
    (("dump", "deepseek-tiny", "--set", "model.num_layers=0"), "expected a positive integer"),
    (("dump", "deepseek-tiny", "--set", "pipeline.fsdp_gather_once=yes"), "expected true or false"),
    (("dump", "deepseek-tiny", "--set", "model.dtype=int8"), "expected one of bfloat16, float16, float32"),
    (("dump", "deepseek-tiny", "--set", "model.capacity_factor=abc"), "or none (dropless)"),
    (("dump", "deepseek-tiny", "--set", "model.capacity_factor=-1"), "positive number"),
    (("dump", "deepseek-tiny", "--set", "model.per_device_batch=0"), "positive number"),
    (("dump", "deepseek-tiny", "--set", "model.global_batch=x"), "whole number of sequences"),
    (("dump", "deepseek-tiny", "--set", "model.first_dense_layers=9"), "exceeds num_layers=5"),
    (("dump", "mixtral-tiny", "--set", "model.first_dense_layers=1"), "Mixtral has no dense layers"),
    (("dump", "deepseek2-16b", "--set", "model.per_device_batch=0.3"), "not a whole number"),
    (("dump", "deepseek-tiny", "--set", "model.vocab=10"), "unknown setting 'model.vocab'"),
    (("dump", "deepseek-tiny", "--set", "mo=ring"), "did you mean 'moe'"),
    (("dump", "deepseek-tiny", "--set", "moe=ragged"), "moe must be one of all_to_all, ring"),
    (("dump", "deepseek-tiny", "--set", "shard_mode=manual"), "shard_mode must be one of auto, explicit"),
    (("dump", "deepseek-tiny", "--set", "noequals"), "expected key=value"),
    (("dump", "deepseek-tiny", "--set", "pipeline.microbatches=0"), "positive integer"),
    (("dump", "deepseek-tiny", "--set", "pipeline.stages=2"), "unknown setting 'pipeline.stages'"),
    (
        ("dump", "deepseek-tiny", "--preset", "explicit-pipeline", "--set", "pipeline.microbatches=4"),
        "does not split over fsdp×expert",
    ),
    (
        ("dump", "deepseek-tiny", "--preset", "explicit-pipeline", "--set", "pipeline.repeats=3"),
        "3 repeats do not split the 2 layers of a stage evenly",
    ),
    (
        (
            "dump",
            "deepseek-tiny",
            "-p",
            "explicit-pipeline",
            "--set",
            "pipeline.repeats=2",
            "--set",
            "pipeline.microbatches=1",
        ),
        "1 microbatches do not split over 2 stages",
    ),
    (
        (
            "dump",
            "deepseek-tiny",
            "-p",
            "explicit-pipeline",
            "--set",
            "model.global_batch=12",
            "--set",
            "pipeline.microbatches=3",
        ),
        "3 microbatches do not split over 2 stages",
    ),
    (("dump", "mixtral-tiny", "--preset", "ep-as-cp", "--set", "model.seq_len=33"), "do not divide"),
    (("dump", "mixtral-tiny", "--preset", "ep-tp", "--mesh", "fsdp=2,expert=4"), "do not divide"),
    # preset files
    (("dump", "deepseek-tiny", "--preset", "bad.yaml"), "malformed YAML at line"),
    (("dump", "deepseek-tiny", "--preset", "unknown_key.yaml"), "unknown key 'logical_axis_rule'"),
    (("dump", "deepseek-tiny", "--preset", "twice_mesh.yaml"), "more than once"),
    (("dump", "deepseek-tiny", "--preset", "twice_rule.yaml"), "more than once"),
    (("explain", "--preset", "sizes_missing_axis.yaml", "embed"), "missing mesh axis"),
    (("dump", "deepseek-tiny", "--preset", "not_mapping.yaml"), "expected a YAML mapping"),
    (("dump", "deepseek-tiny", "--preset", "rule_shape.yaml"), "must be [logical_name, mesh_axes]"),
    (("dump", "deepseek-tiny", "--preset", "bad_moe.yaml"), "moe must be one of"),
    (("dump", "deepseek-tiny", "--preset", "no_mesh_axes.yaml"), "missing required key 'mesh_axes'"),
    (("dump", "deepseek-tiny", "--preset", "pipeline_key.yaml"), "unknown pipeline key 'stages'"),
    (
        ("lint", "deepseek-tiny", "--preset", "typo_axis.yaml"),
        "names mesh axis 'fsdpp', which mesh_axes lacks; did you mean 'fsdp'?",
    ),
    (("dump", "deepseek-tiny", "--preset", "absent.yaml"), "does not exist"),
    # outputs
    (("dump", "deepseek-tiny", "-o", "existing.json/plan.json"), "is a file, not a directory"),
    (("dump", "deepseek-tiny", "-o", "."), "is a directory"),
    (("diff", "existing.json", "existing.json", "--html", "existing.json/r.html"), "is a file, not a directory"),
    # plans and goldens
    (("diff", "existing.json", "absent.json"), "plan file absent.json does not exist"),
    (("diff", "corrupt.json", "existing.json"), "corrupt plan"),
    (("diff", "newer.json", "existing.json"), "newer than this shardscope reads"),
    (("check", "--golden", "empty"), "no cases.yaml"),
    (("check", "--golden", "golden", "--shard", "0/3"), "counted from 1"),
    (("check", "--golden", "golden", "--shard", "4/3"), "out of range: 3 shards are 1/3 … 3/3"),
    (("check", "--golden", "golden", "--shard", "1-3"), "expected K/N"),
    (("check", "--golden", "golden", "--ray", "127.0.0.1:1"), "--ray 127.0.0.1:1"),
    (("update", "--golden", "golden", "--ray", "no-port"), "expected host:port"),
    (("advise", "deepseek-tin"), "did you mean 'deepseek-tiny'"),
    (("advise", "deepseek-tiny", "--preset", "ep-as-cpp"), "did you mean 'ep-as-cp'"),
    (("advise", "deepseek-tiny", "--topology", "v5p-17"), "v5p-17"),
    (("advise", "deepseek-tiny", "--mesh", "fdsp=1"), "did you mean 'fsdp'"),
    (("advise", "deepseek-tiny", "--mesh", "fsdp=3"), "divides 8 devices"),
    (("advise", "deepseek-tiny", "--top", "0"), "--top must be at least 1"),
    (("advise", "deepseek-tiny", "--hardware", "v5"), "did you mean"),
    (("advise", "deepseek-tiny", "--ray", "127.0.0.1:1"), "--ray 127.0.0.1:1"),
    # advise of MaxText's own program: searched over its ici_* sizes, every candidate compiled
    (("advise", "maxtext:qwen3-0.6b", "-p", "ep-as-cp"), "--preset does not apply"),
    (("advise", "maxtext:qwen3-0.6b", "--mesh", "fsdp=2"), "--mesh does not apply"),
    (("advise", "maxtext:qwen3-0.6b", "--confirm", "5"), "--confirm does not apply"),
    (("advise", "maxtext:qwen3-0.6b", "--predict-only"), "cannot be predicted"),
    (("advise", "llama-tiny", "--maxtext-path", "/tmp"), "--maxtext-path plans a maxtext:MODEL"),
    (("update", "--golden", "golden", "deepseek-tiny/cpu-8/defualt"), "did you mean"),
    # explain
    (("explain", "--preset", "default", "embed", "embed"), "more than once"),
    # pricing
    (("dump", "deepseek-tiny", "--hardware", "v5q"), "did you mean 'v5p'"),
    (
        ("dump", "deepseek-tiny", "--topology", "cpu-6", "--mesh", "fsdp=-1,expert=2", "--hardware", "v5p"),
        "6 devices are not a standard v5p slice",
    ),
    (
        ("dump", "deepseek-tiny", "--topology", "cpu-512", "--mesh", "fsdp=-1,expert=2", "--hardware", "v5e"),
        "512 devices are not a standard v5e slice",
    ),
    (("dump", "deepseek-tiny", "--efficiency", "0.5"), "priced only with --hardware"),
    (("dump", "deepseek-tiny", "--hardware", "v5p", "--efficiency", "1.5"), "must be in (0, 1]"),
    (("diff", "existing.json", "existing.json", "--hardware", "v9"), "unknown hardware 'v9'"),
    (("diff", "existing.json", "existing.json", "--hardware", "v5e", "--efficiency", "0"), "must be in (0, 1]"),
    (("check", "--golden", "priced"), "did you mean 'v5p'"),
    # programs of one's own (--step)
    (("dump", "--step", "steps_bad.py"), "expected module:function"),
    (("dump", "--step", "no_such_pkg.steps:make_step"), "cannot import no_such_pkg.steps (ModuleNotFoundError"),
    (("dump", "--step", "absent.py:make_step"), "file absent.py does not exist"),
    (("dump", "--step", "steps_bad.py:nothing"), "has no attribute 'nothing'"),
    (("dump", "--step", "steps_bad.py:returns_int"), "must return (jitted step, args, mesh), returned an int"),
    (("dump", "--step", "steps_bad.py:raises"), "raises raised ValueError: no such layer"),
    (("dump", "--step", "steps_bad.py:not_jitted"), "is not jitted"),
    (("dump", "--step", "steps_bad.py:small_mesh"), "its mesh has 2 devices but the topology has 8"),
    (("dump", "--step", "steps_broken.py:make_step"), "cannot import steps_broken.py (NameError"),
    (("dump", "deepseek-tiny", "--step", "steps_bad.py:raises"), "a model name or --step"),
    (("dump", "--step", "steps_bad.py:raises", "--preset", "ep-as-cp"), "--preset does not apply"),
    (("dump",), "a model name or --step"),
    # HLO files
    (("collectives", "junk.txt"), "junk.txt"),
    (("collectives", "absent.txt"), "cannot read"),
    (("collectives", "four.hlo", "--mesh", "data=3"), "has 3 devices but the module runs on 4"),
    (("collectives", "four.hlo", "--mesh", "data=2,data=2"), "axis 'data' is given twice"),
    (("collectives", "four.hlo", "--mesh", "fsdp=-1,expert=3"), "which the other axes (3) do not divide"),
    (("collectives", "four.hlo", "--mesh", "fsdp=-1,expert=-1"), "only one axis may be -1"),
    (("collectives", "headerless.hlo", "--mesh", "fsdp=-1"), "does not say how many devices"),
    (("collectives", "four.hlo", "--mesh", "fsdp=four"), "fsdp=four"),
    (("collectives", "twice.hlo"), "a second 'HloModule' header"),
    # why
    (("why", "existing.json", "--op", "all-gathr"), "did you mean 'all-gather'"),
    (("why", "existing.json", "--axes", "fsdpp"), "did you mean 'fsdp'"),
    (("why", "four.hlo"), "is an HLO module, not a plan"),
    (("why", "uncaused.json"), "records no causes"),
    (("why", "corrupt.json"), "corrupt plan"),
    (("why", "tensors_only.json"), "holds tensors only"),
    # import-maxtext
    (("import-maxtext", "empty"), "not a MaxText sharding dump"),
    # usage
    (("dump", "deepseek-tiny", "--presets", "default"), "No such option: --presets"),
    (("explain",), "Missing argument"),
    (("dump", "deepseek-tiny", "extra"), "unexpected extra argument"),
    (("dump", "deepseek-tiny", "--slices", "two"), "Invalid value for '--slices'"),
]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A directory holding an earlier plan, a corrupt and a newer-schema plan, preset files and a golden set."""
    for name, text in {**PRESET_FILES, **STEP_FILES}.items():
        (tmp_path / name).write_text(text)
    shutil.copy(GOLDEN / "default.json", tmp_path / "existing.json")
    (tmp_path / "corrupt.json").write_text("{not json")
    newer = (GOLDEN / "default.json").read_text().replace('"shardscope.plan/1"', '"shardscope.plan/9"')
    (tmp_path / "newer.json").write_text(newer)
    (tmp_path / "junk.txt").write_text("this is not an HLO module\n")
    (tmp_path / "four.hlo").write_text(FOUR_DEVICES)
    (tmp_path / "headerless.hlo").write_text(FOUR_DEVICES.partition("\n")[2])
    (tmp_path / "twice.hlo").write_text(FOUR_DEVICES + FOUR_DEVICES)
    (tmp_path / "empty").mkdir()
    plan = json.loads((GOLDEN / "default.json").read_text())
    for row in plan["collectives"]:
        row.pop("cause", None)  # as a plan made before causes were recorded
    (tmp_path / "uncaused.json").write_text(json.dumps(plan))
    tensors_only = {key: plan[key] for key in ("case", "provenance", "schema", "tensors")}
    (tmp_path / "tensors_only.json").write_text(
        json.dumps(tensors_only | {"collectives": [], "memory": {}, "parts": ["tensors"]})
    )
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "cases.yaml").write_text("cases:\n  - {model: deepseek-tiny, preset: default}\n")
    (tmp_path / "priced").mkdir()
    (tmp_path / "priced" / "cases.yaml").write_text(
        "hardware: v5q\ncases:\n  - {model: deepseek-tiny, preset: default}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ("generations:\n  v5p: {peak_bf16_flops: 4.59e14}\n", "entry 'v5p' is missing hbm_bytes"),
        ("generations:\n  v5p: [1\n", "malformed YAML at line"),
        ("- v5p\n", "expected a mapping with 'efficiency' and 'generations'"),
    ],
)
def test_a_broken_hardware_table_of_ones_own(table, fragment, workdir, monkeypatch, capsys):
    (workdir / "tpus.yaml").write_text(table)
    monkeypatch.setenv("SHARDSCOPE_HARDWARE_TABLE", str(workdir / "tpus.yaml"))
    monkeypatch.setattr(sys, "argv", ["shardscope", "dump", "deepseek-tiny", "--hardware", "v5p"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "tpus.yaml" in err and len(err.strip().splitlines()) == 1


def test_the_catalogue_is_long():
    assert len(CASES) >= 40


@pytest.mark.parametrize(("args", "fragment"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_wrong_input(args, fragment, workdir, monkeypatch, capsys):
    before = snapshot(workdir)
    monkeypatch.setattr(sys, "argv", ["shardscope", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured.out + captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, captured.err
    assert lines[0].startswith("shardscope: error: "), captured.err
    assert fragment in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert snapshot(workdir) == before


# Outputs the OS refuses, root included: /proc takes no new files (nor directories) from anyone.
REFUSED_OUTPUTS: list[tuple[str, ...]] = [
    ("dump", "deepseek-tiny", "-o", "/proc/plan.json"),
    ("dump", "deepseek-tiny", "-o", "/proc/no/such/dir/plan.json"),
    ("dump", "deepseek-tiny", "--csv", "/proc/tables"),
    ("dump", "--step", "steps_bad.py:raises", "-o", "/proc/plan.json"),
    ("check", "--golden", "golden", "--html", "/proc/report.html"),
    ("check", "--golden", "golden", "--markdown", "/proc/no/such/dir/report.md"),
    ("update", "--golden", "linked"),
    ("diff", "existing.json", "existing.json", "--html", "/proc/report.html"),
    ("diff", "existing.json", "existing.json", "--markdown", "/proc/report.md"),
    ("compare", "deepseek-tiny", "--html", "/proc/compare.html"),
    ("advise", "deepseek-tiny", "--html", "/proc/advice.html"),
    ("advise", "deepseek-tiny", "--csv", "/proc/advice.csv"),
    ("table", "existing.json", "--csv", "/proc/table.csv"),
    ("import-maxtext", "empty", "-o", "/proc/plan.json"),
]
# What plans, compiles or reads before anything is written: none of it may run when an output is refused.
PLANNING = [
    "shardscope.golden.planning.plan_resolved_case",
    "shardscope.golden.pipeline.plan_step_ref",
    "shardscope.golden.pipeline.plan_maxtext_case",
    "shardscope.golden.check.check_goldens",
    "shardscope.golden.check.update_goldens",
    "shardscope.golden.runner.dump_cases",
    "shardscope.advise.sweep.advise",
    "shardscope.diff.plans.diff_plans",
    "shardscope.plan.json.load_plan",
    "shardscope.extract.maxtext_dump.dump_to_plan",
]


@pytest.fixture()
def nothing_planned(monkeypatch):
    """Every planning entry point raises if called (an AssertionError, which no command turns into exit 2)."""

    def planned(*args, **kwargs):
        raise AssertionError("planned before its output was checked")

    for target in PLANNING:
        monkeypatch.setattr(target, planned)


def refused(args: tuple[str, ...], monkeypatch, capsys) -> str:
    """Runs a command that must stop at its output: exit 2 and one line on stderr, which it returns."""
    monkeypatch.setattr(sys, "argv", ["shardscope", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured.out + captured.err
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardscope: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("args", REFUSED_OUTPUTS, ids=" ".join)
def test_a_refused_output_stops_the_command_before_it_plans(args, workdir, nothing_planned, monkeypatch, capsys):
    option, path = args[-2:]
    if args[0] == "update":
        # A golden set whose model's directory is /proc: update would write its golden there.
        (workdir / "linked").mkdir()
        (workdir / "linked" / "cases.yaml").write_text("cases:\n  - {model: deepseek-tiny, preset: default}\n")
        (workdir / "linked" / "deepseek-tiny").symlink_to("/proc")
        option, path = "--golden", "linked/deepseek-tiny/cpu-8/default.json"
    line = refused(args, monkeypatch, capsys)
    assert f" {option} {path}" in line
    assert line.endswith(("(No such file or directory)", "(Permission denied)")), line


def test_an_output_that_is_a_device_is_refused(workdir, nothing_planned, monkeypatch, capsys):
    # Written as a file is (a new file renamed over it), /dev/null would become a file for every process.
    line = refused(("dump", "deepseek-tiny", "-o", "/dev/null"), monkeypatch, capsys)
    assert line == "shardscope: error: -o /dev/null is not a regular file; give a file name (or - for standard output)"
    assert Path("/dev/null").is_char_device()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a directory's permissions (/proc holds the rule)")
@pytest.mark.parametrize("target", ["plan.json", "new/plan.json"])
def test_a_read_only_directory_is_refused_before_planning(target, workdir, nothing_planned, monkeypatch, capsys):
    (workdir / "read-only").mkdir(mode=0o500)
    output = f"read-only/{target}"
    line = refused(("dump", "deepseek-tiny", "-o", output), monkeypatch, capsys)
    assert line == f"shardscope: error: -o {output}: cannot write in read-only (Permission denied)"
    assert list((workdir / "read-only").iterdir()) == []
