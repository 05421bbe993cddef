"""Small dependency-free SVG charts, inlined into the dashboard.

Why hand-written: the dashboard must open with no network and no plotting
library installed, so every chart is a self-contained ``<svg class="chart">``
string.  Each has a ``<title>`` (read by screen readers, shown as a tooltip)
and every mark carries its exact value in a ``<title>`` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 920
FONT = 12
CHAR_W = 7.0
"""Rough width of one character at FONT px, for laying out labels."""
AXIS = "#555"
GRID = "#e3e3e3"


@dataclass(frozen=True)
class Box:
    """Five-number-ish summary drawn by :func:`box_plots` (values in the chart's unit)."""

    low: float
    p25: float
    p50: float
    p75: float
    p99: float
    high: float


def fmt(value: float | None) -> str:
    """A number as an operator reads it: 1234 -> "1234", 12.345 -> "12.3", 0.1234 -> "0.123"."""
    if value is None:
        return "–"
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _attrs(attrs: dict[str, str]) -> str:
    """Keyword arguments as SVG attributes: ``class_`` -> class, ``stroke_width`` ->
    stroke-width."""
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())


def _svg(height: float, title: str, body: list[str]) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="{FONT}">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", **attrs: str) -> str:
    extra = _attrs(attrs)
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, tip: str, **attrs: str) -> str:
    extra = _attrs(attrs)
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" '
        f'fill="{fill}"{extra}><title>{escape(tip)}</title></rect>'
    )


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, **attrs: str) -> str:
    extra = _attrs(attrs)
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{stroke}"{extra}/>')


def _x_axis(left: float, right: float, y: float, top: float, ticks: list[float],
            scale, label: str) -> list[str]:
    out = [_line(left, y, right, y, AXIS)]
    for tick in ticks:
        x = scale(tick)
        out.append(_line(x, top, x, y, GRID))
        out.append(_text(x, y + 15, fmt(tick), "middle"))
    out.append(_text((left + right) / 2, y + 32, label, "middle", fill=AXIS))
    return out


def _label_width(labels: Sequence[str]) -> float:
    return min(max((len(s) for s in labels), default=0) * CHAR_W + 16, 300)


def stacked_bars(title: str, segments: Sequence[str], colors: Sequence[str],
                 rows: Sequence[tuple[str, Sequence[float | None]]], unit: str) -> str:
    """Horizontal bars, one per row, each split into ``segments`` (missing ones count 0)."""
    left = _label_width([label for label, _ in rows])
    right = WIDTH - 70
    legend_h, bar_h, gap = 28, 22, 10
    top = legend_h + 8
    totals = [sum(v or 0 for v in values) for _, values in rows]
    ticks = nice_ticks(max(totals, default=0))
    scale = lambda v: left + (right - left) * v / ticks[-1]  # noqa: E731
    bottom = top + len(rows) * (bar_h + gap)
    body: list[str] = []
    x = left
    for name, color in zip(segments, colors, strict=True):
        body.append(_rect(x, 6, 12, 12, color, name))
        body.append(_text(x + 16, 16, name))
        x += 16 + len(name) * CHAR_W + 18
    body += _x_axis(left, right, bottom, top, ticks, scale, unit)
    for i, ((label, values), total) in enumerate(zip(rows, totals, strict=True)):
        y = top + i * (bar_h + gap) + gap / 2
        body.append(_text(left - 8, y + bar_h * 0.7, label, "end"))
        start = 0.0
        for name, color, value in zip(segments, colors, values, strict=True):
            if value:
                body.append(_rect(scale(start), y, scale(start + value) - scale(start), bar_h,
                                  color, f"{label}: {name} {fmt(value)} {unit}",
                                  class_="segment"))
                start += value
        body.append(_text(scale(total) + 5, y + bar_h * 0.7, fmt(total)))
    return _svg(bottom + 40, title, body)


