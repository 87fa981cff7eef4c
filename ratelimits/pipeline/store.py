"""Which engine decides: `REDIS_URL`'s Redis, else the configured cache's, else in process.

Built lazily on first use and kept for the life of the process; dropped when `CACHES` or
`RATELIMITS` change (tests, `override_settings`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimits.conf import RedisURL, get_config

logger = logging.getLogger("ratelimits")

DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"

_lock = threading.RLock()  # get_engine() may build the local engine inside
_engine: Any = None
_local: Any = None
_adaptive: Any = None
_breaker: Any = None


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
        from django_redis import get_redis_connection

        return get_redis_connection(alias, write=True)
    from django.core.cache import caches

    # Django's RedisCache keeps a redis-py client per server; the primary takes writes.
    return caches[alias]._cache.get_client(write=True)  # type: ignore[attr-defined]


#: Connection settings that belong to one pool instance and must not be copied.
_POOL_PRIVATE = ("orig_", "maint_notifications", "himport_registry")


def limiter_options(socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
    """The connection options of every limiter client, whatever kind of store it talks to.

    A limiter on every request must fail within tens of milliseconds and let the policy's
    `on_error` decide, never wait out a cache's timeouts (often seconds) or redis-py's
    retries with backoff.
    """
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
        "retry_on_error": [],
        "health_check_interval": 0,
    }


def limiter_client(client: Any, socket_timeout: float, connect_timeout: float) -> Any:
    """A client on the same server as `client`, with the limiter's own short timeouts.

    The pool keeps the server, database, credentials and TLS settings of `client`'s pool
    and takes `limiter_options` instead of its timeouts and retries. Sentinel pools stay
    Sentinel pools, so failover keeps working.
    """
    import redis

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_PRIVATE)}
    kwargs.update(limiter_options(socket_timeout, connect_timeout))
    from redis.sentinel import SentinelConnectionPool

    if isinstance(pool, SentinelConnectionPool):
        new_pool: Any = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master, **kwargs
        )
    else:
        new_pool = redis.ConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
    return redis.Redis(connection_pool=new_pool)


#: Connection settings whose value is a blocking client's own class or object (a cluster
#: node's client has its cluster's on-connect hook, which sends READONLY to replicas:
#: the asyncio twin writes to primaries only).
_SYNC_ONLY = ("retry", "parser_class", "redis_connect_func")


def async_twin_client(client: Any) -> Any:
    """A `redis.asyncio` client on the same server as the limiter client `client`, with
    the same options (server, database, credentials, TLS, timeouts, no retries). A
    Sentinel pool becomes an asyncio Sentinel pool asking the same sentinels."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if not k.startswith(_POOL_PRIVATE) and k not in _SYNC_ONLY}
    kwargs["retry"] = Retry(NoBackoff(), 0)
    if isinstance(pool, SentinelConnectionPool):
        import redis.asyncio.sentinel

        manager = pool.sentinel_manager
        sentinels = [(s.connection_pool.connection_kwargs["host"],
                      s.connection_pool.connection_kwargs["port"])
                     for s in manager.sentinels]
        async_manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            sentinels, min_other_sentinels=manager.min_other_sentinels,
            sentinel_kwargs=manager.sentinel_kwargs,
        )
        new_pool: Any = redis.asyncio.sentinel.SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name, async_manager, is_master=pool.is_master, **kwargs
        )
    else:
        name = pool.connection_class.__name__  # Connection, SSLConnection, Unix...
        new_pool = redis.asyncio.ConnectionPool(
            connection_class=getattr(redis.asyncio.connection, name),
            max_connections=pool.max_connections,
            **kwargs,
        )
    return redis.asyncio.Redis(connection_pool=new_pool)


def url_client(url: RedisURL, socket_timeout: float, connect_timeout: float) -> Any:
    """A limiter client on the one server (or socket) of `REDIS_URL`."""
    import redis

    base = redis.Redis(connection_pool=redis.ConnectionPool(**url.options))
    return limiter_client(base, socket_timeout, connect_timeout)


