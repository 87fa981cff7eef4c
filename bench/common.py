"""Shared pieces of the benchmarks: timing, medians, Markdown tables, the machine, peers.

Every section measures in rounds: one round runs each case once, and the figure reported
is the median over the rounds. Cases of one table are interleaved that way, so a noisy
neighbour on a shared machine slows every row of a round, and the ratios between rows
(what the targets are about) hold even when the absolute figures drift.

Redis databases: 15 for our engine and raw scripts, 14 for Django caches (django-redis)
and the `limits` storage. Both are flushed freely; database 0 is never touched.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
OURS_DB = 15
PEERS_DB = 14
OURS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{OURS_DB}"
PEERS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{PEERS_DB}"

PEER_PACKAGES = (
    "django-ratelimits",
    "redis",
    "hiredis",
    "Django",
    "django-redis",
    "djangorestframework",
    "limits",
    "django-ratelimit",
    "django-smart-ratelimit",
    "django-trafficwatch",
    "gunicorn",
)


def redis_client(db: int) -> Any:
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)


def flush(*dbs: int) -> None:
    for db in dbs:
        if db not in (OURS_DB, PEERS_DB):  # never anything else, above all not db 0
            raise ValueError(f"refusing to flush Redis database {db}")
        redis_client(db).flushdb()


# -- results ---------------------------------------------------------------------------


@dataclass
class Check:
    """A ratio (or count) against its target."""

    what: str
    value: float
    target: str
    met: bool
    unit: str = "×"

    def row(self) -> list[str]:
        shown = f"{self.value:.2f}{self.unit}" if self.unit == "×" else f"{self.value:g}{self.unit}"
        if self.target == "reference":
            return [self.what, shown, "—", "(for reference)"]
        return [self.what, shown, self.target, "met" if self.met else "**not met**"]


@dataclass
class Section:
    title: str
    parts: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, text: str) -> None:
        self.parts.append(text.strip("\n"))

    def markdown(self) -> str:
        body = [f"## {self.title}", *self.parts]
        if self.checks:
            body.append(table(["ratio", "measured", "target", ""], [c.row() for c in self.checks]))
        body.append(f"_Section wall time: {self.seconds:.0f} s._")
        return "\n\n".join(body) + "\n"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; `align` is one letter per column (l/r), numbers right by default."""
    if align is None:
        align = "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def run_section(fn: Callable[..., Section], argv: Sequence[str] | None = None) -> Section:
    """Entry point of a section run alone: `--quick` and print its Markdown."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="few, short repetitions")
    opts = parser.parse_args(argv)
    section = timed(fn, quick=opts.quick)
    print(section.markdown())
    return section


def timed(fn: Callable[..., Section], **kwargs: Any) -> Section:
    start = time.perf_counter()
    section = fn(**kwargs)
    section.seconds = time.perf_counter() - start
    return section


# -- timing ----------------------------------------------------------------------------


def calls_per_second(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def interleaved(
    cases: dict[str, Callable[[], Any]], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Calls per second of every case, `rounds` times, cases interleaved in each round.

    The number of calls per case is calibrated once (a short warm-up run) so that one
    measurement lasts about `seconds`; every round then makes the same number of calls.
    """
    sizes: dict[str, int] = {}
    for name, fn in cases.items():
        warm = calls_per_second(fn, 50)
        sizes[name] = max(50, int(warm * seconds))
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            out[name].append(calls_per_second(fn, sizes[name]))
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> str:
    """min–max of the repetitions, as a percentage of the median."""
    m = median(values)
    if not m:
        return "—"
    return f"±{100 * (max(values) - min(values)) / 2 / m:.0f}%"


# -- the machine -----------------------------------------------------------------------


