"""Collective times: the worked examples of "How to Scale Your Model" reproduced, and the properties the
alpha-beta model must keep.

Expected values are computed here from the book's own figures and formulas, not from the model.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from shardscope.case.hardware import load_hardware
from shardscope.cost.collective import PRICED_OPS, collective_time
from shardscope.cost.layout import SLICE, Span, layout_for

V5E = load_hardware("v5e")
V4 = load_hardware("v4")
V5P = load_hardware("v5p")
BF16 = 2


def test_book_pop_quiz_allgather_without_wraparound_on_v5e():
    """Part 3 (sharding), Pop Quiz 2: AllGather_Y([E_Y, F]) on TPU v5e, mesh {'X': 8, 'Y': 4}, E=2048,
    F=8192 in bf16. Y has no wraparound (v5e wraps only axes of 16), so data from one edge crosses 3
    hops: T = 3 * 8.4e6 / 4.5e10 = 560 us (the book); a profile measured 680 us. Latency: 3 hops of 1 us.
    The small case E=F=256 is latency bound: "3 hops ... roughly 3 * 1us = 3us".
    """
    layout = layout_for(V5E, (("X", 8), ("Y", 4)))
    spans = layout.group(["Y"])
    assert [(s.extent, s.closes) for s in spans] == [(4, False)]
    big = collective_time("all-gather", 2048 * 8192 * BF16, spans, V5E)
    shard = 512 * 8192 * BF16  # the book's 8.4e6
    assert big.transfer == pytest.approx(3 * shard / 4.5e10, rel=1e-9)
    assert big.transfer == pytest.approx(560e-6, rel=0.01)
    assert big.latency == pytest.approx(3e-6)
    # The table's default efficiency is this profile's ratio: the estimate lands on the measurement.
    assert big.seconds(V5E.efficiency) == pytest.approx(680e-6, rel=0.02)
    small = collective_time("all-gather", 256 * 256 * BF16, spans, V5E)
    assert small.latency == pytest.approx(3e-6)
    assert small.transfer < small.latency


def test_book_allgather_on_v4_cube_with_wraparound():
    """Part 3, Question 2: TPU v4p 4x4x4, mesh {'X': 4, 'Y': 4, 'Z': 4}, B=1024, D=4096, bf16.
    AllGather_X([B_X, D_Y]) moves 2BD/Y bytes at 9e10 B/s bidirectional: 2*1024*4096 / (9e10*4) = 23 us;
    AllGather_XY moves 2BD over two axes: 2BD / (2 * 9e10) = 46 us, latency 4 hops. The book quotes the
    large-N limit; its summary formula keeps the factor (N-1)/N ("Data volume / bandwidth * (Axis-1)/Axis"),
    which is 3/4 for N=4 and 15/16 for the 16 devices of X*Y.
    """
    layout = layout_for(V4, (("X", 4), ("Y", 4), ("Z", 4)))
    assert all(span.closes for span in layout.group(["X", "Y", "Z"]))
    b, d = 1024, 4096
    one = collective_time("all-gather", 2 * b * d / 4, layout.group(["X"]), V4)
    assert one.transfer == pytest.approx(2 * b * d / (9e10 * 4) * 3 / 4, rel=1e-9)
    assert one.transfer / (3 / 4) == pytest.approx(23e-6, rel=0.02)
    assert one.latency == pytest.approx(2e-6)  # Question 3: "the full gather in only 2 hops"
    two = collective_time("all-gather", 2 * b * d, layout.group(["X", "Y"]), V4)
    assert two.transfer == pytest.approx(2 * b * d / (2 * 9e10) * 15 / 16, rel=1e-9)
    assert two.transfer / (15 / 16) == pytest.approx(46e-6, rel=0.02)
    assert two.latency == pytest.approx(4e-6)


def test_book_allreduce_is_twice_allgather_and_alltoall_a_quarter():
    """Part 3 summary table: AllReduce = 2 * AllGather; AllToAll = AllGather / 4 on a bidirectional ring
    (footnote: each device sends N^2/4 chunks of bytes/N^2 over its two links, i.e. V / (4 W_bidi) with V
    the global array; each device's all-to-all buffer is V/N). On the wrapped 8-ring of a v5p 4x4x8 slice
    the ratio to the all-gather is N/(4(N-1)), which tends to the book's 1/4."""
    layout = layout_for(V5P, (("a", 16), ("b", 8)))  # v5p-256: 4x4x8, all wrapped
    ring = layout.group(["b"])
    assert [(s.extent, s.closes) for s in ring] == [(8, True)]
    n, v = 8, 64e6
    gather = collective_time("all-gather", v, ring, V5P)
    reduce = collective_time("all-reduce", v, ring, V5P)
    a2a = collective_time("all-to-all", v / n, ring, V5P)
    assert reduce.transfer == pytest.approx(2 * gather.transfer)
    assert gather.transfer == pytest.approx(v * (n - 1) / n / (2 * 9e10))
    assert a2a.transfer == pytest.approx(v / (4 * 2 * 9e10))  # book: V / (4 * W_bidi)
    assert a2a.transfer / gather.transfer == pytest.approx(n / (4 * (n - 1)))


def test_collective_permute_over_one_link():
    """Part 2 (tpus), Question 5 sends 1.7e7 bytes at 4.5e10 B/s per link and direction; a neighbour
    permute sends its buffer over one link: 1.7e7 / 4.5e10 = 377 us, 1 hop."""
    layout = layout_for(V5E, (("stage", 4), ("fsdp", 4)))
    time = collective_time("collective-permute", 1.7e7, layout.group(["stage"]), V5E, shift=1)
    assert time.transfer == pytest.approx(1.7e7 / 4.5e10)
    assert time.latency == pytest.approx(3e-6)  # a rotation on a 4-chip line: the wrapping pair crosses it


RING_OPS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@pytest.mark.parametrize("op", RING_OPS)
def test_bandwidth_term_is_linear_in_bytes(op):
    spans = layout_for(V5P, (("fsdp", 16), ("expert", 4))).group(["fsdp"])
    one = collective_time(op, 1e6, spans, V5P, shift=1)
    three = collective_time(op, 3e6, spans, V5P, shift=1)
    assert three.transfer == pytest.approx(3 * one.transfer)
    assert three.latency == one.latency


@pytest.mark.parametrize("op", RING_OPS)
def test_zero_bytes_cost_latency_only(op):
    spans = layout_for(V5P, (("fsdp", 16), ("expert", 4))).group(["fsdp", "expert"])
    time = collective_time(op, 0, spans, V5P, shift=1)
    assert time.transfer == 0 and time.latency > 0
    assert time.seconds(0.5) == time.latency


@pytest.mark.parametrize("op", RING_OPS)
def test_dcn_axis_is_slower_than_the_same_axis_on_ici(op):
    on_ici = [Span("x", 2, 1, 2, False)]
    on_dcn = [Span(SLICE, 2, 1, 2, False)]
    assert collective_time(op, 1e8, on_dcn, V5P).seconds(1) > collective_time(op, 1e8, on_ici, V5P).seconds(1)


@pytest.mark.parametrize("op", ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"))
def test_wraparound_halves_ring_hops_and_transfer(op):
    line = Span("x", 16, 1, 16, False)
    ring = dataclasses.replace(line, wrap=True)
    assert ring.closes and not line.closes
    open_, closed = collective_time(op, 1e8, [line], V5E), collective_time(op, 1e8, [ring], V5E)
    assert closed.transfer == pytest.approx(open_.transfer / 2)
    hops = 16 // 2 if op != "all-reduce" else 16
    assert closed.latency == pytest.approx(hops * V5E.ici_hop_latency)
    assert open_.latency == pytest.approx(2 * 15 / 16 * closed.latency)  # 15 hops (30 for all-reduce)


@pytest.mark.parametrize("op", ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"))
@pytest.mark.parametrize("wrap", (False, True))
def test_a_longer_axis_is_never_cheaper_per_byte(op, wrap):
    """Along one torus dimension of one kind (all lines, or all closed rings), more members never cost
    less per byte: the same bytes per device (a gathered buffer grows as n), over the same links."""
    times = []
    for n in (4, 8, 16) if wrap else (2, 4, 8, 16):
        span = Span("x", n, 1, n, wrap)
        per_device = 1e6
        nbytes = per_device if op == "all-to-all" else per_device * n
        times.append(collective_time(op, nbytes, [span], V5E).seconds(1) / nbytes)
    assert all(later >= earlier * (1 - 1e-12) for earlier, later in itertools.pairwise(times))


def test_all_reduce_is_reduce_scatter_plus_all_gather():
    spans = layout_for(V5P, (("data", 2), ("fsdp", 8), ("expert", 4)), slices=2).group(["data", "fsdp"])
    rs = collective_time("reduce-scatter", 5e7, spans, V5P)
    ag = collective_time("all-gather", 5e7, spans, V5P)
    ar = collective_time("all-reduce", 5e7, spans, V5P)
    assert ar.latency == pytest.approx(rs.latency + ag.latency)
    assert ar.transfer == pytest.approx(rs.transfer + ag.transfer)


def test_a_single_device_group_is_free():
    assert collective_time("all-reduce", 1e9, (), V5P).seconds(1) == 0


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="no time model"):
        collective_time("send", 1, [Span("x", 2, 1, 2, False)], V5P)
    assert "send" not in PRICED_OPS
