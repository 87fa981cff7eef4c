"""Section 11: adaptive concurrency in front of a service that slows down as it fills up.

    .venv/bin/python bench/adaptive.py [--quick]

The runs of tests/pipeline/test_adaptive_servers.py, longer and written down: the service
of `bench/closed_loop.py` (50 ms per request in flight) under 40 closed-loop clients that
honour Retry-After, on one uvicorn process (an async view) and on one gunicorn process
with 64 threads (a blocking view), each with a private SQLite database and the run's
Redis. Per server: one client alone (the unloaded latency), 40 without a limit, 40 under
each fixed limit of a sweep (an adaptive policy whose floor is its maximum: the same
code path, a number that never moves), and 40 under an adaptive policy of 1 to 40. A
full run draws the curves into docs/img/adaptive.svg.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable
from html import escape
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.closed_loop import SWEEP, UNIT, Comparison, Load, compare
from bench.common import Check, Section, table
from tests.support.workers import Site

SVG = Path(__file__).resolve().parent.parent / "docs" / "img" / "adaptive.svg"
SERVERS = (("uvicorn", "/abusy/"), ("gunicorn", "/busy/"))


def _run_server(kind: str, path: str, seconds: float, sweep: tuple[int, ...]) -> Comparison:
    with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
        site = Site(Path(tmp), common.OURS_URL)
        try:
            if kind == "uvicorn":
                site.start_asgi()
            else:
                site.start(1, threads=64)
            return compare(site.port, path, site.only_policy_on(path), seconds=seconds,
                           sweep=sweep)
        finally:
            site.stop()


def _rows(kind: str, result: Comparison) -> list[list[str]]:
    runs: list[tuple[str, Load]] = [
        ("1 client, no limit (unloaded)", result.unloaded),
        ("40 clients, no limit", result.unlimited),
        *((f"40 clients, fixed limit {k}", load) for k, load in result.fixed.items()),
        ("40 clients, adaptive 1-40", result.adaptive),
    ]
    return [[kind, label, f"{load.throughput:.1f}", f"{1000 * load.p50:.1f}",
             f"{1000 * load.p95:.1f}", f"{load.refused / load.seconds:.1f}"]
            for label, load in runs]


def run(quick: bool = False) -> Section:
    seconds, sweep = (1.5, (1, 4, 40)) if quick else (5.0, SWEEP)
    section = Section("11. Adaptive concurrency: latency and throughput under 40 clients")
    common.flush(common.OURS_DB)
    results = {kind: _run_server(kind, path, seconds, sweep) for kind, path in SERVERS}
    common.flush(common.OURS_DB)
    section.add(
        f"A service taking {1000 * UNIT:g} ms per request in flight (`bench/closed_loop.py`), "
        "40 closed-loop clients that wait about `Retry-After` when refused (at most 1 s, "
        "jittered by ±50%), "
        f"{seconds:g} s measured after 1 s of warm-up (3 s for the adaptive run), counted "
        "by the time each request ended. uvicorn: one process, an async view; gunicorn: "
        "one process, `-k gthread --threads 64`, a blocking view. A fixed limit k is an "
        "adaptive policy whose floor is its maximum, k. The same runs, shorter, are "
        "`tests/pipeline/test_adaptive_servers.py`."
    )
    rows = [row for kind, result in results.items() for row in _rows(kind, result)]
    section.add(table(["server", "run", "admitted/s", "p50 ms", "p95 ms", "refused/s"],
                      rows, "llrrrr"))
    for kind, result in results.items():
        best_k, best = result.best_fixed
        p95_ratio = result.adaptive.p95 / result.unloaded.p50
        throughput_ratio = result.adaptive.throughput / best.throughput
        section.checks += [
            Check(f"{kind}: adaptive p95 vs the unloaded latency (p50 alone)", p95_ratio,
                  "≤ 3×", p95_ratio <= 3),
            Check(f"{kind}: adaptive throughput vs the best fixed limit ({best_k})",
                  throughput_ratio, "≥ 0.8×", throughput_ratio >= 0.8),
            Check(f"{kind}: p95 without a limit vs the unloaded latency",
                  result.unlimited.p95 / result.unloaded.p50, "reference", True),
        ]
    if not quick:
        SVG.write_text(chart(results), encoding="utf-8")
        section.add(f"![Throughput and p95 latency per fixed limit, adaptive dashed]"
                    f"(img/{SVG.name})")
    return section


# -- the chart -----------------------------------------------------------------------------

_COLOURS = {"uvicorn": ("#1f4e79", "circle"), "gunicorn": ("#8a5a00", "square")}


def chart(results: dict[str, Comparison]) -> str:
    """Two panels over the fixed limits of the sweep (log scale): admitted requests a
    second, and p95 latency (log scale); each server's sweep solid, its adaptive run a
    dashed level, its unloaded latency × 3 dotted."""
    width, height, gap = 860, 330, 60
    panel_w = (width - 2 * 60 - gap) // 2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" style="max-width:{width}px" font-family="sans-serif" role="img">',
        "<title>Adaptive concurrency: throughput and p95 latency per fixed limit</title>",
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    parts += _panel(results, 60, panel_w, "admitted requests / s",
                    lambda load: load.throughput, log_y=False)
    parts += _panel(results, 60 + panel_w + gap, panel_w, "p95 latency, ms (log)",
                    lambda load: 1000 * load.p95, log_y=True)
    lx, ly = 60, height - 22
    for kind in results:
        colour, marker = _COLOURS[kind]
        for dash, label in (("", f"{kind}: fixed limits"), ("8 4", f"{kind}: adaptive"),
                            ("2 3", f"{kind}: 3 × unloaded latency")):
            style = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly - 4}" y2="{ly - 4}" '
                         f'stroke="{colour}" stroke-width="2"{style}/>')
            if not dash:
                parts.append(_marker(marker, lx + 12, ly - 4, colour))
            parts.append(f'<text x="{lx + 30}" y="{ly}" font-size="11">{escape(label)}</text>')
            lx += 40 + 6 * len(label)
        lx, ly = 60, ly + 16
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(results: dict[str, Comparison], left: int, panel_w: int, title: str,
           value: Callable[[Load], float], *, log_y: bool) -> list[str]:
    """One panel: each server's sweep, its adaptive level, on the latency panel its
    bound of 3 × the unloaded latency."""
    top, plot_h = 40, 210
    ks = sorted({k for r in results.values() for k in r.fixed})
    lo, hi = math.log(ks[0]), math.log(ks[-1])
    figures = [value(load) for r in results.values()
               for load in (*r.fixed.values(), r.adaptive, r.unlimited)]
    if log_y:
        figures += [3000 * r.unloaded.p50 for r in results.values()]
    y_lo = min(figures) / 1.3 if log_y else 0.0
    y_hi = max(figures) * 1.15
    scale = math.log if log_y else float

    def x(k: float) -> float:
        return left + panel_w * (math.log(k) - lo) / ((hi - lo) or 1.0)

    def y(v: float) -> float:
        return top + plot_h * (1 - (scale(v) - scale(y_lo)) / (scale(y_hi) - scale(y_lo)))

    parts = [
        f'<rect x="{left}" y="{top}" width="{panel_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/>',
        f'<text x="{left + panel_w / 2}" y="{top - 12}" font-size="13" '
        f'text-anchor="middle">{escape(title)}</text>',
        f'<text x="{left + panel_w / 2}" y="{top + plot_h + 34}" font-size="11" '
        'text-anchor="middle">fixed limit (requests in flight, log scale)</text>',
    ]
    parts += [f'<text x="{x(k):.1f}" y="{top + plot_h + 16}" font-size="11" '
              f'text-anchor="middle">{k}</text>' for k in ks]
    for tick in _ticks(y_lo, y_hi, log_y):
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" '
                     f'text-anchor="end">{tick:g}</text>')
        parts.append(f'<line x1="{left}" x2="{left + panel_w}" y1="{y(tick):.1f}" '
                     f'y2="{y(tick):.1f}" stroke="#eee"/>')
    for kind, result in results.items():
        colour, marker = _COLOURS[kind]
        points = " ".join(f"{x(k):.1f},{y(value(load)):.1f}"
                          for k, load in sorted(result.fixed.items()))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                     'stroke-width="2"/>')
        parts += [_marker(marker, x(k), y(value(load)), colour)
                  for k, load in result.fixed.items()]
        levels = [(value(result.adaptive), "8 4", 2)]
        if log_y:
            levels.append((3000 * result.unloaded.p50, "2 3", 1))
        for level, dash, stroke in levels:
            parts.append(f'<line x1="{left}" x2="{left + panel_w}" y1="{y(level):.1f}" '
                         f'y2="{y(level):.1f}" stroke="{colour}" stroke-width="{stroke}" '
                         f'stroke-dasharray="{dash}"/>')
    return parts


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [m * 10 ** e for e in range(math.floor(math.log10(lo)),
                                           math.ceil(math.log10(hi)) + 1)
                for m in (1, 2, 5) if lo <= m * 10 ** e <= hi]
    step = 10 ** math.floor(math.log10(max(hi, 1e-9)))
    step = step / 2 if hi / step < 4 else step
    return [i * step for i in range(int(hi // step) + 1)]


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>'
    return (f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" '
            f'fill="{colour}"/>')


if __name__ == "__main__":
    common.run_section(run)
