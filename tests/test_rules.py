"""Logical → physical resolution: exactly Flax's semantics, including the subtle rule orders."""

from __future__ import annotations

import flax.linen as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardscope.case.rules import explain_logical, resolve_logical, shard_shape

LOGICAL = ("batch", "length", "embed", "heads", "exp")
MESH = ("data", "fsdp", "expert", "tensor")


def flax_spec(logical, rules):
    """Flax's own answer, normalised like ours (1-tuples become names, empty becomes None)."""
    spec = nn.logical_to_mesh_axes(logical, [(name, list(axes)) for name, axes in rules])
    result = []
    for entry in spec:
        if isinstance(entry, (list, tuple)):
            entry = tuple(entry)
            entry = None if not entry else entry[0] if len(entry) == 1 else entry
        result.append(entry)
    return tuple(result)


SUBTLE_CASES = [
    # A rule with no mesh axes assigns "replicated" and shadows every later rule for that name.
    ((("embed",)), [("embed", ()), ("embed", ("fsdp",))], (None,)),
    # The first rule's axis is taken by an earlier dimension, so the second rule for the name applies.
    (
        ("batch", "embed"),
        [("batch", ("fsdp",)), ("embed", ("fsdp", "expert")), ("embed", ("expert",))],
        ("fsdp", "expert"),
    ),
    # Rule order decides which dimension gets a contested axis, not dimension order.
    (("batch", "embed"), [("embed", ("fsdp",)), ("batch", ("data", "fsdp"))], (None, "fsdp")),
    # Unnamed dimensions are never assigned.
    ((None, "embed"), [("embed", ("fsdp",))], (None, "fsdp")),
    # A name with no rule is replicated.
    (("heads", "embed"), [("embed", ("fsdp", "expert"))], (None, ("fsdp", "expert"))),
    # MaxText files name one logical axis twice: the first rule whose axes are free wins.
    (("exp", "embed"), [("embed", ("expert",)), ("exp", ("expert",)), ("exp", ("fsdp",))], ("fsdp", "expert")),
]


@pytest.mark.parametrize(("logical", "rules", "expected"), SUBTLE_CASES)
def test_subtle_orders_match_flax(logical, rules, expected):
    assert resolve_logical(logical, rules) == expected
    assert flax_spec(logical, rules) == expected


def test_explanation_names_the_deciding_and_skipped_rules():
    rules = [("batch", ("fsdp",)), ("embed", ("fsdp", "expert")), ("embed", ("expert",))]
    batch, embed = explain_logical(("batch", "embed"), rules)
    assert batch.rule_index == 0 and batch.skipped == ()
    assert embed.rule_index == 2
    assert [(s.rule_index, s.reason) for s in embed.skipped] == [(1, "mesh axis 'fsdp' already used by dimension 0")]
    (shadowed,) = explain_logical(("embed",), [("embed", ()), ("embed", ("fsdp",))])
    assert shadowed.rule_index == 0
    assert shadowed.skipped[0].reason == "dimension already assigned by rule 0"


def test_duplicate_logical_names_are_rejected_like_flax():
    with pytest.raises(ValueError, match="more than once"):
        resolve_logical(("embed", "embed"), [])


rule_strategy = st.lists(
    st.tuples(st.sampled_from(LOGICAL), st.lists(st.sampled_from(MESH), max_size=2, unique=True).map(tuple)),
    max_size=8,
)
logical_strategy = st.lists(st.sampled_from((*LOGICAL, None)), min_size=1, max_size=4).filter(
    lambda names: len([n for n in names if n]) == len({n for n in names if n})
)


@settings(max_examples=300, deadline=None)
@given(logical=logical_strategy, rules=rule_strategy)
def test_random_rule_lists_match_flax(logical, rules):
    assert resolve_logical(tuple(logical), rules) == flax_spec(tuple(logical), rules)


def test_shard_shape_rounds_up_like_padded_shards():
    assert shard_shape((8, 64, 3), ("fsdp", ("fsdp2", "expert"), None), {"fsdp": 4, "fsdp2": 2, "expert": 2}) == (
        2,
        16,
        3,
    )
