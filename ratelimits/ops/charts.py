"""Server-drawn SVG charts of a policy's counts: no JavaScript, no CDN, no colour needed.

Each series has its own line pattern (solid, long dashes, dots), width and marker shape,
the legend repeats them beside the name, and every chart carries a text summary (<title>,
<desc>) for screen readers. Colour only adds to what the patterns already say.

Two series with equal figures draw on the same points, so the wider line goes first and
the narrower on top of it, and each series puts its markers at its own minutes: a shadow
policy's "would reject" stays visible over an enforced twin's "rejected" line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ratelimits.ops.observe import PolicyCounts


@dataclass(frozen=True)
class Series:
    label: str
    attr: str  # the PolicyCounts attribute drawn (None: no figure that minute, a gap)
    dash: str  # stroke-dasharray ("" = solid)
    marker: str  # "circle", "square" or "triangle"
    colour: str
    width: float = 2.0  # stroke width: a wider line is drawn first, under the narrower
    opacity: float = 1.0  # of the line (markers are opaque)
    #: The legend gives the span's total (counts), else the mean of its figures (gauges).
    sums: bool = True

    @property
    def marker_size(self) -> float:
        """Large enough to stand out of the series' own line."""
        return max(3.0, 0.7 * self.width)


SERIES = (
    Series("admitted", "admitted", "", "circle", "#2f6f3e"),
    # a wide pale band: a dotted "would reject" on the same figures shows over it
    Series("rejected", "rejected", "8 4", "square", "#b3261e", width=6.0, opacity=0.45),
    Series("would reject (shadow)", "would_reject", "2 3", "triangle", "#6b4400"),
)
#: An adaptive policy's figures: the limit its processes learnt, the latency it saw.
LIMIT_SERIES = (Series("limit learnt, per process", "mean_limit", "", "circle", "#1f4e79",
                       sums=False),)
LATENCY_SERIES = (Series("latency, ms", "latency_ms", "8 4", "square", "#8a5a00",
                         sums=False),)


