"""Which engine decides: the store the settings name (`STORE`, `REDIS_URL` or
`DATABASE`, found by its URL's scheme in `engine.stores`), else the configured cache's
Redis, else in process.

Built lazily on first use and kept for the life of the process; dropped when `CACHES` or
`RATELIMITS` change (tests, `override_settings`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimits import runtime
from ratelimits.conf import STORE_SETTINGS, UPSTREAM_CACHE, get_config
from ratelimits.engine.adaptive import AdaptiveEngine
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.deployments import RedisURL, engine_on_client, limiter_client
from ratelimits.engine.interfaces import Engine, Holder
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.memory import MemoryEngine
from ratelimits.engine.redis_urls import redact_url
from ratelimits.engine.stores import Options, PostgresStore, RedisStore, StoreURL
from ratelimits.engine.types import Decision, Limit
from ratelimits.pipeline.metrics import recorder_for

logger = logging.getLogger("ratelimits")

DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"

_lock = threading.RLock()  # get_engine() may build the local engine inside
_engine: Engine | None = None
_local: MemoryEngine | None = None
_adaptive: AdaptiveEngine | None = None
_breaker: CircuitBreaker | None = None


def cache_backend(alias: str) -> str | None:
    """The BACKEND of a CACHES alias, or None when the alias does not exist."""
    entry = getattr(settings, "CACHES", {}).get(alias)
    return None if entry is None else str(entry.get("BACKEND", ""))


def is_redis_backend(backend: str | None) -> bool:
    return backend is not None and (
        backend.startswith("django_redis.") or backend == DJANGO_REDIS_CACHE
    )


def redis_client_for(alias: str) -> Any:
    """The redis-py client behind a Redis-backed cache alias, or None for other caches."""
    backend = cache_backend(alias)
    if not is_redis_backend(backend):
        return None
    if backend and backend.startswith("django_redis."):
        # a cache object of the limiter's own, as django-redis's get_redis_connection
        # reads it from `caches[alias]`, but not left in this thread's caches: Django
        # closes those after every request the thread serves
        cache: Any = caches.create_connection(alias)  # django-redis's RedisCache
        return cache.client.get_client(write=True)
    # Django's RedisCache: a client of its own on the same servers, built as the cache
    # builds its own (its RedisCacheClient, from LOCATION and OPTIONS); the first server
    # is the primary, which takes writes.
    from django.core.cache.backends.redis import RedisCacheClient

    entry: Mapping[str, Any] = settings.CACHES[alias]
    location = entry.get("LOCATION", "")
    servers = re.split("[;,]", location) if isinstance(location, str) else location
    return RedisCacheClient(servers, **entry.get("OPTIONS", {})).get_client(write=True)


def _clock() -> float:
    return runtime.clock().monotonic()


def get_engine() -> Engine:
    """The shared engine: on `REDIS_URL`, else on a Redis-backed cache, else the local one."""
    global _engine
    engine = _engine
    if engine is None:
        with _lock:
            if _engine is None:
                _engine = _build_engine(get_config())
            engine = _engine
    return engine


def _build_engine(config: Mapping[str, Any]) -> Engine:
    """The chosen store's engine (`chosen_store`) behind a `LocalFirst` (what a process
    decides alone), with its asyncio twin (async requests await the store on their event
    loop); or the local engine when no store is chosen and the configured cache is not
    Redis."""
    global _breaker
    if _breaker is None:  # kept across failed builds, then handed to the engine
        _breaker = CircuitBreaker(config["BREAKER_FAILURES"], config["BREAKER_COOLDOWN"], _clock)
    options = Options(prefix=config["KEY_PREFIX"], timeout=config["SOCKET_TIMEOUT"],
                      connect_timeout=config["CONNECT_TIMEOUT"], breaker=_breaker,
                      clock=config["CLOCK"])
    chosen = chosen_store(config)
    if chosen is not None:
        setting, url = chosen
        try:
            engine, twin = url.store.build(url, options)
        except ImportError as exc:  # an optional part this install lacks
            raise ImproperlyConfigured(f"RATELIMITS[{setting!r}]: {exc}") from None
        return LocalFirst(engine, twin, leasing=url.store.leases)
    alias = config["CACHE"]
    if cache_backend(alias) is None:
        raise ImproperlyConfigured(
            f"RATELIMITS['CACHE'] is {alias!r}, which is not an alias in CACHES: name one "
            "of your CACHES aliases, or set RATELIMITS['REDIS_URL']."
        )
    client = redis_client_for(alias)
    if client is None:
        return get_local_engine()
    engine, twin = engine_on_client(limiter_client(client, options.timeout,
                                                   options.connect_timeout),
                                    options.redis_kwargs())
    return LocalFirst(engine, twin)


def chosen_store(config: Mapping[str, Any]) -> tuple[str, StoreURL] | None:
    """The store the settings name, and the setting naming it: `STORE`, or its spellings
    `REDIS_URL` (Redis) and `DATABASE` (PostgreSQL, a URL or a DATABASES alias); None
    when the limits live on the `CACHE` alias (or in process)."""
    if config["STORE"] is not None:
        return "STORE", config["STORE"]
    redis_url: RedisURL | None = config["REDIS_URL"]
    if redis_url is not None:
        return "REDIS_URL", StoreURL(RedisStore(), redis_url, redis_url.shown)
    database: str | None = config["DATABASE"]
    if database is not None:
        return "DATABASE", StoreURL(PostgresStore(), postgres_conninfo(database),
                                    redact_url(database))
    return None


#: DATABASES OPTIONS that Django's PostgreSQL backend reads itself, or hands to psycopg
#: (the others are libpq's connection parameters, passed on).
_DJANGO_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool",
                             "assume_role", "cursor_factory", "context",
                             "prepare_threshold"})


def postgres_conninfo(database: str) -> str:
    """The connection string of `RATELIMITS['DATABASE']`: a postgresql:// URL as given,
    or built from the settings of that DATABASES alias (a PostgreSQL one); the engine
    opens connections of its own with it, never the request's."""
    if "://" in database:
        return database
    entry = getattr(settings, "DATABASES", {}).get(database)
    if entry is None:
        raise ImproperlyConfigured(
            f"RATELIMITS['DATABASE'] is {database!r}, which is not an alias in DATABASES: "
            "name one of your DATABASES aliases (a PostgreSQL one), or give a "
            "postgresql:// URL.")
    backend = str(entry.get("ENGINE", ""))
    if "postg" not in backend:
        raise ImproperlyConfigured(
            f"RATELIMITS['DATABASE'] is {database!r}, whose ENGINE is {backend!r}: the "
            "limits can be kept in PostgreSQL only (django.db.backends.postgresql); "
            "name a PostgreSQL alias, or use Redis (REDIS_URL or CACHE).")
    return conninfo_of(entry)


