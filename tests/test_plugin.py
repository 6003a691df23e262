"""The pytest plugin on a project's own jitted function: names of its inputs and outputs, and golden checks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from shardscope.extract.plans import plan_from_compiled

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mesh():
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    return jax.sharding.Mesh(devices, ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def compiled_step(mesh):
    """A step returning (params, grads) with the same keys, and a scalar."""

    def step(params, x):
        def loss(p):
            return jnp.sum((x @ p["w"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return params, grads, value

    w = NamedSharding(mesh, PartitionSpec("fsdp", "tensor"))
    x = NamedSharding(mesh, PartitionSpec("fsdp", None))
    args = ({"w": jax.ShapeDtypeStruct((16, 8), jnp.float32)}, jax.ShapeDtypeStruct((8, 16), jnp.float32))
    return jax.jit(step, in_shardings=({"w": w}, x)).lower(*args).compile()


def test_outputs_keep_their_tuple_index_and_a_scalar_is_named(mesh):
    plan = plan_from_compiled(compiled_step(mesh), mesh, "step")
    outputs = {path: t for path, t in plan.tensors if t.kind == "output"}
    # Three outputs: params["w"], grads["w"] and the loss, each under its own name.
    assert sorted(outputs) == ["outputs/0/w", "outputs/1/w", "outputs/2"]
    assert outputs["outputs/2"].shape == ()
    inputs = {path for path, t in plan.tensors if t.kind == "input"}
    assert inputs == {"inputs/0/w", "inputs/1"}
    assert plan.tensor_map["inputs/0/w"].spec == ("fsdp", "tensor")


def test_check_compiled_writes_then_passes_then_fails_on_a_change(mesh, tmp_path):
    from shardscope.golden.store import load_golden, write_golden
    from shardscope.pytest_plugin import GoldenChecker

    golden = tmp_path / "step.json"
    compiled = compiled_step(mesh)
    GoldenChecker(update=True).check_compiled(compiled, mesh, golden)
    GoldenChecker(update=False).check_compiled(compiled, mesh, golden)
    # The golden says w was placed differently: the check fails with the change.
    plan = load_golden(golden)
    tensors = dict(plan.tensors)
    tensors["inputs/0/w"] = dataclasses.replace(tensors["inputs/0/w"], spec=("fsdp", None))
    write_golden(golden, dataclasses.replace(plan, tensors=tuple(sorted(tensors.items()))))
    with pytest.raises(pytest.fail.Exception, match="differs from golden"):
        GoldenChecker(update=False).check_compiled(compiled, mesh, golden)


def test_check_methods_take_str_paths(mesh, tmp_path):
    from shardscope.golden.store import load_golden
    from shardscope.pytest_plugin import GoldenChecker

    compiled = compiled_step(mesh)
    golden = tmp_path / "goldens" / "step.json"
    GoldenChecker(update=True).check_compiled(compiled, mesh, str(golden))
    plan = load_golden(golden)
    assert plan.case.model == "step"  # the name comes from the str path's stem
    GoldenChecker(update=False).check_compiled(compiled, mesh, str(golden))
    GoldenChecker(update=False).check_plan(plan, str(golden))

    def make_step(devices):
        step_mesh = jax.sharding.Mesh(
            np.array(devices).reshape(4, 2), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        w = NamedSharding(step_mesh, PartitionSpec("fsdp", "tensor"))
        step = jax.jit(lambda p: {"w": p["w"] * 2}, in_shardings=({"w": w},), out_shardings={"w": w})
        return step, ({"w": jax.ShapeDtypeStruct((16, 8), jnp.float32)},), step_mesh

    step_golden = str(tmp_path / "own.json")
    GoldenChecker(update=True).check_step(make_step, step_golden)
    GoldenChecker(update=False).check_step(make_step, step_golden)
    assert load_golden(tmp_path / "own.json").tensor_map["inputs/0/w"].spec == ("fsdp", "tensor")
    with pytest.raises(pytest.fail.Exception, match="is missing"):
        GoldenChecker(update=False).check_plan(plan, str(tmp_path / "absent.json"))


# What each run's environment holds before the plugin, its pytest.ini lines and command-line options, the conftest
# (None: none), and the test it runs: each asserts what the plugin did, from inside the session.
DEVICE_RUNS = {
    "option": (
        {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"},
        "",
        ["--shardscope-devices", "4"],
        None,
        "assert len(jax.devices()) == 4 and jax.devices()[0].platform == 'cpu'\n"
        "    assert os.environ['JAX_PLATFORMS'] == 'cpu'\n"
        "    assert os.environ['XLA_FLAGS'] == "
        "'--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4'",
    ),
    "ini": ({}, "shardscope_devices = 2", [], None, "assert len(jax.devices()) == 2"),
    # Not asked: JAX is left as the environment has it (a GPU or TPU project's tests keep their devices).
    "not-asked": (
        {},
        "",
        [],
        None,
        "assert 'XLA_FLAGS' not in os.environ\n    assert 'JAX_PLATFORMS' not in os.environ",
    ),
    "option-over-ini-and-env": (
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        "shardscope_devices = 6",
        ["--shardscope-devices", "3"],
        None,
        "assert len(jax.devices()) == 3\n"
        "    assert os.environ['XLA_FLAGS'] == '--xla_force_host_platform_device_count=3'",
    ),
    "env-count-kept": (
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=5"},
        "",
        [],
        None,
        "assert os.environ['XLA_FLAGS'] == '--xla_force_host_platform_device_count=5'\n"
        "    assert 'JAX_PLATFORMS' not in os.environ",
    ),
    # JAX imported by a conftest before the plugin it registers: configured directly.
    "conftest-imports-jax": (
        {},
        "",
        ["--shardscope-devices", "5"],
        "import jax\n\npytest_plugins = ['shardscope.pytest_plugin']\n",
        "assert len(jax.devices()) == 5",
    ),
    # Zero leaves everything alone; a JAX_PLATFORMS of one's own is kept (these never start JAX).
    "zero": (
        {},
        "",
        ["--shardscope-devices", "0"],
        None,
        "assert 'XLA_FLAGS' not in os.environ\n    assert 'JAX_PLATFORMS' not in os.environ",
    ),
    "own-platforms": ({"JAX_PLATFORMS": ""}, "", [], None, "assert os.environ['JAX_PLATFORMS'] == ''"),
}


@pytest.mark.parametrize("run", DEVICE_RUNS)
def test_the_plugin_sets_up_the_devices_before_jax_starts(run, tmp_path):
    env_before, ini, options, conftest, check = DEVICE_RUNS[run]
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_devices.py").write_text(f"import os\n\nimport jax\n\n\ndef test_devices():\n    {check}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES")}
    env |= env_before | {"PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    plugin = [] if conftest is not None else ["-p", "shardscope.pytest_plugin"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *options, "test_devices.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
