"""ZeRO-1's stored shardings, as MaxText's `add_data_to_sharding` (shard_optimizer_over_data) makes them."""

from __future__ import annotations

import pytest

from shardscope.case import resolve_case
from shardscope.errors import ShardscopeError
from shardscope.stages.state import zero1_spec

SIZES = {"data": 2, "fsdp": 4, "tensor": 2, "expert": 2}


@pytest.mark.parametrize(
    ("shape", "spec", "want"),
    [
        # The axis goes first on the first dimension whose shard it divides.
        ((4096, 11008), ("fsdp", None), (("data", "fsdp"), None)),
        # ... skipping a dimension split over `tensor`, and one whose shard it does not divide.
        ((4096, 1024), ("tensor", "fsdp"), ("tensor", ("data", "fsdp"))),
        ((12, 1024), ("fsdp", None), ("fsdp", ("data",))),
        ((3, 5), (None, None), (None, None)),
        # Already split over the axis: unchanged; a shorter spec is padded with unsplit dimensions.
        ((64, 64), (("data", "fsdp"), None), (("data", "fsdp"), None)),
        ((64, 64), (), (("data",), None)),
        # A scalar (Adam's step count) has nothing to split.
        ((), (), ()),
    ],
)
def test_zero1_spec_adds_the_axis_as_maxtext_does(shape, spec, want):
    assert zero1_spec(shape, spec, "data", SIZES) == want


def test_zero1_axis_must_be_a_mesh_axis():
    with pytest.raises(ShardscopeError, match="shard_optimizer_over names a missing mesh axis"):
        resolve_case("llama-tiny", "default", overrides={"shard_optimizer_over": "dta"})


def test_maxtext_key_sets_zero1_over_data():
    from shardscope.case.resolve import resolve_maxtext_case

    case, _ = resolve_maxtext_case(
        "llama-tiny", None, "cpu-8", "ici_data_parallelism=2 ici_fsdp_parallelism=-1 shard_optimizer_over_data=true"
    )
    assert case.preset.shard_optimizer_over == "data"


def test_zero1_spec_skips_what_the_rules_put_on_tensor_at_size_1():
    # MaxText reads the rules' spec before axes of size 1 are dropped (deepseek2-16b's dense wo kernel: its
    # mlp dimension on `tensor`, its single layer indivisible, so `data` joins `fsdp` on embed).
    assert zero1_spec((10944, 1, 2048), (None, None, "fsdp"), "data", SIZES, frozenset({0})) == (
        None,
        None,
        ("data", "fsdp"),
    )