def machine() -> list[tuple[str, str]]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rows = [
        ("CPU", f"{model}, {os.cpu_count()} cores ({platform.machine()})"),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
    ]
    try:
        info = redis_client(OURS_DB).info("server")
        rows.append(("Redis server", f"{info['redis_version']} (local, TCP 127.0.0.1)"))
    except Exception as exc:  # pragma: no cover - reported, not fatal
        rows.append(("Redis server", f"unreachable: {exc}"))
    try:
        out = subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True)
        rows.append(("redis-benchmark", out.stdout.strip() or "?"))
    except OSError:
        rows.append(("redis-benchmark", "not installed"))
    for package in PEER_PACKAGES:
        try:
            rows.append((package, importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            rows.append((package, "not installed"))
    return rows


# -- Django, configured in process for the peers ---------------------------------------


def configure_django() -> None:
    """Settings for the peers measured in process: every cache on Redis db 14."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only",
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "rest_framework",
        ],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": PEERS_URL,
                "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            }
        },
        DATABASES={},
        USE_TZ=True,
        # django-smart-ratelimit: its own Redis connection, same database as the cache.
        RATELIMIT_BACKEND="redis",
        RATELIMIT_REDIS={"host": REDIS_HOST, "port": REDIS_PORT, "db": PEERS_DB},
        RATELIMIT_FAIL_OPEN=False,
        # django-trafficwatch: key on the client IP (no auth middleware here).
        TRAFFICWATCH={
            "KEY_FUNC": "django_trafficwatch.keys.client_ip",
            "RECENT_VIOLATIONS": 0,
        },
        LOGGING_CONFIG=None,
    )
    django.setup()
    import logging

    # Peers log every refusal at WARNING; exactness runs refuse thousands of requests.
    for name in ("django_trafficwatch", "django_smart_ratelimit", "django_ratelimit"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fake_request(ip: str = "203.0.113.7") -> Any:
    from django.test import RequestFactory

    return RequestFactory().get("/bench/", REMOTE_ADDR=ip)


# -- peers: one adapter each, `fn(ident) -> allowed` -----------------------------------


class FakeClock:
    """A clock that moves `step` seconds per reading (DRF steady state, see drf_throttle)."""

    def __init__(self, step: float) -> None:
        self.now = time.time()
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def drf_throttle(rate: str, scope: str = "bench", clock: Callable[[], float] | None = None):
    """DRF's SimpleRateThrottle (the base of Anon/UserRateThrottle) at `rate`, keyed on IP.

    A new throttle per call, as DRF builds one per request.
    """
    from rest_framework.throttling import SimpleRateThrottle

    attrs: dict[str, Any] = {
        "rate": rate,
        "scope": scope,
        "get_cache_key": lambda self, request, view: self.cache_format
        % {"scope": self.scope, "ident": request.META["REMOTE_ADDR"]},
    }
    if clock is not None:
        attrs["timer"] = staticmethod(clock)
    throttle = type("BenchThrottle", (SimpleRateThrottle,), attrs)
    request = fake_request()

    def allow(ident: str) -> bool:
        request.META["REMOTE_ADDR"] = ident
        return bool(throttle().allow_request(request, None))

    return allow, throttle


def drf_prefill(throttle: type, ident: str, clock: FakeClock) -> None:
    """Fill one client's history to num_requests - 1 entries, spaced by the clock's step.

    With the clock advancing duration/num_requests (plus a hair) per call, every later
    call pops exactly one expired entry and pushes one: the steady state of a client that
    sends exactly its rate, with a full history list, every request admitted.
    """
    from django.core.cache import cache

    t = throttle()
    now = clock.now
    history = [now - k * clock.step for k in range(1, t.num_requests)]
    cache.set(t.cache_format % {"scope": t.scope, "ident": ident}, history, t.duration)


def django_ratelimit_check(rate: str, group: str = "bench"):
    from django_ratelimit.core import is_ratelimited

    request = fake_request()

    def allow(ident: str) -> bool:
        request.META["REMOTE_ADDR"] = ident
        return not is_ratelimited(request, group=group, key="ip", rate=rate, increment=True)

    return allow


_smart_backend: Any = None


def smart_ratelimit_check(limit: int, period: int, prefix: str = "bench"):
    """django-smart-ratelimit's decorator core: `check_rate_limit(ctx, backend)`."""
    global _smart_backend
    from django_smart_ratelimit.context import RateLimitContext
    from django_smart_ratelimit.decorator import check_rate_limit

    if _smart_backend is None:
        from django_smart_ratelimit.backends import get_backend

        _smart_backend = get_backend("redis")
    backend = _smart_backend
    request = fake_request()

    def allow(ident: str) -> bool:
        ctx = RateLimitContext(
            request=request, key=f"{prefix}:ip:{ident}", limit=limit, period=period,
            backend_name="redis",
        )
        return bool(check_rate_limit(ctx, backend).allowed)

    return allow


def trafficwatch_check(limit: int, window: int, backend: str = "fixed", name: str = "bench"):
    """django-trafficwatch's core: `TrafficWatch(backend).check(request, rules)`."""
    from django.utils.module_loading import import_string
    from django_trafficwatch.conf import BUILTIN_BACKENDS
    from django_trafficwatch.core import TrafficWatch
    from django_trafficwatch.rules import Rule

    watch = TrafficWatch(import_string(BUILTIN_BACKENDS[backend])("default", "tw"))
    rules = (Rule(name=name, window=window, limit=limit),)
    request = fake_request()

    def allow(ident: str) -> bool:
        request.META["REMOTE_ADDR"] = ident
        return not watch.check(request, rules).blocked

    return allow


_limits_storage: Any = None


def limits_strategy(strategy: str):
    global _limits_storage
    from limits import strategies
    from limits.storage import RedisStorage

    if _limits_storage is None:
        _limits_storage = RedisStorage(PEERS_URL)
    return getattr(strategies, strategy)(_limits_storage)


def limits_hits(strategy: str, rates: Sequence[str]):
    """`limits`: one `hit` per rate (three rates: three round trips)."""
    from limits import parse

    limiter = limits_strategy(strategy)
    items = [parse(r) for r in rates]

    def allow(ident: str) -> bool:
        ok = True
        for i, item in enumerate(items):
            ok = limiter.hit(item, f"{strategy}{i}", ident) and ok
        return ok

    return allow


LIMITS_STRATEGIES = (
    "FixedWindowRateLimiter",
    "MovingWindowRateLimiter",
    "SlidingWindowCounterRateLimiter",
)
