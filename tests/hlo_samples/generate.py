"""Regenerates the compiled HLO of the corpus (see README.md) and every module's expected collectives.

Run from the repository root: `python tests/hlo_samples/generate.py [--expected-only] [FILE…]` (all when
none is named; `--expected-only` re-derives the expectations of the files as they are, e.g. hand-written).
Modules are compiled by jax on 8 fake CPU devices and, ahead of time with libtpu, for TPU topologies;
expected counts come from `oracle.py` (XLA's own parser), never from shardscope's reader. The files are
committed; the reader's tests read them without jax (test_hlo_corpus.py also re-derives the expectations).
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)]
from oracle import expected  # noqa: E402

from shardscope.case.topology import get_topology  # noqa: E402
from shardscope.stages.devices import build_mesh  # noqa: E402

HERE = Path(__file__).parent
EMBED, LAYERS = 16, 3


def flax_moe_train_step(mesh: jax.sharding.Mesh | None = None) -> str:
    """A Flax decoder (nn.scan over 3 layers, each a Dense "proj" and a shard_map "moe" with two
    all-to-alls over "expert"), FSDP-sharded weights, value_and_grad and an Adam update.

    Without `mesh`, on 8 fake CPU devices (`fsdp=4, expert=2`); with one (a TPU topology's), compiled
    ahead of time from abstract arguments.
    """
    concrete = mesh is None
    mesh = mesh or jax.make_mesh((4, 2), ("fsdp", "expert"), axis_types=(AxisType.Auto,) * 2)
    fsdp_size = dict(mesh.shape)["fsdp"]

    class MoE(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.lecun_normal(), (2, EMBED, EMBED))

            def experts(x, w):
                y = jax.lax.all_to_all(x, "expert", 0, 0, tiled=True)
                y = jnp.einsum("td,de->te", y, w[0])
                return jax.lax.all_to_all(y, "expert", 0, 0, tiled=True)

            specs = (P(("fsdp", "expert")), P("expert"))
            return jax.shard_map(experts, mesh=mesh, in_specs=specs, out_specs=P(("fsdp", "expert")))(x, w)

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            return x + MoE(name="moe")(nn.Dense(EMBED, name="proj")(x)), None

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, x):
            layers = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=LAYERS)
            return layers(name="layers")(x, None)[0]

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return Decoder(name="decoder")(nn.Dense(EMBED, name="embed")(x))

    model, tx = Model(), optax.adam(1e-3)
    x = jnp.ones((32, EMBED))

    def fsdp(a):
        return NamedSharding(mesh, P(*[None] * (a.ndim - 1), "fsdp") if a.shape[-1] % fsdp_size == 0 else P())

    def train_step(params, opt, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(model.apply(p, x) ** 2))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    step = jax.jit(train_step, donate_argnums=(0, 1))
    if concrete:
        params = model.init(jax.random.key(0), x)
        params = jax.device_put(params, jax.tree.map(fsdp, params))
        opt = tx.init(params)
        x = jax.device_put(x, NamedSharding(mesh, P(("fsdp", "expert"))))
        return step.lower(params, opt, x).compile().as_text()

    def abstract(tree):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=fsdp(a)), tree)

    params = abstract(jax.eval_shape(model.init, jax.random.key(0), x))
    opt = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=fsdp(a) if a.ndim else NamedSharding(mesh, P())),
        jax.eval_shape(tx.init, params),
    )
    batch = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(("fsdp", "expert"))))
    return step.lower(params, opt, batch).compile().as_text()


def shard_map_nested_scan() -> str:
    """Every shard_map collective (all_to_all, psum, all_gather, ppermute on both axes, psum_scatter) in a
    scan of 5 inside a scan of 2, with Explicit mesh axes."""
    mesh = jax.make_mesh((4, 2), ("fsdp", "expert"), axis_types=(AxisType.Explicit,) * 2)

    @partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp", "expert"), out_specs=P("fsdp", "expert"))
    def step(x):
        a = jax.lax.all_to_all(x, "expert", 0, 0, tiled=True)
        b = jax.lax.psum(a, "fsdp")
        c = jax.lax.all_gather(b, "fsdp", tiled=True)[: x.shape[0]]
        d = jax.lax.ppermute(c, "fsdp", [(i, (i + 1) % 4) for i in range(4)])
        d = jax.lax.ppermute(d, "expert", [(0, 1), (1, 0)])
        e = jax.lax.psum_scatter(jnp.concatenate([d, d]), "expert", tiled=True)
        return jax.lax.psum(e, ("fsdp", "expert"))

    def loop(x):
        inner = lambda c, _: (step(c), None)  # noqa: E731
        outer = lambda c, _: (jax.lax.scan(inner, c, None, length=5)[0], None)  # noqa: E731
        return jax.lax.scan(outer, x, None, length=2)[0]

    x = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P("fsdp", "expert")))
    return jax.jit(loop).lower(x).compile().as_text()


def _mesh(topology: str, sizes: dict[str, int], explicit: bool = True) -> jax.sharding.Mesh:
    """A mesh as shardscope builds it (TPU devices in torus order; device id = position in the mesh)."""
    return build_mesh(get_topology(topology), tuple(sizes.items()), explicit=explicit)


def _compile(fn, mesh: jax.sharding.Mesh, *args: tuple[tuple[int, ...], P]) -> str:
    """Compiled HLO text of `fn` on abstract arguments (shape, spec): no TPU needed to compile for one."""
    abstract = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec)) for shape, spec in args]
    with jax.set_mesh(mesh):
        return jax.jit(fn).lower(*abstract).compile().as_text()


def scan_collectives(topology: str, sizes: dict[str, int]) -> str:
    """shard_map collectives (all_to_all; psum of two arrays, one tuple all-reduce; all_gather; ppermute
    along both axes; psum_scatter; psum over both axes) in a scan of 3 inside a scan of 2."""
    mesh = _mesh(topology, sizes)
    ring = [(i, (i + 1) % sizes["fsdp"]) for i in range(sizes["fsdp"])]
    swap = [(i, (i + 1) % sizes["expert"]) for i in range(sizes["expert"])]
    spec = P("fsdp", "expert")

    @partial(jax.shard_map, mesh=mesh, in_specs=(spec, P("fsdp")), out_specs=(spec, P("fsdp")))
    def step(x, y):
        a = jax.lax.all_to_all(x, "expert", 0, 0, tiled=True)
        b, c = jax.lax.psum((a, y), "fsdp")
        g = jax.lax.all_gather(b, "fsdp", tiled=True)[: x.shape[0]]
        d = jax.lax.ppermute(jax.lax.ppermute(g, "fsdp", ring), "expert", swap)
        e = jax.lax.psum_scatter(jnp.concatenate([d, d]), "expert", tiled=True)
        return jax.lax.psum(e, ("fsdp", "expert")) * 0.5, c * 0.5

    def loop(x, y):
        inner = lambda c, _: (step(*c), None)  # noqa: E731
        outer = lambda c, _: (jax.lax.scan(inner, c, None, length=3)[0], None)  # noqa: E731
        return jax.lax.scan(outer, (x, y), None, length=2)[0]

    return _compile(loop, mesh, ((32, 16), spec), ((32, 8), P("fsdp")))


def gpipe_pipeline(topology: str) -> str:
    """A GPipe pipeline in the manner of the explicit-pipeline preset's earlier schedule: 4 stages over
    `stage`, 6 microbatches, each tick a stage's matmul (its weight split over `fsdp`, summed with psum) and a
    ppermute of the activations to the next stage; 9 ticks in a scan, then the outputs summed over `stage`."""
    stages, microbatches, width = 4, 6, 16
    mesh = _mesh(topology, {"stage": stages, "fsdp": 2})

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("stage", "fsdp"), P()), out_specs=P())
    def pipeline(w, xs):
        stage = jax.lax.axis_index("stage")
        rotate = [(i, (i + 1) % stages) for i in range(stages)]

        def tick(carry, t):
            state, out = carry
            x = jnp.where(stage == 0, xs[t % microbatches][:, : width // 2], state)
            y = jnp.tanh(jax.lax.psum(x @ w[0], "fsdp"))[:, : width // 2]
            done = (stage == stages - 1) & (t >= stages - 1)
            out = out.at[(t - stages + 1) % microbatches].add(jnp.where(done, y, 0.0))
            return (jax.lax.ppermute(y, "stage", rotate), out), None

        state = jax.lax.pcast(jnp.zeros((xs.shape[1], width // 2)), ("stage",), to="varying")
        out = jax.lax.pcast(jnp.zeros((microbatches, xs.shape[1], width // 2)), ("stage",), to="varying")
        (_, out), _ = jax.lax.scan(tick, (state, out), jnp.arange(microbatches + stages - 1))
        return jax.lax.psum(out, "stage")

    return _compile(
        pipeline, mesh, ((stages, width // 2 * 2, width), P("stage", "fsdp")), ((microbatches, 4, width), P())
    )


def branch_collectives() -> str:
    """Collectives inside conditionals: lax.switch (branch_computations) and lax.cond (a pred) with
    psum, all_gather and ppermute in different branches, one branch with none."""
    mesh = _mesh("cpu-8", {"fsdp": 4, "expert": 2})

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("fsdp", "expert"), P()), out_specs=P("fsdp", "expert"))
    def f(x, k):
        i = (k[0] > 0).astype(jnp.int32) + (k[0] > 1).astype(jnp.int32)
        x = jax.lax.switch(
            i,
            [
                lambda x: jax.lax.pcast(jax.lax.psum(x, "fsdp"), ("fsdp",), to="varying"),
                lambda x: jax.lax.all_gather(x, "expert", tiled=True)[: x.shape[0]],
                lambda x: x * 2.0,
            ],
            x,
        )
        return jax.lax.cond(k[1] > 0, lambda x: jax.lax.ppermute(x, "expert", [(0, 1), (1, 0)]), lambda x: x, x)

    return _compile(f, mesh, ((16, 8), P("fsdp", "expert")), ((2,), P()))


# (file, mesh, how it is made) of every compiled module of the corpus.
COMPILED = {
    "cpu_scan_collectives.hlo.txt": (
        {"fsdp": 4, "expert": 2},
        lambda: scan_collectives("cpu-8", {"fsdp": 4, "expert": 2}),
    ),
    "tpu7x-8_scan_collectives.hlo.txt": (
        {"fsdp": 4, "expert": 2},
        lambda: scan_collectives("tpu7x-8", {"fsdp": 4, "expert": 2}),
    ),
    "v5p-8_scan_collectives.hlo.txt": (
        {"fsdp": 2, "expert": 2},
        lambda: scan_collectives("v5p-8", {"fsdp": 2, "expert": 2}),
    ),
    "cpu_gpipe_pipeline.hlo.txt": ({"stage": 4, "fsdp": 2}, lambda: gpipe_pipeline("cpu-8")),
    "tpu7x-8_gpipe_pipeline.hlo.txt": ({"stage": 4, "fsdp": 2}, lambda: gpipe_pipeline("tpu7x-8")),
    "cpu_branch_collectives.hlo.txt": ({"fsdp": 4, "expert": 2}, branch_collectives),
    "v5p-8_flax_train_step.hlo.txt": (
        {"fsdp": 2, "expert": 2},
        lambda: flax_moe_train_step(_mesh("v5p-8", {"fsdp": 2, "expert": 2}, explicit=False)),
    ),
}


def write_expected(name: str) -> None:
    """expected/<file>.json: what XLA's parser says the module holds (see oracle.py)."""
    entry = next(e for e in json.loads((HERE / "corpus.json").read_text())["modules"] if e["file"] == name)
    text = (HERE / name).read_text()
    found = expected(text, [tuple(a) for a in entry["mesh"]], entry.get("truncated", False))
    (HERE / "expected").mkdir(exist_ok=True)
    rows = ",\n  ".join(json.dumps(row, sort_keys=True) for row in found["rows"])
    head = {k: v for k, v in found.items() if k != "rows"}
    text = json.dumps(head, sort_keys=True)[:-1] + f', "rows": [\n  {rows}\n ]}}\n'
    assert json.loads(text) == found
    (HERE / "expected" / f"{name}.json").write_text(text)


if __name__ == "__main__":
    wanted = {a for a in sys.argv[1:] if not a.startswith("--")}
    compile_them = "--expected-only" not in sys.argv
    for make in (flax_moe_train_step, shard_map_nested_scan) if compile_them else ():
        if not wanted or f"{make.__name__}.hlo.txt" in wanted:
            (HERE / f"{make.__name__}.hlo.txt").write_text(make())
            print("wrote", HERE / f"{make.__name__}.hlo.txt")
    for name, (_, make) in COMPILED.items() if compile_them else ():
        if not wanted or name in wanted:
            (HERE / name).write_text(make())
            print("wrote", HERE / name)
    for entry in json.loads((HERE / "corpus.json").read_text())["modules"]:
        if not wanted or entry["file"] in wanted:
            write_expected(entry["file"])
            print("expected", entry["file"])
