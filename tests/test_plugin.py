"""The pytest plugin on a project's own jitted function: names of its inputs and outputs, and golden checks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from shardscope.extract.plans import plan_from_compiled


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