def _nice_max(value: int) -> int:
    """The smallest of 1, 2, 5 × 10^k at or above `value` (at least 1)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def _marker(kind: str, x: float, y: float, colour: str, size: float = 3.0) -> str:
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size:.1f}" fill="{colour}"/>'
    if kind == "square":
        s = size * 1.8
        return (
            f'<rect x="{x - s / 2:.1f}" y="{y - s / 2:.1f}" width="{s:.1f}" height="{s:.1f}" '
            f'fill="{colour}"/>'
        )
    s = size * 1.3
    return (
        f'<polygon points="{x:.1f},{y - s:.1f} {x - s:.1f},{y + s:.1f} {x + s:.1f},{y + s:.1f}" '
        f'fill="{colour}"/>'
    )


def line_chart(
    counts: Sequence[PolicyCounts],
    *,
    title: str,
    axis: tuple[str, str, str],
    width: int = 720,
    height: int = 220,
    markers_every: int = 10,
    series: Sequence[Series] = SERIES,
) -> str:
    """A line per series over `counts` (oldest first); `axis` labels left, middle, right."""
    left, right, top, bottom = 48, 16, 16, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(1, len(counts))
    values = {s.attr: [getattr(c, s.attr) for c in counts] for s in series}
    highest = max((v for vs in values.values() for v in vs if v is not None), default=0)
    top_value = _nice_max(math.ceil(highest))
    legend = {s.label: _summary(s, values[s.attr]) for s in series}
    summary = "; ".join(f"{label}: {text}" for label, text in legend.items())

    def x(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h - plot_h * v / top_value

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rl-chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px">',
        f"<title>{escape(title)}</title>",
        f"<desc>Over the span: {escape(summary)}. Scale 0 to {top_value:,}.</desc>",
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999" stroke-width="1"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        value = top_value * frac
        yy = y(value)
        parts.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" '
            'stroke="#ddd" stroke-width="1"/>'
        )
        label = f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
        parts.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="currentColor">{label}</text>'
        )
    for anchor, xx, text in (
        ("start", left, axis[0]),
        ("middle", left + plot_w / 2, axis[1]),
        ("end", left + plot_w, axis[2]),
    ):
        parts.append(
            f'<text x="{xx:.1f}" y="{top + plot_h + 16}" font-size="11" '
            f'text-anchor="{anchor}" fill="currentColor">{escape(text)}</text>'
        )
    step = max(1, markers_every)
    last = len(counts) - 1
    # widest first: a narrower line on equal figures is drawn over it, never under it
    drawn = sorted(enumerate(series), key=lambda item: -item[1].width)
    for rank, s in drawn:
        for run in _runs(values[s.attr]):  # a minute without a figure leaves a gap
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            parts.append(f'<polyline class="rl-{s.attr}" points="{points}" fill="none" '
                         f'{_stroke(s)}/>')
        # each series marks its own minutes, so equal lines' markers sit side by side
        phase = rank * step // max(1, len(series))
        for i, v in enumerate(values[s.attr]):
            if v is not None and ((i - phase) % step == 0 or i == last):
                parts.append(_marker(s.marker, x(i), y(v), s.colour, s.marker_size))
    # the legend: pattern swatch, marker and name, with the span's total or mean
    lx, ly = left, height - 14
    for s in series:
        parts.append(
            f'<line class="rl-key-{s.attr}" x1="{lx}" y1="{ly - 4}" x2="{lx + 28}" '
            f'y2="{ly - 4}" {_stroke(s)}/>'
        )
        parts.append(_marker(s.marker, lx + 14, ly - 4, s.colour, s.marker_size))
        label = f"{s.label} ({legend[s.label]})"
        parts.append(
            f'<text x="{lx + 34}" y="{ly}" font-size="12" fill="currentColor">'
            f"{escape(label)}</text>"
        )
        lx += 40 + 7 * len(label)
    parts.append("</svg>")
    return "".join(parts)


def _stroke(series: Series) -> str:
    """The stroke attributes of a series' line, the same in the plot and the legend."""
    dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
    faded = f' stroke-opacity="{series.opacity:g}"' if series.opacity < 1 else ""
    return f'stroke="{series.colour}" stroke-width="{series.width:g}"{dash}{faded}'


def _summary(series: Series, values: Sequence[float | None]) -> str:
    """The legend's figure: the span's total, or the mean of the minutes with one."""
    present = [v for v in values if v is not None]
    if series.sums:
        return f"{sum(present):,}"
    return f"mean {sum(present) / len(present):,.1f}" if present else "no samples"


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The runs of consecutive figures, each as (index, value) pairs."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((i, v))
    return [run for run in runs if run]


def sparkline(counts: Sequence[PolicyCounts], *, width: int = 160, height: int = 28) -> str:
    """Admitted (solid) and refused or would-be refused (dashed) in a small inline SVG."""
    n = max(1, len(counts))
    top_value = max(1, max((max(c.admitted, c.refused) for c in counts), default=0))
    admitted = sum(c.admitted for c in counts)
    refused = sum(c.refused for c in counts)

    def points(values: Sequence[int]) -> str:
        return " ".join(
            f"{(width - 2) * i / max(1, n - 1) + 1:.1f},"
            f"{height - 2 - (height - 4) * v / top_value:.1f}"
            for i, v in enumerate(values)
        )

    label = f"admitted {admitted:,}, refused or would refuse {refused:,}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rl-spark" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"<title>{escape(label)}</title>"
        f'<polyline points="{points([c.admitted for c in counts])}" fill="none" '
        f'stroke="{SERIES[0].colour}" stroke-width="1.5"/>'
        f'<polyline points="{points([c.refused for c in counts])}" fill="none" '
        f'stroke="{SERIES[1].colour}" stroke-width="1.5" stroke-dasharray="4 2"/>'
        "</svg>"
    )
