"""Bytes, seconds and FLOPs as people read them: the one spelling every report and message uses."""

from __future__ import annotations


def human_bytes(count: int | None) -> str:
    """1536 → "1.5 KiB"."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def signed_bytes(count: int) -> str:
    """+1.5 KiB / −512 B / 0 B (a true minus sign, so columns of deltas line up)."""
    if count == 0:
        return "0 B"
    return ("+" if count > 0 else "−") + human_bytes(abs(count))


def compact_bytes(count: int | None) -> str:
    """Three significant digits at most, for narrow columns: 1536 → "1.5 KiB", 1033472 → "1009 KiB"."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_seconds(seconds: float | None) -> str:
    """0.0123 → "12.3 ms"; three significant digits from ns to s."""
    if seconds is None:
        return "?"
    if seconds == 0:
        return "0 s"
    value = abs(seconds)
    sign = "-" if seconds < 0 else ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if value >= scale or unit == "ns":
            scaled = value / scale
            digits = 0 if scaled >= 100 else 1 if scaled >= 10 else 2
            return f"{sign}{scaled:.{digits}f} {unit}"
    raise AssertionError("unreachable")


def signed_seconds(seconds: float) -> str:
    """+0.8 ms / −1.2 s / ±0."""
    if seconds == 0:
        return "±0"
    return ("+" if seconds > 0 else "−") + human_seconds(abs(seconds))


def human_flops(flops: float) -> str:
    """ "5.55 TFLOP", "97.3 MFLOP": three significant digits in the largest unit under the figure."""
    for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"
