"""verify's rule, piece by piece: what a program's reading says about each output (reductions and float types on
its way, where it is computed), AdamW's elementwise bounds against optax itself, one tensor's check, and the
layouts both sides are compared in."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardscope.case import resolve_case
from shardscope.stages.state import path_of, unplaced_state
from shardscope.stages.train_step import ADAMW, make_optimizer
from shardscope.verify.compare import tensor_check
from shardscope.verify.layout import corresponding_paths, stacked_config, to_case_layout, to_stacked
from shardscope.verify.program import EXACT, Precision, read_program
from shardscope.verify.tolerance import SAFETY, adam_bounds, rounding_tolerance

F32 = float(np.finfo(np.float32).eps)
BF16 = float(jnp.finfo(jnp.bfloat16).eps)


def reading_of(function, *args):
    return read_program(jax.jit(function).trace(*args).jaxpr)


def test_a_matmul_then_a_sum_add_their_reduction_sizes():
    x, w = jnp.ones((4, 16)), jnp.ones((16, 8))
    reading = reading_of(lambda x, w: ((x @ w).sum(axis=1), x @ w, x * 2), x, w)
    summed, product, scaled = reading.precisions
    assert product == Precision(16.0, F32)  # the contracted dimension
    assert summed == Precision(16.0 + 8.0, F32)  # then the 8 columns of each row
    assert scaled == Precision(0.0, F32)  # no sum: nothing a reordering changes


def test_a_bfloat16_value_on_the_way_makes_a_float32_result_as_coarse():
    x = jnp.ones((4, 32))
    (through_bf16, direct) = reading_of(
        lambda x: (x.astype(jnp.bfloat16).astype(jnp.float32).sum(), x.sum()), x
    ).precisions
    assert through_bf16 == Precision(128.0, BF16)
    assert direct == Precision(128.0, F32)


def test_integer_outputs_are_exact():
    (counts,) = reading_of(lambda x: (jnp.argmax(x, axis=1),), jnp.ones((4, 8))).precisions
    assert counts.eps == 0.0 and rounding_tolerance(counts, 10.0) == 0.0


def test_a_scan_counts_its_body_once_per_iteration():
    def run(x, w):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=7)[0]

    (out,) = reading_of(run, jnp.ones((2, 16)), jnp.ones((16, 16))).precisions
    assert out.reduction == 7 * 16


def test_a_psum_counts_the_devices_it_sums_over():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P())
    def total(x):  # each device sums its 2 rows of 8, then the 4 devices' sums are summed
        return jax.lax.psum(x.sum(), "data")

    (out,) = reading_of(total, jnp.ones((8, 8))).precisions
    assert out.reduction == 2 * 8 + 4


def test_inputs_that_carry_rounding_pass_it_on():
    reading = read_program(jax.jit(lambda x: x * 3).trace(jnp.ones(3)).jaxpr, [Precision(50.0, F32)])
    assert reading.precisions[0].reduction == 50.0


def test_outputs_are_placed_where_the_program_computes_them():
    def step(x):
        first = x.sum()
        second = jnp.tanh(x) @ x.T
        return second, x, first

    reading = reading_of(step, jnp.ones((3, 3)))
    second, passed, first = reading.computed_at
    assert first < second
    assert passed == (-1, 0)  # an input handed back is computed nowhere


def test_the_rounding_tolerance_is_the_stated_rule():
    precision = Precision(400.0, F32)
    assert rounding_tolerance(precision, 3.0) == pytest.approx(SAFETY * F32 * 20.0 * 3.0)


def _adamw_step(step, params, grads, mu, nu):
    """One AdamW step by optax from a given state (its count at `step - 1`)."""
    optimizer = make_optimizer()
    state = optimizer.init(params)
    adam = state[0]._replace(count=jnp.asarray(step - 1, jnp.int32), mu=mu, nu=nu)
    updates, new = optimizer.update(grads, (adam, *state[1:]), params)
    return np.asarray(optax.apply_updates(params, updates)), np.asarray(new[0].mu), np.asarray(new[0].nu)


@pytest.mark.parametrize("step", [1, 3])
def test_adamw_bounds_hold_for_every_gradient_within_its_tolerance(step):
    rng = np.random.default_rng(0)
    shape = (256,)
    params = rng.normal(0, 0.05, shape).astype(np.float32)
    # Gradients of every size, some near zero, where AdamW's quotient is most sensitive.
    grads = (rng.normal(0, 1e-3, shape) * rng.choice([1.0, 1e-3, 1e-6], shape)).astype(np.float32)
    mu = (rng.normal(0, 1e-4, shape) if step > 1 else np.zeros(shape)).astype(np.float32)
    nu = (rng.uniform(0, 1e-7, shape) if step > 1 else np.zeros(shape)).astype(np.float32)
    tolerance = 1e-7
    want_p, want_mu, want_nu = _adamw_step(step, params, grads, mu, nu)
    bounds = adam_bounds(step, grads, want_mu, want_nu, tolerance, None, ADAMW)
    for _ in range(20):
        moved = grads + rng.uniform(-tolerance, tolerance, shape).astype(np.float32)
        got_p, got_mu, got_nu = _adamw_step(step, params, moved, mu, nu)
        slack = 4 * F32  # the update's own rounding, which rule 1 covers in a verification
        assert np.all(np.abs(got_mu - want_mu) <= bounds.mu + slack * np.abs(want_mu))
        assert np.all(np.abs(got_nu - want_nu) <= bounds.nu + slack * np.abs(want_nu))
        assert np.all(np.abs(got_p - want_p) <= bounds.param + slack * np.abs(want_p))
    if step == 1:
        # From zero moments the update is the gradient's sign: pinned where the gradient is well above its
        # tolerance, free to flip (2 × learning rate) where it is not.
        large = np.abs(grads) > 1e3 * tolerance
        assert bounds.param[large].max() < 1e-2 * ADAMW.learning_rate < bounds.param[~large].max()


def test_a_check_reports_the_worst_element_against_its_own_tolerance():
    want = np.array([1.0, -2.0, 0.0, 4.0], np.float32)
    got = np.array([1.0, -2.5, 0.1, 4.0], np.float32)
    allowed = np.array([0.1, 1.0, 0.01, 0.1])
    check = tensor_check(1, "x", "output", got, want, allowed)
    assert check.max_abs_error == pytest.approx(0.5)
    assert check.max_rel_error == pytest.approx(0.5 / 4.0)
    assert check.tolerance == pytest.approx(0.01) and check.ratio == pytest.approx(10.0)
    assert check.diverged
    assert not tensor_check(1, "x", "output", want, want, 0.0).diverged


def test_nan_on_one_side_diverges_and_on_both_does_not():
    nan = np.array([np.nan, 1.0], np.float32)
    assert tensor_check(1, "x", "output", nan, np.array([0.0, 1.0], np.float32), 1.0).diverged
    assert not tensor_check(1, "x", "output", nan, nan.copy(), 0.0).diverged


@pytest.mark.parametrize("repeats", ["1", "2"])
def test_pipelined_layout_round_trips_and_maps_every_parameter_to_its_layers(repeats):
    case = resolve_case("deepseek-tiny", "explicit-pipeline", overrides={"pipeline.repeats": repeats})
    assert case.model.pipeline_stages > 1
    stacked, _ = unplaced_state(resolve_case("deepseek-tiny", "default"))
    assert stacked_config(case.model) == stacked_config(resolve_case("deepseek-tiny", "default").model)
    rng = np.random.default_rng(0)
    values = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), stacked["params"])
    laid = to_case_layout(case.model, values)
    back = to_stacked(case.model, laid)
    assert jax.tree.structure(back) == jax.tree.structure(values)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(values), strict=True))
    mapping = corresponding_paths(case.model, stacked_config(case.model), laid)
    stacked_paths = {path_of(p) for p, _ in jax.tree_util.tree_flatten_with_path(values)[0]}
    assert set(mapping) == stacked_paths
    for stacked_path, sources in mapping.items():
        assert sources, stacked_path
        # A stacked leaf's values come from the pipelined leaves of the same parameter, and only from them.
        assert {s.rsplit("/", 1)[-1] for s in sources} == {stacked_path.rsplit("/", 1)[-1]}
        if "pipeline_module" not in " ".join(sources):
            assert sources == (stacked_path,)


def test_exact_precision_is_no_tolerance():
    assert rounding_tolerance(EXACT, 5.0) == 0.0
