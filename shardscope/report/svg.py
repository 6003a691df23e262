"""Small inline SVG pictures for the HTML report: no script, no fonts to fetch, nothing outside the page.

Each function returns SVG markup with every label escaped, which a template places with `|safe`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

# Colours of the report's palette (diff.css): before is the old side's, after the new side's.
BEFORE = "#afb8c1"
AFTER = "#0969da"
CAPACITY = "#a40e26"
# Memory categories, in stacking order, each with its own colour (unknown ones take the last).
CATEGORY_COLOURS = ("#0969da", "#54aeff", "#8250df", "#bf8700", "#1a7f37", "#cf222e", "#57606a")

LABEL_WIDTH = 150
VALUE_WIDTH = 90
BAR_HEIGHT = 12
ROW_GAP = 10
FONT = 'font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="11"'


def _text(x: float, y: float, text: str, anchor: str = "start", fill: str = "#1f2328") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}" {FONT}>{escape(text)}</text>'


def _stacked(
    y: float,
    height: int,
    parts: Sequence[tuple[str, float]],
    span: float,
    top: float,
    colour: dict[str, str],
    label: Callable[[float], str],
    prefix: str = "",
) -> tuple[list[str], float]:
    """One bar of `parts` laid end to end from the label column (each at least half a pixel, empty parts
    skipped), each segment's tooltip "<prefix><part>: <value>"; returns the markup and where the bar ends."""
    out: list[str] = []
    x = float(LABEL_WIDTH)
    for part, value in parts:
        if value <= 0:
            continue
        length = span * value / top
        out.append(
            f'<rect x="{x:.1f}" y="{y}" width="{max(length, 0.5):.1f}" height="{height}" '
            f'fill="{colour[part]}"><title>{escape(prefix)}{escape(part)}: {escape(label(value))}</title></rect>'
        )
        x += length
    return out, x


def paired_bars(
    rows: Sequence[tuple[str, float | None, float | None]], label: Callable[[float], str], width: int = 520
) -> str:
    """Before and after as two bars per row (grey above, blue below), on one linear scale from zero.

    Args:
      rows: (name, before, after); None where a side lacks the row.
      label: how a value reads at the end of its bar ("1.2 ms").
      width: the picture's width in pixels.
    """
    top = max([v for _, b, a in rows for v in (b, a) if v is not None] or [0.0]) or 1.0
    span = width - LABEL_WIDTH - VALUE_WIDTH
    row_height = 2 * BAR_HEIGHT + ROW_GAP
    height = len(rows) * row_height + 22
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" class="chart">'
    ]
    for index, (name, before, after) in enumerate(rows):
        y = index * row_height
        parts.append(_text(LABEL_WIDTH - 8, y + BAR_HEIGHT + 4, name, "end"))
        for offset, value, colour in ((0, before, BEFORE), (BAR_HEIGHT, after, AFTER)):
            if value is None:
                continue
            length = max(1.0, span * value / top) if value > 0 else 0.0
            parts.append(
                f'<rect x="{LABEL_WIDTH}" y="{y + offset}" width="{length:.1f}" height="{BAR_HEIGHT - 1}" '
                f'fill="{colour}"><title>{escape(name)}: {escape(label(value))}</title></rect>'
            )
            parts.append(_text(LABEL_WIDTH + length + 4, y + offset + BAR_HEIGHT - 2, label(value), fill="#59636e"))
    legend_y = len(rows) * row_height + 10
    parts.append(f'<rect x="{LABEL_WIDTH}" y="{legend_y - 8}" width="10" height="10" fill="{BEFORE}"/>')
    parts.append(_text(LABEL_WIDTH + 14, legend_y + 1, "before"))
    parts.append(f'<rect x="{LABEL_WIDTH + 70}" y="{legend_y - 8}" width="10" height="10" fill="{AFTER}"/>')
    parts.append(_text(LABEL_WIDTH + 84, legend_y + 1, "after"))
    parts.append("</svg>")
    return "".join(parts)