def cluster_client(url: RedisURL, socket_timeout: float, connect_timeout: float) -> Any:
    """A `RedisCluster` seeded by `REDIS_URL`'s nodes, with the limiter's timeouts.

    No retries (`Retry(NoBackoff(), 0)`: a node that fails is the policy's `on_error`
    to handle), yet MOVED and ASK redirections are still followed: redis-py follows them
    inside one command, apart from its retry policy. Building it asks a seed node for the
    slot map, so it needs one reachable node.
    """
    from redis.cluster import ClusterNode, RedisCluster

    options = limiter_options(socket_timeout, connect_timeout)
    # not RedisCluster options (retry_on_timeout is deprecated there: `retry` decides)
    for name in ("retry_on_error", "health_check_interval", "retry_on_timeout"):
        del options[name]
    seeds = [ClusterNode(host, port) for host, port in url.nodes]  # type: ignore[no-untyped-call]
    return RedisCluster(
        startup_nodes=seeds,
        **options,
        **url.options,
    )


def _clock() -> float:
    from ratelimits.pipeline.state import process

    return process.clock()


def _version_key(prefix: str) -> str:
    return f"{prefix}version"


def get_engine() -> Any:
    """The shared engine: on `REDIS_URL`, else on a Redis-backed cache, else the local one."""
    global _engine
    engine = _engine
    if engine is None:
        with _lock:
            if _engine is None:
                _engine = _build_engine(get_config())
            engine = _engine
    return engine


def _build_engine(config: Mapping[str, Any]) -> Any:
    """A store engine behind a `Frontline` (what a process decides alone), or the local
    engine when the configured cache is not Redis."""
    from ratelimits.engine.breaker import CircuitBreaker
    from ratelimits.engine.frontline import Frontline

    timeouts = (config["SOCKET_TIMEOUT"], config["CONNECT_TIMEOUT"])
    global _breaker
    if _breaker is None:  # kept across failed builds, then handed to the engine
        _breaker = CircuitBreaker(config["BREAKER_FAILURES"], config["BREAKER_COOLDOWN"], _clock)
    shared = {
        "prefix": config["KEY_PREFIX"],
        "version_key": _version_key(config["KEY_PREFIX"]),
        "live_key": f"{config['KEY_PREFIX']}live",  # engine.live: the heartbeat's set
        "breaker": _breaker,
    }
    url: RedisURL | None = config["REDIS_URL"]
    if url is not None and url.kind == "cluster":
        try:
            cluster = importlib.import_module("ratelimits.engine.cluster")
        except ImportError as exc:
            if exc.name != "ratelimits.engine.cluster":
                raise
            raise ImproperlyConfigured(
                f"RATELIMITS['REDIS_URL'] = {url.shown!r} names a Redis Cluster, but cluster "
                "support is not installed in this version of ratelimits "
                "(ratelimits.engine.cluster is missing): upgrade ratelimits, or point "
                "REDIS_URL at one server (redis://, rediss://, unix://)."
            ) from None
        from ratelimits.engine.aio import AsyncClusterEngine

        engine = cluster.ClusterEngine(_reach_cluster(url, timeouts, shared["breaker"]),
                                       **shared)
        frontline = Frontline(engine)
        frontline.aio = AsyncClusterEngine(engine, async_twin_client)
        return frontline
    if url is not None:
        return _with_async_twin(url_client(url, *timeouts), shared)
    alias = config["CACHE"]
    if cache_backend(alias) is None:
        raise ImproperlyConfigured(
            f"RATELIMITS['CACHE'] is {alias!r}, which is not an alias in CACHES: name one "
            "of your CACHES aliases, or set RATELIMITS['REDIS_URL']."
        )
    client = redis_client_for(alias)
    if client is None:
        return get_local_engine()
    return _with_async_twin(limiter_client(client, *timeouts), shared)


def _with_async_twin(client: Any, shared: Mapping[str, Any]) -> Any:
    """A `RedisEngine` on `client` behind a `Frontline`, with its asyncio twin: async
    requests await the store on their event loop."""
    from ratelimits.engine import RedisEngine
    from ratelimits.engine.aio import AsyncRedisEngine
    from ratelimits.engine.frontline import Frontline

    engine = RedisEngine(client, **shared)
    frontline = Frontline(engine)
    frontline.aio = AsyncRedisEngine(engine, lambda: async_twin_client(client))
    return frontline


