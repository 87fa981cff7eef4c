"""What each limiter leaves to Python's cyclic garbage collector, per request.

    .venv/bin/python bench/gc_cost.py [--requests 20000] [--scenarios none dr drcompat]

A Django request lives in reference cycles (its session, its messages, the resolver
match point back at it), so everything attached to it is freed by the cyclic collector,
not when the response is sent. The more objects each request leaves, the more often the
collector runs, and under load a worker's collections take longer (another process
runs meanwhile). Section 3's settings and URLs (`bench/e2e_settings.py`), served in one
process by Django's own WSGI handler (no server, no other process on the cores but
Redis): for each scenario, a child process serves `--requests` requests from 1,000
clients and reports the time per request, the collector's time per request (timed with
`gc.callbacks`), how many objects it freed per request (those a request left behind),
and its collections per 1,000 requests. Compare scenarios of one run only.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, e2e
from bench.common import table

PATHS = {"none": "/hello/", "ours": "/hello/", "dr": "/dr-hello/", "drcompat": "/dr-hello/"}
CLIENTS = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(1000)]


def child(path: str, requests: int) -> dict[str, float]:
    """Serve `requests` requests through the WSGI handler, in this process."""
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.client import RequestFactory

    app, factory = WSGIHandler(), RequestFactory()

    def serve(i: int) -> None:
        environ = factory.get(path, HTTP_HOST="127.0.0.1",
                              HTTP_X_FORWARDED_FOR=CLIENTS[i % len(CLIENTS)]).environ
        status: list[str] = []

        def start_response(given: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(given)
            return lambda data: None

        body = app(environ, start_response)
        b"".join(body)
        body.close()
        if not status[0].startswith("200"):
            raise RuntimeError(f"{path} answered {status[0]}")

    for i in range(2_000):  # warm: imports, the snapshot, connections, caches
        serve(i)
    gc.collect()
    spent, runs, freed, started = [0.0], [0], [0], [0.0]

    def timing(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            runs[0] += 1
            freed[0] += info["collected"]

    gc.callbacks.append(timing)
    start = time.perf_counter()
    for i in range(requests):
        serve(i * 7)
    seconds = time.perf_counter() - start
    gc.callbacks.remove(timing)
    return {"us": seconds / requests * 1e6, "gc_us": spent[0] / requests * 1e6,
            "freed": freed[0] / requests, "collections": runs[0] / requests * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--scenarios", nargs="+", default=["none", "dr", "drcompat"],
                        choices=sorted(PATHS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(PATHS[args.child], args.requests)))
        return
    common.flush(common.PEERS_DB)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
        databases = {}
        for scenario in args.scenarios:
            policies = "declared" if scenario.startswith("dr") else "one"
            if policies not in databases:
                databases[policies] = str(Path(tmp) / f"{policies}.sqlite3")
                e2e.prepare(databases[policies], e2e.POLICIES[policies])
            env = {**e2e.server_env(databases[policies], scenario),
                   common.PORT_VARIABLE: str(common.REDIS_PORT)}
            out = subprocess.run(
                [sys.executable, __file__, "--child", scenario, "--requests",
                 str(args.requests)], env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{scenario} failed:\n{out.stderr}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append([scenario, f"{got['us']:.0f}", f"{got['gc_us']:.1f}",
                         f"{got['freed']:.1f}", f"{got['collections']:.1f}"])
    print(table(["scenario", "µs per request", "collector µs per request",
                 "objects it freed per request", "collections per 1,000"], rows))


if __name__ == "__main__":
    main()