def conninfo_of(entry: Mapping[str, Any]) -> str:
    """A libpq connection string of the server and database of one DATABASES entry."""
    params = {key: value for key, value in (entry.get("OPTIONS") or {}).items()
              if key not in _DJANGO_OPTIONS}
    for key, name in (("NAME", "dbname"), ("USER", "user"), ("PASSWORD", "password"),
                      ("HOST", "host"), ("PORT", "port")):
        if entry.get(key):
            params[name] = entry[key]
    # libpq's key='value' form: a quote or backslash in a value is escaped
    return " ".join(
        "{}='{}'".format(key, str(value).replace("\\", "\\\\").replace("'", "\\'"))
        for key, value in params.items())


def get_local_engine() -> MemoryEngine:
    """The process-wide in-memory engine (development, and `on_error="local"`)."""
    global _local
    if _local is None:
        with _lock:
            if _local is None:
                # beside a store, which counts what it decides (`count_in_store`)
                _local = MemoryEngine(version_key=f'{get_config()["KEY_PREFIX"]}version',
                                      counted=not is_shared())
    return _local


def get_adaptive_engine() -> AdaptiveEngine:
    """The process-wide engine of adaptive policies (`engine.adaptive`): each process
    learns its own limits; their samples reach the store's counters (`_sampled`)."""
    global _adaptive
    if _adaptive is None:
        with _lock:
            if _adaptive is None:
                _adaptive = AdaptiveEngine(on_sample=_sampled, clock=_wall_clock)
    return _adaptive


