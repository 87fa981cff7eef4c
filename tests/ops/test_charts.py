"""The admin's SVG charts: counts and gauges, gaps where a minute has no figure, and
scale labels where their values are."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ratelimits.ops import charts
from ratelimits.ops.observe import PolicyCounts

SVG = "{http://www.w3.org/2000/svg}"


def _labels(svg: str) -> dict[str, float]:
    """The left scale: each label's text and its height."""
    return {m[2]: float(m[1]) for m in re.finditer(
        r'<text x="\d+" y="([0-9.]+)" font-size="11" text-anchor="end" '
        r'fill="currentColor">([^<]+)</text>', svg)}


def test_a_small_scale_puts_each_label_at_its_own_height():
    svg = charts.line_chart([PolicyCounts(admitted=1), PolicyCounts()], title="t",
                            axis=("a", "b", "c"))
    labels = _labels(svg)
    assert set(labels) == {"0", "0.5", "1"}
    assert labels["0"] > labels["0.5"] > labels["1"]  # SVG's y grows downwards


def test_gauges_leave_a_gap_for_minutes_without_samples_and_give_their_mean():
    minutes = [PolicyCounts(samples=2, latency_us=20_000, limit_sum=6), PolicyCounts(),
               PolicyCounts(samples=1, latency_us=30_000, limit_sum=5),
               PolicyCounts(samples=1, latency_us=50_000, limit_sum=1)]
    svg = charts.line_chart(minutes, title="t", axis=("a", "b", "c"),
                            series=charts.LATENCY_SERIES)
    lines = re.findall(r'<polyline class="rl-latency_ms" points="([^"]+)"', svg)
    assert [len(points.split()) for points in lines] == [1, 2]  # broken by the empty minute
    assert "latency, ms (mean 30.0)" in svg  # 10, 30 and 50 ms, minute by minute
    assert "Scale 0 to 50" in svg


def test_counts_and_samples_add_up_over_minutes():
    total = sum([PolicyCounts(admitted=2, samples=2, latency_us=10, limit_sum=4),
                 PolicyCounts(rejected=1, samples=1, latency_us=20, limit_sum=2)], PolicyCounts())
    assert (total.admitted, total.rejected, total.samples) == (2, 1, 3)
    assert total.mean_limit == 2.0 and total.latency_ms == 0.01
    assert PolicyCounts().latency_ms is None and PolicyCounts().mean_limit is None


def test_equal_rejected_and_would_reject_lines_stay_apart():
    """A shadow policy beside an enforced twin: equal figures, minute by minute. Both
    lines are drawn on the same points, the wider one first so the narrower shows over
    it, each with its own pattern and markers at its own minutes; the legend draws each
    as its line is drawn."""
    minutes = [PolicyCounts(admitted=5, rejected=n, would_reject=n)
               for n in (0, 3, 6, 6, 2, 8, 1, 0, 4, 4) * 3]
    svg = ET.fromstring(charts.line_chart(minutes, title="t", axis=("a", "b", "c")))
    lines = {el.get("class"): el for el in svg.iter(f"{SVG}polyline")}
    rejected, would = lines["rl-rejected"], lines["rl-would_reject"]
    assert rejected.get("points") == would.get("points")  # the same figures, the same line
    assert _look(rejected) != _look(would)
    order = [el.get("class") for el in svg.iter(f"{SVG}polyline")]
    assert order.index("rl-rejected") < order.index("rl-would_reject")  # narrow on top
    assert float(rejected.get("stroke-width")) > float(would.get("stroke-width"))
    # the markers of each sit at minutes of their own (but the last, "now")
    squares = {round(float(el.get("x")) + float(el.get("width")) / 2)
               for el in svg.iter(f"{SVG}rect") if el.get("fill") == rejected.get("stroke")}
    triangles = {round(float(el.get("points").split(",")[0]))
                 for el in svg.iter(f"{SVG}polygon")}
    assert len(squares) >= 3 and len(triangles) >= 3
    assert len(squares & triangles) == 1  # only the last minute, "now"
    # the legend: each name beside a swatch drawn as its line
    keys = {el.get("class"): el for el in svg.iter(f"{SVG}line") if el.get("class")}
    assert _look(keys["rl-key-rejected"]) == _look(rejected)
    assert _look(keys["rl-key-would_reject"]) == _look(would)
    legend = [el.text for el in svg.iter(f"{SVG}text")]
    assert "rejected (102)" in legend and "would reject (shadow) (102)" in legend


def _look(el: ET.Element) -> tuple[str | None, ...]:
    return tuple(el.get(a) for a in ("stroke", "stroke-width", "stroke-dasharray",
                                     "stroke-opacity"))