def _reach_cluster(url: RedisURL, timeouts: tuple[float, float], breaker: Any) -> Any:
    """The cluster client, or EngineUnavailable so that policies follow their on_error.

    Building it asks a seed node for the slot map, so a cluster that is down when the
    process first needs it would otherwise fail every request outside the engine; the
    breaker (the one the engine then keeps) spares the seeds a connection per request.
    """
    from redis.exceptions import RedisClusterException, RedisError

    from ratelimits.engine.errors import EngineUnavailable

    if not breaker.allow():
        raise EngineUnavailable("no seed node of REDIS_URL answered (circuit open)")
    try:
        client = cluster_client(url, *timeouts)
    except (RedisClusterException, RedisError) as exc:
        breaker.failure()
        raise EngineUnavailable(f"no seed node of {url.shown} answered: {exc}") from exc
    breaker.success()
    return client


def get_local_engine() -> Any:
    """The process-wide in-memory engine (development, and `on_error="local"`)."""
    global _local
    if _local is None:
        from ratelimits.engine import MemoryEngine

        with _lock:
            if _local is None:
                _local = MemoryEngine(version_key=_version_key(get_config()["KEY_PREFIX"]))
    return _local


def get_adaptive_engine() -> Any:
    """The process-wide engine of adaptive policies (`engine.adaptive`): each process
    learns its own limits; their samples reach the store's counters (`_sampled`)."""
    global _adaptive
    if _adaptive is None:
        from ratelimits.engine.adaptive import AdaptiveEngine

        with _lock:
            if _adaptive is None:
                _adaptive = AdaptiveEngine(on_sample=_sampled, clock=_wall_clock)
    return _adaptive


def _wall_clock() -> float:
    """The time a request is released at: a test's clock (`ratelimits.testing`), else now."""
    from ratelimits.pipeline.state import process

    clock = process.test_clock
    return time.time() if clock is None else float(clock.now())


#: The counters' fields an adaptive policy's samples add to, per minute: how many, the
#: sum of their latencies (µs) and the sum of the limit each left, so that the admin
#: charts both averages, over every process.
SAMPLES, LATENCY_US, LIMIT_SUM = "n", "t", "k"


def _sampled(limit: Any, at: float, latency: float, learnt: int) -> None:
    if not limit.name:
        return
    from ratelimits.ops.metrics import recorder_for

    recorder = recorder_for(get_config())
    if recorder is not None:
        recorder.learnt(limit.name, learnt)
    try:
        count = getattr(get_engine(), "count_fields", None)
        if count is not None:
            count(limit.name, int(at * 1_000_000),
                  {SAMPLES: 1, LATENCY_US: round(latency * 1_000_000), LIMIT_SUM: learnt})
    except Exception as exc:  # a figure for a chart never fails a response
        logger.debug("ratelimits: an adaptive sample was not counted (%s)", exc)


def count_in_store(engine: Any, decision: Any, now: float | None) -> None:
    """Count a decision made in process by `engine` (an adaptive or per-process policy)
    in the store's counters and offenders too, so the admin and `ratelimits status`
    show it; unless `engine` is the store (it counted it already)."""
    try:
        store = get_engine()
    except Exception:  # a cluster out of reach: the count is lost, never the request
        return
    count = getattr(store, "count_locally", None)
    if store is not engine and count is not None:
        count(decision, int((time.time() if now is None else now) * 1_000_000))


def install(engine: Any) -> None:
    """Decide with `engine`, shared and per-process policies alike, until the next
    `reset_engines()` (`ratelimits.testing` installs a fresh in-process engine)."""
    global _engine, _local
    reset_engines()
    with _lock:
        _engine = _local = engine


def is_shared() -> bool:
    """Whether limits are shared between processes (REDIS_URL or a Redis-backed cache)."""
    config = get_config()
    return config["REDIS_URL"] is not None or is_redis_backend(cache_backend(config["CACHE"]))


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
    close = getattr(old, "close", None)
    if close is not None:
        # a store out of reach: its counts are lost, never a crash
        with contextlib.suppress(Exception):
            close()


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "RATELIMITS"):
        reset_engines()
