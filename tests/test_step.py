"""Programs of one's own: the Python API as a notebook would use it, `dump --step`, step golden cases and the
pytest plugin. Expected rows come from the model's own definition (its parameter shapes and the specs the
test chooses), never from shardscope's output."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from typer.testing import CliRunner

import shardscope
from shardscope.cli import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp_step.py"
F32 = 4


class Tower(nn.Module):
    """A user's model: three dense layers."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256, name="embed")(x))
        x = nn.relu(nn.Dense(256, name="mid")(x))
        return nn.Dense(16, name="head")(x)


MESH_SHAPE = {"data": 4, "model": 2}
SPLIT = {  # the middle layer split over `model` by output columns
    "embed": {"kernel": P(), "bias": P()},
    "mid": {"kernel": P(None, "model"), "bias": P("model")},
    "head": {"kernel": P("model", None), "bias": P()},
}
REPLICATED = {layer: {"kernel": P(), "bias": P()} for layer in SPLIT}


def tower_step(specs):
    """A jitted SGD step of Tower with parameters placed by `specs`, its abstract args and its mesh."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    model = Tower()
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    y = jax.ShapeDtypeStruct((64, 16), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]

    def step(params, x, y):
        grads = jax.grad(lambda p: jnp.mean((model.apply({"params": p}, x) - y) ** 2))(params)
        return optax.apply_updates(params, jax.tree.map(lambda g: -0.1 * g, grads))

    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
    batch = NamedSharding(mesh, P("data"))
    jitted = jax.jit(step, in_shardings=(shardings, batch, batch), out_shardings=shardings)
    return jitted, (params, x, y), mesh, params


def per_device_bytes(shape, spec) -> int:
    split = math.prod(MESH_SHAPE[axis] for axis in spec if axis is not None)
    return math.prod(shape) * F32 // split


@pytest.fixture(scope="module")
def tower_plans():
    plans = {}
    for name, specs in (("split", SPLIT), ("replicated", REPLICATED)):
        step, args, mesh, params = tower_step(specs)
        plans[name] = shardscope.plan_step(step, args, mesh, name=f"tower-{name}")
    return plans, params


def expected_params(params, specs):
    """(path, shape, bytes per device) of every parameter, from the model's own tree and the chosen specs."""
    rows = []
    for layer, leaves in params.items():
        for leaf, value in leaves.items():
            spec = tuple(specs[layer][leaf]) + (None,) * (len(value.shape) - len(specs[layer][leaf]))
            rows.append((f"inputs/0/{layer}/{leaf}", tuple(value.shape), per_device_bytes(value.shape, spec)))
    return sorted(rows)


