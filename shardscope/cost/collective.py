"""Time of one collective on a device group: latency (hops × per-hop cost) plus transfer (bytes over the
links the group's torus dimensions provide), the alpha-beta model of "How to Scale Your Model", Part 3.

`nbytes` follows the plan's convention (`shardscope.hlo`): the full buffer — the all-gather's result, the
reduce-scatter's operand, the all-reduce's array, each device's all-to-all buffer, the permuted buffer.

Per dimension of the group, a device can receive over 2 links if the ring closes through wraparound
links and over 1 otherwise (the end of a line has one neighbour, and bounds the whole collective); an axis
whose neighbours are `stride` chips apart shares those links with `stride` interleaved groups. Hence:

- all-gather / reduce-scatter: (n−1)/n × bytes over the sum of those links; hops: ⌊k/2⌋ per closed ring
  dimension of k members, k−1 per line (the book's T_min·|X|/2 and its 3-hop no-wraparound example).
- all-reduce: a reduce-scatter followed by an all-gather.
- all-to-all: bounded by the bisection (k·bytes / (4·c·W) across the longest dimension, c = 2 with
  wraparound) and by injection ((n−1)/n × bytes over the device's links); on a closed ring this is the
  book's "AllGather / 4".
- collective-permute: the buffer over one link (× |shift| when every device shifts along a ring).
- A group that spans slices runs hierarchically: the ICI part inside each slice, then 1/n of the buffer
  per device over DCN (all-to-all and permute: the share bound to other slices), at the chip's DCN
  bandwidth shared by its devices.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from shardscope.case.hardware import Hardware
from shardscope.cost.layout import CORE, SLICE, Span

PRICED_OPS = (
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
)


@dataclass(frozen=True)
class CollectiveTime:
    """One execution of a collective: fixed latency and transfer time at the modelled link bandwidth."""

    latency: float  # seconds
    transfer: float  # seconds at 100% of the modelled bandwidth

    def seconds(self, efficiency: float) -> float:
        """Latency plus transfer at `efficiency` of the modelled bandwidth."""
        return self.latency + self.transfer / efficiency

    def __add__(self, other: CollectiveTime) -> CollectiveTime:
        return CollectiveTime(self.latency + other.latency, self.transfer + other.transfer)


ZERO = CollectiveTime(0.0, 0.0)


def _link_bandwidth(span: Span, hardware: Hardware) -> float:
    if span.dim == CORE:
        return hardware.chip_link_bandwidth or hardware.ici_link_bandwidth
    return hardware.ici_link_bandwidth


def _links(span: Span) -> float:
    """Incoming links per device usable by one group along this span (shared by interleaved groups)."""
    if span.dim == CORE:
        return 1.0 / span.stride
    return (2.0 if span.closes else 1.0) / span.stride


def _hops(span: Span) -> int:
    return (span.extent // 2 if span.closes else span.extent - 1) * span.stride


def _split(spans: Sequence[Span]) -> tuple[tuple[Span, ...], int]:
    ici = tuple(span for span in spans if span.dim != SLICE and span.extent > 1)
    slices = 1
    for span in spans:
        if span.dim == SLICE:
            slices *= span.extent
    return ici, slices


def _members(spans: Sequence[Span]) -> int:
    count = 1
    for span in spans:
        count *= span.extent
    return count


def _injection(ici: Sequence[Span], hardware: Hardware) -> float:
    return sum(_links(span) * _link_bandwidth(span, hardware) for span in ici)


def _gather(nbytes: float, ici: Sequence[Span], slices: int, hardware: Hardware) -> CollectiveTime:
    """All-gather (and, by symmetry, reduce-scatter) of a `nbytes` full buffer."""
    n = _members(ici)
    time = ZERO
    if n > 1:
        transfer = (n - 1) / n * nbytes / _injection(ici, hardware)
        time += CollectiveTime(sum(_hops(s) for s in ici) * hardware.ici_hop_latency, transfer)
    if slices > 1:
        per_device = nbytes / n
        transfer = (slices - 1) / slices * per_device / hardware.dcn_bandwidth_per_device
        time += CollectiveTime((slices - 1) * hardware.dcn_latency, transfer)
    return time


def _all_to_all(nbytes: float, ici: Sequence[Span], slices: int, hardware: Hardware) -> CollectiveTime:
    n = _members(ici)
    time = ZERO
    if n > 1:
        injection = (n - 1) / n * nbytes / _injection(ici, hardware)
        bisection = max(
            span.extent * span.stride * nbytes / (4 * (2 if span.closes else 1) * _link_bandwidth(span, hardware))
            for span in ici
        )
        time += CollectiveTime(sum(_hops(s) for s in ici) * hardware.ici_hop_latency, max(injection, bisection))
    if slices > 1:
        transfer = (slices - 1) / slices * nbytes / hardware.dcn_bandwidth_per_device
        time += CollectiveTime((slices - 1) * hardware.dcn_latency, transfer)
    return time


def _permute(nbytes: float, ici: Sequence[Span], slices: int, shift: int | None, hardware: Hardware) -> CollectiveTime:
    if slices > 1:
        return CollectiveTime(hardware.dcn_latency, nbytes / hardware.dcn_bandwidth_per_device)
    if len(ici) == 1 and shift:
        span = ici[0]
        steps = abs(shift)
        # A rotation along a line sends its wrapping pair back across the whole line.
        hops = steps if span.closes else max(steps, span.extent - steps)
        transfer = steps * span.stride * nbytes / _link_bandwidth(span, hardware)
        return CollectiveTime(hops * span.stride * hardware.ici_hop_latency, transfer)
    slowest = min(_link_bandwidth(span, hardware) / span.stride for span in ici)
    return CollectiveTime(sum(_hops(s) for s in ici) * hardware.ici_hop_latency, nbytes / slowest)


@functools.lru_cache(maxsize=1 << 16)
def _memoised(op: str, nbytes: float, spans: tuple[Span, ...], hardware: Hardware, shift: int | None) -> CollectiveTime:
    return _collective_time(op, nbytes, spans, hardware, shift)


def collective_time(
    op: str, nbytes: float, spans: Sequence[Span], hardware: Hardware, shift: int | None = None
) -> CollectiveTime:
    """One execution of `op` moving `nbytes` over a group with these spans (`_collective_time`), memoised:
    a search prices the same few (op, bytes, group) thousands of times."""
    return _memoised(op, nbytes, tuple(spans), hardware, shift)


def _collective_time(
    op: str, nbytes: float, spans: Sequence[Span], hardware: Hardware, shift: int | None = None
) -> CollectiveTime:
    """One execution of `op` moving `nbytes` (plan convention) over a group with these spans.

    A group of one device costs nothing. `collective-broadcast` is priced as an all-gather of its
    buffer and `ragged-all-to-all` as an all-to-all of its (padded) buffer: upper bounds.

    Raises:
      ValueError: an op this model does not price (see `PRICED_OPS`).
    """
    if op not in PRICED_OPS:
        raise ValueError(f"no time model for collective {op!r} (priced: {', '.join(PRICED_OPS)})")
    ici, slices = _split(spans)
    if not ici and slices == 1:
        return ZERO
    if op in ("all-gather", "reduce-scatter", "collective-broadcast"):
        return _gather(nbytes, ici, slices, hardware)
    if op == "all-reduce":
        return _gather(nbytes, ici, slices, hardware) + _gather(nbytes, ici, slices, hardware)
    if op in ("all-to-all", "ragged-all-to-all"):
        return _all_to_all(nbytes, ici, slices, hardware)
    return _permute(nbytes, ici, slices, shift, hardware)
