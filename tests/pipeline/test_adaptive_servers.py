"""An adaptive policy in front of a service that slows down as it fills up (50 ms per
request in flight, `bench/closed_loop.py`), under 40 closed-loop clients, on a real ASGI
server (uvicorn) and a real WSGI server (gunicorn, threaded): the latency stays near the
unloaded one while the throughput stays near the best fixed limit of a sweep run beside
it; without a limit, the latency is the whole crowd's."""

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
        # The service turns ~20 requests/s around at any concurrency, so every fixed
        # limit's throughput is about the same: the extremes and one between them find
        # the best, in 2 s runs (docs/benchmarks.md §11, `bench/adaptive.py`, runs the
        # whole sweep for longer).
        result = compare(site.port, path, site.only_policy_on(path), seconds=2.0,
                         sweep=(1, 8, 40))
    finally:
        site.stop()
    print("\n" + report(kind, result))
    unloaded, adaptive = result.unloaded, result.adaptive
    _, best = result.best_fixed
    assert adaptive.p95 <= 3 * unloaded.p50, report(kind, result)
    # the server takes about 20 a second at best, so a 2 s run counts about 40: one
    # request is 2.5 %, and a loaded CI machine costs the learning limiter a few
    assert adaptive.throughput >= 0.75 * best.throughput, report(kind, result)
    # without a limit the whole crowd queues: far beyond what the adaptive limit allows
    assert result.unlimited.p95 >= 10 * unloaded.p50, report(kind, result)