def _wall_clock() -> float:
    """The time a request is released at, on the installed clock (`ratelimits.runtime`)."""
    return runtime.clock().time()


#: The counters' fields an adaptive policy's samples add to, per minute: how many, the
#: sum of their latencies (µs) and the sum of the limit each left, so that the admin
#: charts both averages, over every process.
SAMPLES, LATENCY_US, LIMIT_SUM = "n", "t", "k"


def _sampled(limit: Limit, at: float, latency: float, learnt: int) -> None:
    if not limit.name:
        return
    recorder = recorder_for(get_config())
    if recorder is not None:
        recorder.learnt(limit.name, learnt)
    try:
        store: Engine = get_engine()
        store.count_fields(limit.name, int(at * 1_000_000),
                           {SAMPLES: 1, LATENCY_US: round(latency * 1_000_000),
                            LIMIT_SUM: learnt})
    except Exception as exc:  # a figure for a chart never fails a response
        logger.debug("ratelimits: an adaptive sample was not counted (%s)", exc)


def count_in_store(engine: Holder, decision: Decision, now: float | None) -> None:
    """Count a decision made in process by `engine` (an adaptive or per-process policy)
    in the store's counters and offenders too, so the admin and `ratelimits status`
    show it; unless `engine` is the store (it counted it already)."""
    store = _engine  # built: no call to ask for it (a request per process builds it)
    if store is None:
        try:
            store = get_engine()
        except Exception:  # a cluster out of reach: the count is lost, never the request
            return
    if store is not engine:
        store.count_locally(decision, int((time.time() if now is None else now) * 1_000_000))


#: The counter field of the requests a policy's `on_error` decided, the store being out
#: of reach (what the admin shows as "decided by on_error").
FALLBACK = "f"


def count_fallback(names: Iterable[str], now: float | None) -> None:
    """Count a request that each policy of `names` left to its `on_error`, the store not
    answering: tallied in this process and sent to the store's counters once it answers
    again (the tally keeps what it could not send), so the admin shows it."""
    try:
        store: Engine = get_engine()
    except Exception:  # no engine to tally with: the count is lost, never the request
        return
    now_us = int((time.time() if now is None else now) * 1_000_000)
    for name in names:
        store.count_fields(name, now_us, {FALLBACK: 1})


def install(engine: MemoryEngine) -> None:
    """Decide with `engine`, shared and per-process policies alike, until the next
    `reset_engines()` (`ratelimits.testing` installs a fresh in-process engine)."""
    global _engine, _local
    reset_engines()
    with _lock:
        _engine = _local = engine


def is_shared() -> bool:
    """Whether limits are shared between processes (a store named by STORE, REDIS_URL or
    DATABASE, or a Redis-backed cache)."""
    config = get_config()
    return (any(config[name] is not None for name in STORE_SETTINGS)
            or is_redis_backend(cache_backend(config["CACHE"])))


@runtime.on_reset
def reset_engines() -> None:
    """Forget the engines; the next call builds them from the current settings.

    The forgotten store engine is closed first: what it tallied and its leases go to its
    store now, not from a background thread at some later moment (into another
    configuration's store, or between two tests)."""
    global _engine, _local, _adaptive, _breaker
    with _lock:
        old, _engine = _engine, None
        _local = _adaptive = None
        _breaker = None
    if old is not None:
        # a store out of reach: its counts are lost, never a crash
        with contextlib.suppress(Exception):
            old.close()


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "RATELIMITS", UPSTREAM_CACHE):
        reset_engines()
