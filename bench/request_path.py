"""Section 9: the whole request path in one process, beside a PING loop and `limits`.

    .venv/bin/python bench/request_path.py [--quick]

What a user sees when one enforced policy guards a view: RequestFactory requests through
`RateLimitMiddleware` to a trivial view, the policy a fixed window that always admits,
decided on the run's Redis. Beside it, in the same interleaved rounds of one process:

- a redis-py `PING` loop (one round trip and nothing else: the floor of any store call);
- a bare `limits` hit (`FixedWindowRateLimiter` and `SlidingWindowCounterRateLimiter`,
  the faster counts), which does no Django work at all;
- the view alone, and the middleware with the engine's Redis call answered by a canned
  reply: what our Python costs per request, without the round trip.

The measuring runs in a child process with its own Django settings (the peers' sections
configure Django differently in the parent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

VIEW = "view alone (RequestFactory request, trivial view)"
CANNED = "middleware, 1 policy, engine reply canned (our Python only)"
OURS = "middleware, 1 enforced policy, decided on Redis (the whole path)"
FLOOR = "the floor: a middleware sending one EVALSHA of `return 1` (bench/floor.py)"
PING = "redis-py PING loop"
LIMITS = "`limits` bare hit, its faster strategy"


def run(quick: bool = False) -> Section:
    section = Section("9. The whole request path in one process")
    env = {**os.environ, common.PORT_VARIABLE: str(common.REDIS_PORT)}
    child = subprocess.run(
        [sys.executable, __file__, "--child", *(["--quick"] if quick else [])],
        capture_output=True, text=True, env=env, check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"request path bench failed:\n{child.stderr}")
    rates: dict[str, list[float]] = json.loads(child.stdout.strip().splitlines()[-1])
    med = {name: median(v) for name, v in rates.items()}
    rounds = len(rates[OURS])
    rows = [[name, fmt_rate(med[name]), spread(rates[name]), f"{1e6 / med[name]:.1f}",
             f"{med[OURS] / med[name]:.2f}×"] for name in (VIEW, CANNED, FLOOR, OURS, PING, LIMITS)]
    section.add(
        "One process, one connection, Redis on loopback; median of "
        f"{rounds} interleaved rounds of about {0.2 if quick else 0.5} s per case. Ours: "
        "`RateLimitMiddleware` around a view returning a short `HttpResponse`, a "
        "RequestFactory GET, one enforced `fixed_window` policy of 10⁹ per minute on key "
        "`ip` (every request admitted and charged, headers added), the app's Redis engine "
        "(FCALL, counts tallied in process). `limits`: `hit()` of `1000000/minute` on "
        "`RedisStorage`, no request object at all. The canned row answers the engine's "
        "Redis call with a fixed reply: the difference to the view alone is our Python per "
        "request. The floor makes the one round trip a decided request makes and nothing "
        "else: ours minus the floor is what our Python adds to the unavoidable.\n\n"
        + table(["case", "per second", "±", "µs per call", "ours vs this"], rows)
    )
    section.checks += [
        Check("whole middleware path vs a redis-py PING loop", med[OURS] / med[PING],
              "≥ 0.6×", med[OURS] / med[PING] >= 0.6),
        Check("whole middleware path vs a bare `limits` hit", med[OURS] / med[LIMITS],
              "≥ 1.0×", med[OURS] / med[LIMITS] >= 1.0),
        Check("our Python per request (canned reply minus the view alone), µs",
              round(1e6 / med[CANNED] - 1e6 / med[VIEW], 1), "reference", True, unit=" µs"),
        Check("the whole path beyond the floor, µs per request",
              round(1e6 / med[OURS] - 1e6 / med[FLOOR], 1), "≤ 20 µs",
              1e6 / med[OURS] - 1e6 / med[FLOOR] <= 20, unit=" µs"),
    ]
    return section


def _setup(redis_url: str) -> None:
    """Django settings for measuring the request path in this process (its cache, and so
    the engine, on `redis_url`), and the database migrated."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench",
        DEBUG=False,
        USE_TZ=True,
        ALLOWED_HOSTS=["*"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "ratelimits"],
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache",
                            "LOCATION": redis_url}},
        RATELIMITS={"KEY_PREFIX": "bench-rl:"},
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _child(quick: bool) -> None:
    _setup(common.OURS_URL)
    port = common.REDIS_PORT
    import redis
    from django.db import transaction
    from django.http import HttpResponse
    from django.test import RequestFactory
    from limits import parse, strategies
    from limits.storage import RedisStorage

    from bench.floor import FloorMiddleware, floor_client
    from ratelimits.middleware import RateLimitMiddleware
    from ratelimits.models import Policy
    from ratelimits.pipeline.engines import get_engine

    with transaction.atomic():
        Policy.objects.create(name="bench", mode="enforce", algorithm="fixed_window",
                              limit=10**9, period=60, key="ip", path="*")
    rf = RequestFactory()

    def view(request: Any) -> Any:
        return HttpResponse("hello")

    middleware = RateLimitMiddleware(view)
    assert middleware(rf.get("/hello/")).status_code == 200
    store = get_engine().store
    wire, call = store.wire, store.wire.call
    # what the batch function answers for one admitting limit, as Redis answered it once
    replies: list[Any] = []

    def recorded(command: Any) -> Any:
        replies.append(call(command))
        return replies[-1]

    wire.call = recorded  # type: ignore[method-assign]
    assert middleware(rf.get("/hello/")).status_code == 200
    wire.call = call  # type: ignore[method-assign]
    canned_reply = replies[-1]

    ping_client = redis.Redis(host=common.REDIS_HOST, port=port, db=common.PEERS_DB)
    storage = RedisStorage(common.PEERS_URL)
    item = parse("1000000/minute")
    fixed = strategies.FixedWindowRateLimiter(storage)
    sliding = strategies.SlidingWindowCounterRateLimiter(storage)

    def ours() -> None:
        assert middleware(rf.get("/hello/")).status_code == 200

    def canned() -> None:
        # the reply canned, and no heartbeat riding along (its pipeline would call Redis)
        wire.call, beat, store.heartbeat = (lambda command: canned_reply,  # type: ignore[method-assign]
                                            store.heartbeat, None)
        try:
            assert middleware(rf.get("/hello/")).status_code == 200
        finally:
            wire.call, store.heartbeat = call, beat  # type: ignore[method-assign]

    floor = FloorMiddleware(view, floor_client(common.OURS_URL))

    cases = {
        VIEW: lambda: view(rf.get("/hello/")),
        FLOOR: lambda: floor(rf.get("/hello/")),
        CANNED: canned,
        OURS: ours,
        PING: ping_client.ping,
        "limits fixed": lambda: fixed.hit(item, "203.0.113.7"),
        "limits sliding": lambda: sliding.hit(item, "203.0.113.7"),
    }
    rounds, seconds = (3, 0.2) if quick else (7, 0.5)
    rates = common.interleaved(cases, rounds, seconds)
    fixed_rates, sliding_rates = rates.pop("limits fixed"), rates.pop("limits sliding")
    rates[LIMITS] = max(fixed_rates, sliding_rates, key=median)
    common.flush(common.OURS_DB, common.PEERS_DB)
    print(json.dumps(rates))


if __name__ == "__main__":
    if "--child" in sys.argv:
        _child("--quick" in sys.argv)
    else:
        common.run_section(run)
