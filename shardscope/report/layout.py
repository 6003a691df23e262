"""Terminal tables that fit the terminal: a table built for the width it gets, columns shared out by weight,
and a spec as a PartitionSpec reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table

from shardscope.case.rules import SpecEntry


class FitToWidth:
    """A table built for the width it is rendered in: column minimums scale with the terminal, so long
    paths fold inside their cells on a narrow terminal and no row runs past its edge."""

    def __init__(self, build: Callable[[int], Table]) -> None:
        self._build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._build(options.max_width)


def column_widths(width: int, fixed: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, int]:
    """Exact column widths for a table of `width` cells (no edge, one cell of padding each side, one
    separator between columns): `fixed` columns get their width, the rest shares what is left."""
    columns = len(fixed) + len(shares)
    left = width - sum(fixed.values()) - 3 * columns + 1
    total = sum(shares.values())
    flexible = {name: max(6, int(left * share / total)) for name, share in shares.items()}
    return dict(fixed) | flexible


def elide_middle(path: str, width: int) -> str:
    """A path that fits `width` cells: whole segments around "…", the end first (the tensor's own name and
    the modules just above it tell tensors apart), then the start; never a word broken. A path that fits is
    unchanged.

    >>> elide_middle("params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0", 32)
    'params/decoder/…/MoeBlock_0/wi_0'
    """
    if len(path) <= width or width < 8:
        return path
    parts = path.split("/")
    tail = [parts[-1]]
    right = len(parts) - 2
    while right >= 1 and len("/".join(["…", parts[right], *tail])) <= width:
        tail.insert(0, parts[right])
        right -= 1
    head: list[str] = []
    left = 0
    while left <= right and len("/".join([*head, parts[left], "…", *tail])) <= width:
        head.append(parts[left])
        left += 1
    text = "/".join([*head, "…", *tail])
    if len(text) <= width:
        return text
    keep = width - 1  # a last segment longer than the cell: its characters from both ends
    return path[: keep // 2] + "…" + path[len(path) - (keep - keep // 2) :]


def spec_text(spec: Sequence[SpecEntry]) -> str:
    """A spec as users read PartitionSpecs: P(('data', 'fsdp'), 'expert', None)."""
    parts = []
    for entry in spec:
        if isinstance(entry, tuple):
            parts.append("(" + ", ".join(repr(a) for a in entry) + ")")
        else:
            parts.append(repr(entry))
    return "P(" + ", ".join(parts) + ")"