def stacked_against_capacity(
    sides: Sequence[tuple[str, Sequence[tuple[str, int]]]],
    capacity: int,
    label: Callable[[float], str],
    width: int = 520,
) -> str:
    """One stacked bar per side (its categories in order) against a capacity line.

    The scale reaches the larger of the capacity and the biggest total, so a need far above capacity
    still shows where capacity ends. A need below a tenth of capacity is drawn on its own scale (at the
    capacity's, its bars would be too thin to see), and the capacity is then written, not drawn.
    """
    totals = [sum(size for _, size in categories) for _, categories in sides]
    biggest = max(totals or [0])
    zoomed = 0 < biggest < capacity / 10
    top = (biggest * 1.25 if zoomed else max([capacity, *totals])) or 1
    span = width - LABEL_WIDTH - VALUE_WIDTH
    row_height = 2 * BAR_HEIGHT + ROW_GAP
    names: list[str] = []
    for _, categories in sides:
        names += [name for name, _ in categories if name not in names]
    colour = {name: CATEGORY_COLOURS[min(i, len(CATEGORY_COLOURS) - 1)] for i, name in enumerate(names)}
    legend_rows = (len(names) + 2) // 3
    height = len(sides) * row_height + 28 + legend_rows * 16
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" class="chart">'
    ]
    for index, ((side, categories), total) in enumerate(zip(sides, totals, strict=True)):
        y = index * row_height + 14
        parts.append(_text(LABEL_WIDTH - 8, y + BAR_HEIGHT + 2, side, "end"))
        bar, x = _stacked(y, 2 * BAR_HEIGHT - 4, categories, span, top, colour, label)
        parts += bar
        parts.append(_text(x + 4, y + BAR_HEIGHT + 2, label(total), fill="#59636e"))
    bottom = len(sides) * row_height + 14
    if zoomed:
        share = f"{biggest / capacity:.2%}" if biggest / capacity >= 0.0001 else "< 0.01%"
        parts.append(
            _text(width - 4, 10, f"capacity {label(capacity)}, off this scale (need ≤ {share} of it)", "end", CAPACITY)
        )
    else:
        cap_x = LABEL_WIDTH + span * capacity / top
        parts.append(
            f'<line x1="{cap_x:.1f}" y1="4" x2="{cap_x:.1f}" y2="{bottom}" stroke="{CAPACITY}" '
            'stroke-width="2" stroke-dasharray="4 3"/>'
        )
        parts.append(_text(cap_x, 10, f"capacity {label(capacity)}", "middle", CAPACITY))
    for index, name in enumerate(names):
        lx = LABEL_WIDTH + (index % 3) * 120
        ly = bottom + 14 + (index // 3) * 16
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour[name]}"/>')
        parts.append(_text(lx + 14, ly, name.replace("_", " ")))
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]], label: Callable[[float], str], width: int = 520
) -> str:
    """One stacked bar per row (its parts in order, e.g. compute then communication), on one linear scale
    from zero, the total at the bar's end, a legend of the parts below."""
    totals = [sum(value for _, value in parts) for _, parts in rows]
    top = max(totals or [0.0]) or 1.0
    span = width - LABEL_WIDTH - VALUE_WIDTH
    row_height = BAR_HEIGHT + ROW_GAP
    names: list[str] = []
    for _, parts in rows:
        names += [name for name, _ in parts if name not in names]
    colour = {name: CATEGORY_COLOURS[min(i, len(CATEGORY_COLOURS) - 1)] for i, name in enumerate(names)}
    height = len(rows) * row_height + 26
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" class="chart">'
    ]
    for index, ((name, parts), total) in enumerate(zip(rows, totals, strict=True)):
        y = index * row_height
        out.append(_text(LABEL_WIDTH - 8, y + BAR_HEIGHT - 2, name, "end"))
        bar, x = _stacked(y, BAR_HEIGHT - 1, parts, span, top, colour, label, f"{name}, ")
        out += bar
        out.append(_text(x + 4, y + BAR_HEIGHT - 2, label(total), fill="#59636e"))
    legend_y = len(rows) * row_height + 14
    for index, part in enumerate(names):
        lx = LABEL_WIDTH + index * 120
        out.append(f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{colour[part]}"/>')
        out.append(_text(lx + 14, legend_y, part))
    out.append("</svg>")
    return "".join(out)