def histogram(title: str, values: Sequence[float], unit: str, color: str, bins: int = 24) -> str:
    """Counts of ``values`` in equal-width bins from 0."""
    left, right, top, height = 50.0, WIDTH - 20.0, 26.0, 170.0
    bottom = top + height
    edges = nice_ticks(max(values, default=0), bins)
    width = edges[1] - edges[0]
    counts = [0] * (len(edges) - 1)
    for v in values:
        counts[min(int(v // width), len(counts) - 1)] += 1
    x_ticks = nice_ticks(edges[-1], 8)
    y_ticks = nice_ticks(max(counts), 4)
    x_scale = lambda v: left + (right - left) * v / max(edges[-1], x_ticks[-1])  # noqa: E731
    y_scale = lambda c: bottom - height * c / y_ticks[-1]  # noqa: E731
    body = _x_axis(left, right, bottom, top, x_ticks, x_scale, unit)
    for tick in y_ticks:
        body.append(_text(left - 6, y_scale(tick) + 4, fmt(tick), "end"))
    for i, count in enumerate(counts):
        if count:
            x0, x1 = x_scale(i * width), x_scale((i + 1) * width)
            body.append(_rect(x0 + 0.5, y_scale(count), x1 - x0 - 1, bottom - y_scale(count), color,
                              f"{fmt(i * width)}–{fmt((i + 1) * width)} {unit}: {count} rounds",
                              class_="bin"))
    body.append(_text(4, 14, "rounds", fill=AXIS))
    return _svg(bottom + 40, title, body)


def box_plots(title: str, rows: Sequence[tuple[str, Box]], unit: str, color: str) -> str:
    """Horizontal box plots: whiskers min-max, box p25-p75, bar at p50, diamond at p99."""
    left = _label_width([label for label, _ in rows])
    right = WIDTH - 30
    row_h, top = 30, 8
    bottom = top + len(rows) * row_h
    ticks = nice_ticks(max((b.high for _, b in rows), default=0))
    scale = lambda v: left + (right - left) * v / ticks[-1]  # noqa: E731
    body = _x_axis(left, right, bottom, top, ticks, scale, unit)
    for i, (label, b) in enumerate(rows):
        mid = top + i * row_h + row_h / 2
        tip = (f"{label}: min {fmt(b.low)}, p25 {fmt(b.p25)}, p50 {fmt(b.p50)}, "
               f"p75 {fmt(b.p75)}, p99 {fmt(b.p99)}, max {fmt(b.high)} {unit}")
        body.append(_text(left - 8, mid + 4, label, "end"))
        body.append(_line(scale(b.low), mid, scale(b.high), mid, AXIS))
        for end in (b.low, b.high):
            body.append(_line(scale(end), mid - 6, scale(end), mid + 6, AXIS))
        body.append(_rect(scale(b.p25), mid - 9, scale(b.p75) - scale(b.p25), 18, color, tip,
                          class_="box", stroke=AXIS))
        body.append(_line(scale(b.p50), mid - 9, scale(b.p50), mid + 9, "#000", stroke_width="2.5"))
        x99 = scale(b.p99)
        body.append(f'<path d="M{x99:.1f},{mid - 5:.1f} l5,5 l-5,5 l-5,-5 z" fill="#000">'
                    f"<title>{escape(tip)}</title></path>")
    return _svg(bottom + 40, title, body)


def step_chart(title: str, points: Sequence[tuple[float, float]], step_width: float,
               x_label: str, y_label: str, color: str, markers: Sequence[tuple[float, str]],
               levels: Sequence[tuple[float, str]]) -> str:
    """Steps of ``step_width`` starting at each point's x, with vertical ``markers``
    and horizontal ``levels`` (both labelled)."""
    left, right, top, height = 56.0, WIDTH - 20.0, 30.0, 200.0
    bottom = top + height
    xs = [x for x, _ in points] + [x + step_width for x, _ in points] + [x for x, _ in markers]
    x_lo = math.floor(min(xs, default=0.0))
    x_hi = max(math.ceil(max(xs, default=1.0)), x_lo + 1)
    y_ticks = nice_ticks(max([y for _, y in points] + [y for y, _ in levels], default=1), 4)
    x_scale = lambda v: left + (right - left) * (v - x_lo) / (x_hi - x_lo)  # noqa: E731
    y_scale = lambda v: bottom - height * v / y_ticks[-1]  # noqa: E731
    step = nice_ticks(x_hi - x_lo, 10)[1]
    x_ticks = [x_lo + i * step for i in range(int((x_hi - x_lo) / step + 1e-9) + 1)]
    body = _x_axis(left, right, bottom, top, [], x_scale, x_label)
    for tick in x_ticks:
        x = x_scale(tick)
        body.append(_line(x, top, x, bottom, GRID))
        body.append(_text(x, bottom + 15, fmt(tick), "middle"))
    for tick in y_ticks:
        body.append(_line(left, y_scale(tick), right, y_scale(tick), GRID))
        body.append(_text(left - 6, y_scale(tick) + 4, fmt(tick), "end"))
    body.append(_text(left - 50, top - 12, y_label, fill=AXIS))
    for level, name in levels:
        y = y_scale(level)
        body.append(_line(left, y, right, y, "#888", stroke_dasharray="2,3"))
        body.append(_text(right - 4, y - 4, f"{name} {fmt(level)}", "end", fill="#666"))
    path = []
    for x, y in points:
        path.append(f"{'L' if path else 'M'}{x_scale(x):.1f},{y_scale(y):.1f}")
        path.append(f"L{x_scale(x + step_width):.1f},{y_scale(y):.1f}")
    body.append(f'<path class="series" d="{" ".join(path)}" fill="none" stroke="{color}" '
                f'stroke-width="1.8"><title>{escape(title)}</title></path>')
    for i, (x, name) in enumerate(markers):
        xp = x_scale(x)
        body.append(_line(xp, top, xp, bottom, "#333", stroke_dasharray="5,3"))
        body.append(_text(xp + 3, top - 4 - 12 * (i % 2), f"{name} {fmt(x)} s", fill="#333"))
    return _svg(bottom + 40, title, body)
