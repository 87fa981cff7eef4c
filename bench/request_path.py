"""The request path's own Python cost: RateLimitMiddleware around a trivial view.

    .venv/bin/python bench/request_path.py [--quick]

RequestFactory requests go through `RateLimitMiddleware` with one enforced policy (a
fixed window that always admits). Three cases, interleaved in every round so a noisy
neighbour slows them alike:

- `bare`: the view alone (what the middleware costs is measured on top of it);
- `canned`: the middleware, with the engine's Redis call answered by a canned reply, so
  the figure is our Python only (request state, policy matching, identity, the limit,
  the reply's assembly, the headers);
- `redis`: the middleware on a private redis-server (started for the run, killed after),
  for context: the round trip dominates.

Prints µs per request (median over the rounds) and the middleware's Python overhead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(redis_url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench",
        DEBUG=False,
        USE_TZ=True,
        ALLOWED_HOSTS=["*"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "ratelimits"],
        CACHES={
            "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}
        },
        RATELIMITS={"KEY_PREFIX": "bench-rl:"},
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _per_request_us(fn: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="few, short rounds")
    opts = parser.parse_args(argv)
    rounds, n = (3, 2_000) if opts.quick else (7, 10_000)

    from tests.redis_server import RedisProcess

    server = RedisProcess().start()
    try:
        _setup(server.url)
        _run(rounds, n)
    finally:
        server.stop()


def _run(rounds: int, n: int) -> None:
    from django.db import transaction
    from django.http import HttpResponse
    from django.test import RequestFactory

    from ratelimits.middleware import RateLimitMiddleware
    from ratelimits.models import Policy
    from ratelimits.pipeline.resolver import resolver
    from ratelimits.pipeline.store import get_engine

    with transaction.atomic():
        Policy.objects.create(
            name="bench", mode="enforce", algorithm="fixed_window", limit=10**9,
            period=60, key="ip", path="*",
        )
    rf = RequestFactory()

    def view(request: Any) -> Any:
        return HttpResponse("hello")

    middleware = RateLimitMiddleware(view)
    real = get_engine().store  # the Redis engine behind the deny cache and leases
    assert middleware(rf.get("/hello/")).status_code == 200
    version = resolver.snapshot().version

    # The reply the batch script gives for one admitting limit: version, admitted, now,
    # then allowed, remaining, reset_after, retry_after, delay (µs) and the outcome.
    canned_reply = [version, 1, 0, 1, 10**9 - 1, 60_000_000, 0, 0, b"a"]

    class Canned:
        def __call__(self, keys: Any, args: Any) -> Any:
            return canned_reply

    def bare() -> None:
        view(rf.get("/hello/"))

    def canned() -> None:
        assert middleware(rf.get("/hello/")).status_code == 200

    def with_redis() -> None:
        assert middleware(rf.get("/hello/")).status_code == 200

    script = real._script
    cases = {"bare": bare, "canned": canned, "redis": with_redis}
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            real._script = Canned() if name == "canned" else script
            out[name].append(_per_request_us(fn, n if name != "redis" else max(200, n // 10)))
    real._script = script

    med = {k: statistics.median(v) for k, v in out.items()}
    print(f"request path, {rounds} rounds, median µs per request")
    print(f"  view alone (RequestFactory + view):          {med['bare']:8.1f}")
    print(f"  middleware, canned engine reply:             {med['canned']:8.1f}")
    print(f"  middleware, real Redis (private server):     {med['redis']:8.1f}")
    print(f"  our Python per request (canned - view):      {med['canned'] - med['bare']:8.1f}")


if __name__ == "__main__":
    main()
