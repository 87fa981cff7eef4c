"""The peers measured beside ratelimits: one adapter each, `fn(ident) -> allowed`.

DRF's throttle, django-ratelimit, django-smart-ratelimit, django-trafficwatch and
`limits`, configured in process on the benches' private Redis (database 14, see
`bench/common.py`). DRF's throttle and django-ratelimit have a twin in
`ratelimits.compat` (their API, decided by our engine): the same adapter runs either,
chosen by module (`DRF_MODULES`, `DJANGO_RATELIMIT_MODULES`).
"""

from __future__ import annotations

import copy
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import common

#: (label, module) of DRF's throttle classes and of ours with DRF's API.
DRF_MODULES = (
    ("DRF SimpleRateThrottle", "rest_framework.throttling"),
    ("ratelimits.compat.drf SimpleRateThrottle", "ratelimits.compat.drf"),
)
#: (label, module) of django-ratelimit's `is_ratelimited` and of ours with its API.
DJANGO_RATELIMIT_MODULES = (
    ("django-ratelimit is_ratelimited", "django_ratelimit.core"),
    ("ratelimits.compat.django_ratelimit is_ratelimited",
     "ratelimits.compat.django_ratelimit.core"),
)
#: No views: the peers are called directly (ratelimits looks for `@ratelimit` here).
urlpatterns: list[Any] = []

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
            "ratelimits",  # the compat layers: policies declared in code, in this database
        ],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": common.PEERS_URL,
                "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            }
        },
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        # ratelimits (the compat layers): its engine on the cache's Redis, as the app runs
        RATELIMITS={"KEY_PREFIX": "bench-rl:"},
        # django-smart-ratelimit: its own Redis connection, same database as the cache.
        RATELIMIT_BACKEND="redis",
        RATELIMIT_REDIS={
            "host": common.REDIS_HOST, "port": common.REDIS_PORT, "db": common.PEERS_DB
        },
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

    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    # Peers log every refusal at WARNING; exactness runs refuse thousands of requests.
    for name in ("django_trafficwatch", "django_smart_ratelimit", "django_ratelimit"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fake_request(ip: str = "203.0.113.7") -> Any:
    from django.test import RequestFactory

    return RequestFactory().get("/bench/", REMOTE_ADDR=ip)


def request_per_call() -> Callable[[str], Any]:
    """A new request per call from client `ident`, as a server makes one per request: a
    shallow copy of one RequestFactory GET (about 2 µs, far less than building one). The
    compat layers keep a request's decision on it, so reusing one would answer from the
    first call's."""
    template = fake_request()

    def request_for(ident: str) -> Any:
        request = copy.copy(template)
        request.META = {**template.META, "REMOTE_ADDR": ident}
        return request

    return request_for


class FakeClock:
    """A clock that moves `step` seconds per reading (DRF steady state, see drf_throttle)."""

    def __init__(self, step: float) -> None:
        self.now = time.time()
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def drf_throttle(rate: str, scope: str = "bench", clock: Callable[[], float] | None = None,
                 module: str = "rest_framework.throttling"):
    """`module`'s SimpleRateThrottle (the base of Anon/UserRateThrottle; DRF's, or ours
    in `ratelimits.compat.drf`) at `rate`, keyed on IP.

    A new throttle and a new request per call, as DRF builds them per request.
    """
    base = importlib.import_module(module).SimpleRateThrottle
    attrs: dict[str, Any] = {
        "rate": rate,
        "scope": scope,
        "get_cache_key": lambda self, request, view: self.cache_format
        % {"scope": self.scope, "ident": request.META["REMOTE_ADDR"]},
    }
    if clock is not None:
        attrs["timer"] = staticmethod(clock)
    throttle = type("BenchThrottle", (base,), attrs)
    request_for = request_per_call()

    def allow(ident: str) -> bool:
        return bool(throttle().allow_request(request_for(ident), None))

    return allow, throttle


def drf_prefill(throttle: type, allow: Callable[[str], bool], ident: str,
                clock: FakeClock) -> None:
    """Fill one client's history to num_requests - 1 entries, spaced by the clock's step.

    With the clock advancing duration/num_requests (plus a hair) per call, every later
    call pops exactly one expired entry and pushes one: the steady state of a client that
    sends exactly its rate, with a full history, every request admitted. DRF's history
    list is written into the cache at once (calling would pickle it 10,000 times); ours,
    a log in Redis, is filled by calling, the clock stepping as it does after.
    """
    from django.core.cache import cache
    from rest_framework.throttling import SimpleRateThrottle

    t = throttle()
    if not issubclass(throttle, SimpleRateThrottle):  # ours
        for _ in range(t.num_requests - 1):
            allow(ident)
        return
    now = clock.now
    history = [now - k * clock.step for k in range(1, t.num_requests)]
    cache.set(t.cache_format % {"scope": t.scope, "ident": ident}, history, t.duration)


def django_ratelimit_check(rate: str, group: str = "bench",
                           module: str = "django_ratelimit.core"):
    """`module`'s `is_ratelimited(..., key="ip", increment=True)` (django-ratelimit's, or
    ours in `ratelimits.compat.django_ratelimit.core`), a new request per call."""
    is_ratelimited = importlib.import_module(module).is_ratelimited
    request_for = request_per_call()

    def allow(ident: str) -> bool:
        return not is_ratelimited(request_for(ident), group=group, key="ip", rate=rate,
                                  increment=True)

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
        _limits_storage = RedisStorage(common.PEERS_URL)
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