def test_a_notebook_plans_its_own_model_and_gets_tables(tower_plans):
    plans, params = tower_plans
    tensors = plans["split"].tensors_frame()
    inputs = tensors[tensors["path"].str.startswith("inputs/0/")].sort_values("path")
    got = [(r.path, tuple(r.shape), r.bytes_per_device) for r in inputs.itertuples()]
    assert got == expected_params(params, SPLIT)
    # The batch is split over data: 64 rows / 4.
    batch = tensors.set_index("path").loc["inputs/1"]
    assert batch["shard_shape"] == (16, 32) and batch["sharded_over"] == "(data, -)"

    collectives = plans["split"].collectives_frame()
    data = collectives[collectives["axes"] == "data"]
    # Gradients of parameters replicated over data are summed over data, one per-device copy each.
    gradient_bytes = sum(size for _, _, size in expected_params(params, SPLIT))
    assert data["traffic"].sum() == gradient_bytes
    # The head's input rows are split over model: its output is a partial sum, added over model.
    model = collectives[(collectives["axes"] == "model") & (collectives["pass"] == "forward")]
    assert set(model["op"]) == {"all-reduce"}
    assert model["traffic"].sum() == (64 // MESH_SHAPE["data"]) * 16 * F32


def test_a_notebook_diffs_two_shardings_of_its_model(tower_plans):
    plans, params = tower_plans
    diff = shardscope.diff_plans(plans["replicated"], plans["split"])
    changed = diff.tensor_changes_frame()
    moved = sorted(
        f"{layer}/{leaf}" for layer, leaves in SPLIT.items() for leaf, spec in leaves.items() if tuple(spec) != ()
    )
    assert sorted(p.removeprefix("inputs/0/") for p in changed["path"] if p.startswith("inputs/0/")) == moved
    assert sorted(p.removeprefix("outputs/") for p in changed["path"] if p.startswith("outputs/")) == moved
    by_path = changed.set_index("path")
    for name in moved:
        layer, leaf = name.split("/")
        shape = params[layer][leaf].shape
        assert by_path.loc[f"inputs/0/{name}", "bytes_before"] == math.prod(shape) * F32
        assert by_path.loc[f"inputs/0/{name}", "bytes_after"] == per_device_bytes(shape, tuple(SPLIT[layer][leaf]))
    rows = diff.collective_changes_frame()
    assert "model" in set(rows["axes"])  # the split layer's partial sums are new
    html = shardscope.render_html(diff)
    assert "tower-split" in html and "inputs/<wbr>0/<wbr>mid/<wbr>kernel" in html


def test_dump_step_from_a_file_and_from_a_module_gives_one_plan(tmp_path, monkeypatch):
    runner = CliRunner()
    by_file, by_module = tmp_path / "file.json", tmp_path / "module.json"
    result = runner.invoke(app, ["dump", "--step", f"{EXAMPLE}:make_step", "--name", "mlp", "-o", str(by_file)])
    assert result.exit_code == 0, result.output
    monkeypatch.chdir(ROOT)
    result = runner.invoke(
        app, ["dump", "--step", "examples.mlp_step:make_step", "--name", "mlp", "-o", str(by_module)]
    )
    assert result.exit_code == 0, result.output
    file_plan, module_plan = shardscope.load_plan(by_file), shardscope.load_plan(by_module)
    assert file_plan.tensors == module_plan.tensors and file_plan.collectives == module_plan.collectives
    up = file_plan.tensor_map["inputs/0/up/kernel"]
    assert up.spec == (None, "model") and up.shard_shape == (128, 256)


def test_a_step_is_a_golden_case(tmp_path):
    golden = tmp_path / "golden"
    golden.mkdir()
    shutil.copy(EXAMPLE, golden / "mlp_step.py")
    manifest = golden / "cases.yaml"
    manifest.write_text("cases:\n  - {step: mlp_step.py:make_step, name: mlp}\n")
    runner = CliRunner()
    result = runner.invoke(app, ["update", "--golden", str(golden), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert (golden / "mlp" / "cpu-8" / "step.json").is_file()
    assert runner.invoke(app, ["check", "--golden", str(golden), "--jobs", "1"]).exit_code == 0
    # The same golden name now planned with replicated parameters: the check fails with the change.
    manifest.write_text("cases:\n  - {step: mlp_step.py:make_replicated_step, name: mlp}\n")
    result = runner.invoke(app, ["check", "--golden", str(golden), "--jobs", "1"], terminal_width=200)
    assert result.exit_code == 1
    assert "inputs/0/up/kernel" in result.output


def test_the_pytest_plugin_checks_a_step(tmp_path):
    from shardscope.pytest_plugin import GoldenChecker

    sys_path_example = str(EXAMPLE.parent)
    import sys

    sys.path.insert(0, sys_path_example)
    try:
        import mlp_step  # type: ignore[import-not-found]
    finally:
        sys.path.remove(sys_path_example)
    golden = tmp_path / "mlp.json"
    GoldenChecker(update=True).check_step(mlp_step.make_step, golden)
    GoldenChecker(update=False).check_step(mlp_step.make_step, golden)
    GoldenChecker(update=False).check_step(f"{EXAMPLE}:make_step", golden)
    with pytest.raises(pytest.fail.Exception, match="plan differs"):
        GoldenChecker(update=False).check_step(mlp_step.make_replicated_step, golden)


def test_a_step_whose_state_holds_a_typed_key_and_an_unused_argument():
    """A train state that carries its own RNG (a typed key, as MaxText's NNX state does) and a batch field the
    step never reads (jit drops it from the compiled program) plan as any step: the key's record says what it
    is and how large, and the dropped field is not an input of the program."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    state = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32), "rng": jax.eval_shape(lambda: jax.random.key(0))}
    batch = {"x": jax.ShapeDtypeStruct((16, 64), jnp.float32), "unused": jax.ShapeDtypeStruct((16,), jnp.int32)}

    def step(state, batch):
        rng, _ = jax.random.split(state["rng"])
        return {"w": state["w"] - 0.1 * batch["x"].T @ (batch["x"] @ state["w"]), "rng": rng}

    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    jitted = jax.jit(step, in_shardings=({"w": replicated, "rng": replicated}, {"x": rows, "unused": rows}))
    plan = shardscope.plan_step(jitted, (state, batch), mesh, name="keyed")
    key = plan.tensor_map["inputs/0/rng"]
    key_size = jax.random.key(0).dtype.itemsize  # JAX's own size of one key, not shardscope's
    assert key.dtype == str(state["rng"].dtype) and key.bytes_per_device == key_size
    assert plan.tensor_map["inputs/1/x"].spec == ("data", None)
    assert "inputs/1/unused" not in plan.tensor_map
    assert plan.tensor_map["outputs/rng"].dtype == key.dtype
