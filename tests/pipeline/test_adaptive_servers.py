"""An adaptive policy in front of a service that slows down as it fills up (50 ms per
request in flight, `bench/closed_loop.py`), under 40 closed-loop clients, on a real ASGI
server (uvicorn) and a real WSGI server (gunicorn, threaded): it learns a limit, so it
refuses part of the crowd at once and the latency of the rest stays far below the
whole crowd's, which is what the service gives without a limit.

How near the unloaded latency it stays, and how near the best fixed limit's throughput,
are figures, measured by `bench/adaptive.py` (docs/benchmarks.md §11) beside a sweep of
fixed limits, not asserted here: on a shared machine they move with the neighbours."""

from __future__ import annotations

import pytest

from bench.closed_loop import Comparison, compare
from tests.support.workers import Site


def report(name: str, result: Comparison) -> str:
    rows = [("unloaded (1 client)", result.unloaded), ("no limit", result.unlimited),
            *((f"fixed {k}", load) for k, load in result.fixed.items()),
            ("adaptive", result.adaptive)]
    return "\n".join([f"{name}: run, admitted/s, p50 ms, p95 ms, refused"] + [
        f"  {label:20} {load.throughput:7.1f} {1000 * load.p50:7.1f} {1000 * load.p95:8.1f}"
        f" {load.refused:6d}" for label, load in rows])


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_adaptive_keeps_latency_near_unloaded_and_throughput_near_the_best_fixed(
    tmp_path, private_redis, kind
):
    site = Site(tmp_path, private_redis.url)
    try:
        if kind == "asgi":
            site.start_asgi()
            path = "/abusy/"
        else:
            site.start(1, threads=64)
            path = "/busy/"
        result = compare(site.port, path, site.only_policy_on(path), seconds=2.0, sweep=())
    finally:
        site.stop()
    print("\n" + report(kind, result))
    crowd, adaptive = result.unlimited, result.adaptive
    assert crowd.refused == 0, report(kind, result)  # without a limit, all of them queue
    assert adaptive.refused > 0 and adaptive.admitted > 0, report(kind, result)
    # the service answers 40 in flight in about 2 s; the learnt limit keeps the admitted
    # ones to a fraction of that (about a tenth, unloaded)
    assert adaptive.p95 <= crowd.p95 / 2, report(kind, result)
