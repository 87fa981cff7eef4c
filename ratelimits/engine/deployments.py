"""Every way to deploy the limiter's Redis, declared once: the URL schemes a mode answers
to, how its URL is read, and how the limiter's client, store engine and asyncio twin are
built for it.

A new mode is one `Deployment` entry in `DEPLOYMENTS`, with its URL parser in
`redis_urls` (and its line in docs/settings.md). The settings check, the URL messages
and the engine's construction derive from the table. Nothing here imports Django: a
Django cache alias is read in `ratelimits.pipeline.engines`, which hands its client to
`limiter_client`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.errors import EngineUnavailable
from ratelimits.engine.interfaces import AsyncEngine, StoreEngine
from ratelimits.engine.redis_urls import (
    LIMITER_OWNED_OPTIONS,
    REDIS_URL_EXAMPLE,
    RedisURL,
    parse_cluster,
    parse_server,
    parse_socket,
    redact_url,
)
from ratelimits.engine.wire import polled

__all__ = [
    "DEPLOYMENTS",
    "LIMITER_OWNED_OPTIONS",
    "REDIS_URL_EXAMPLE",
    "Deployment",
    "RedisURL",
    "async_twin_client",
    "deployment",
    "deployment_of",
    "engine_on_client",
    "engine_on_url",
    "limiter_client",
    "limiter_options",
    "parse_redis_url",
    "redact_url",
]

#: `parse(value, shown, scheme, rest)`: the `RedisURL` of `scheme://rest`; ValueError
#: saying what to fix, with the URL `shown` (its password hidden).
Parser = Callable[[str, str, str, str], RedisURL]
#: `connect(url, timeouts, breaker)`: the limiter's client on a URL's Redis.
Connector = Callable[[RedisURL, tuple[float, float], CircuitBreaker], Any]


@dataclass(frozen=True, slots=True)
class Deployment:
    """One deployment mode of the limiter's Redis and how to build for it."""

    name: str
    #: What people read it as, in the list of schemes ("for one server").
    said: str
    #: The `REDIS_URL` schemes it answers to; () when reached through a cache alias only.
    schemes: tuple[str, ...]
    #: Reads its URL (None without schemes).
    parse: Parser | None
    #: The limiter's client on its URL's Redis (None without schemes).
    connect: Connector | None
    #: The store engine class, imported when first needed (an optional module's).
    engine: Callable[[], Callable[..., Any]]
    #: `twin(engine, client)`: the engine's asyncio twin.
    twin: Callable[[Any, Any], Any]
    #: `pool(pool, kwargs)`: a blocking pool on the same servers as a client's `pool`
    #: (for a cluster, a node's), with `kwargs`.
    pool: Callable[[Any, dict[str, Any]], Any]
    #: `async_pool(pool, kwargs)`: an asyncio pool on the same servers as `pool`.
    async_pool: Callable[[Any, dict[str, Any]], Any]
    #: The redis-py pool class a cache alias's client has in this mode (None: any other).
    pool_class: type | None = None


def parse_redis_url(value: Any) -> RedisURL | None:
    """Check a `REDIS_URL` value; ValueError with a message that says what to fix."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"must be a URL such as {REDIS_URL_EXAMPLE}, or None to use the CACHE alias; "
            f"got {value!r}"
        )
    shown = redact_url(value)
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    mode = _BY_SCHEME.get(scheme) if sep else None
    if mode is None or mode.parse is None:
        found = f"the scheme {scheme!r}" if sep else "no scheme"
        raise ValueError(f"{shown!r} has {found}: use {_SCHEMES_SAID}, e.g. {REDIS_URL_EXAMPLE}")
    return mode.parse(value, shown, scheme, rest)


# -- the limiter's clients -------------------------------------------------------------


def limiter_options(socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
    """The connection options of every limiter client, whatever kind of store it talks to.

    A limiter on every request must fail within tens of milliseconds and let the policy's
    `on_error` decide, never wait out a cache's timeouts (often seconds) or redis-py's
    retries with backoff.
    """
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
        "retry_on_error": [],
        "health_check_interval": 0,
    }


#: Connection settings that belong to one pool instance and must not be copied.
_POOL_PRIVATE = ("orig_", "maint_notifications", "himport_registry")
#: Connection settings whose value is a blocking client's own class or object (a cluster
#: node's client has its cluster's on-connect hook, which sends READONLY to replicas:
#: the asyncio twin writes to primaries only).
_SYNC_ONLY = ("retry", "parser_class", "redis_connect_func")


def _pool_mode(pool: Any) -> Deployment:
    """The mode of a client's pool: the entry declaring its class, else a plain server."""
    for mode in DEPLOYMENTS.values():
        if mode.pool_class is not None and isinstance(pool, mode.pool_class):
            return mode
    return DEPLOYMENTS["server"]


def limiter_client(client: Any, socket_timeout: float, connect_timeout: float) -> Any:
    """A client on the same server as `client`, with the limiter's own short timeouts.

    The pool keeps the server, database, credentials and TLS settings of `client`'s pool
    and takes `limiter_options` instead of its timeouts and retries. Sentinel pools stay
    Sentinel pools, so failover keeps working.
    """
    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_PRIVATE)}
    kwargs.update(limiter_options(socket_timeout, connect_timeout))
    return redis.Redis(connection_pool=_pool_mode(pool).pool(pool, kwargs))


def async_twin_client(client: Any) -> Any:
    """A `redis.asyncio` client on the same server as the limiter client `client`, with
    the same options (server, database, credentials, TLS, timeouts, no retries). A
    Sentinel pool becomes an asyncio Sentinel pool asking the same sentinels."""
    import redis.asyncio
    from redis.asyncio.retry import Retry as AsyncRetry

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if not k.startswith(_POOL_PRIVATE) and k not in _SYNC_ONLY}
    kwargs["retry"] = AsyncRetry(NoBackoff(), 0)
    return redis.asyncio.Redis(connection_pool=_pool_mode(pool).async_pool(pool, kwargs))


def _plain_pool(pool: Any, kwargs: dict[str, Any]) -> Any:
    return redis.ConnectionPool(connection_class=polled(pool.connection_class),
                                max_connections=pool.max_connections, **kwargs)


def _plain_async_pool(pool: Any, kwargs: dict[str, Any]) -> Any:
    import redis.asyncio

    name = pool.connection_class.__name__  # Connection, SSLConnection, Unix...
    return redis.asyncio.ConnectionPool(
        connection_class=getattr(redis.asyncio.connection, name),
        max_connections=pool.max_connections,
        **kwargs,
    )


def _sentinels(pool: Any) -> list[tuple[str, int]]:
    """The (host, port) of each sentinel that a Sentinel pool's manager asks."""
    return [(s.connection_pool.connection_kwargs["host"],
             s.connection_pool.connection_kwargs["port"])
            for s in pool.sentinel_manager.sentinels]


def _sentinel_options(pool: Any, kwargs: dict[str, Any], retry: Any) -> dict[str, Any]:
    """How the limiter asks the sentinels for the primary: the cache's sentinel options
    (password, TLS) with the limiter's timeouts and no retries, so an unreachable
    sentinel fails the call at once instead of waiting out redis-py's backoff."""
    return {
        **(pool.sentinel_manager.sentinel_kwargs or {}),
        "socket_timeout": kwargs.get("socket_timeout"),
        "socket_connect_timeout": kwargs.get("socket_connect_timeout"),
        "retry": retry,
    }


def _sentinel_pool(pool: Any, kwargs: dict[str, Any]) -> Any:
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        _sentinels(pool), min_other_sentinels=pool.sentinel_manager.min_other_sentinels,
        sentinel_kwargs=_sentinel_options(pool, kwargs, Retry(NoBackoff(), 0)),
    )
    return SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name, manager, is_master=pool.is_master,
        connection_class=polled(pool.connection_class), **kwargs
    )


def _sentinel_async_pool(pool: Any, kwargs: dict[str, Any]) -> Any:
    import redis.asyncio.sentinel
    from redis.asyncio.retry import Retry as AsyncRetry

    async_manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        _sentinels(pool), min_other_sentinels=pool.sentinel_manager.min_other_sentinels,
        sentinel_kwargs=_sentinel_options(pool, kwargs, AsyncRetry(NoBackoff(), 0)),
    )
    return redis.asyncio.sentinel.SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name, async_manager, is_master=pool.is_master, **kwargs
    )


def url_client(url: RedisURL, socket_timeout: float, connect_timeout: float) -> Any:
    """A limiter client on the one server (or socket) of `REDIS_URL`."""
    base = redis.Redis(connection_pool=redis.ConnectionPool(**url.options))
    return limiter_client(base, socket_timeout, connect_timeout)


def cluster_client(url: RedisURL, socket_timeout: float, connect_timeout: float) -> Any:
    """A `RedisCluster` seeded by `REDIS_URL`'s nodes, with the limiter's timeouts.

    No retries (`Retry(NoBackoff(), 0)`: a node that fails is the policy's `on_error`
    to handle), yet MOVED and ASK redirections are still followed: redis-py follows them
    inside one command, apart from its retry policy. Building it asks a seed node for the
    slot map, so it needs one reachable node.

    Its nodes' connections keep their socket public (`wire.Polled`): the fan-out's wires
    poll and write to it. redis-py builds a node's pool with a given connection class
    only for a client made from a URL, so the first seed also goes as one (`url`, its
    scheme plain: TLS comes with the connection class, as for a `rediss://` URL).
    """
    from redis.cluster import ClusterNode, RedisCluster

    options = {**limiter_options(socket_timeout, connect_timeout), **url.options}
    # not RedisCluster options (retry_on_timeout is deprecated there: `retry` decides)
    for name in ("retry_on_error", "health_check_interval", "retry_on_timeout"):
        del options[name]
    tls = options.pop("ssl", False)
    seeds = [ClusterNode(host, port) for host, port in url.nodes]  # type: ignore[no-untyped-call]
    host, port = url.nodes[0]
    return RedisCluster(
        url=f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}",
        startup_nodes=seeds,
        connection_class=polled(redis.SSLConnection if tls else redis.Connection),
        **options,
    )


def _connect_server(url: RedisURL, timeouts: tuple[float, float],
                    breaker: CircuitBreaker) -> Any:
    return url_client(url, *timeouts)


def _reach_cluster(url: RedisURL, timeouts: tuple[float, float],
                   breaker: CircuitBreaker) -> Any:
    """The cluster client, or EngineUnavailable so that policies follow their on_error.

    Building it asks a seed node for the slot map, so a cluster that is down when the
    process first needs it would otherwise fail every request outside the engine; the
    breaker (the one the engine then keeps) spares the seeds a connection per request.
    """
    from redis.exceptions import RedisClusterException, RedisError

    if not breaker.allow():
        raise EngineUnavailable("no seed node of REDIS_URL answered (circuit open)")
    try:
        client = cluster_client(url, *timeouts)
    except (RedisClusterException, RedisError) as exc:
        breaker.failure()
        raise EngineUnavailable(f"no seed node of {url.shown} answered: {exc}") from exc
    breaker.success()
    return client


# -- engines ---------------------------------------------------------------------------


def _redis_engine() -> Callable[..., Any]:
    from ratelimits.engine.redis_backend import RedisEngine

    return RedisEngine


def _cluster_engine() -> Callable[..., Any]:
    """The cluster engine; ImportError naming its module when it is not installed."""
    module = importlib.import_module("ratelimits.engine.cluster")
    return module.ClusterEngine  # type: ignore[no-any-return]


def _redis_twin(engine: Any, client: Any) -> Any:
    from ratelimits.engine.aio import AsyncRedisEngine

    return AsyncRedisEngine(engine, lambda: async_twin_client(client))


def _cluster_twin(engine: Any, client: Any) -> Any:
    from ratelimits.engine.aio import AsyncClusterEngine

    return AsyncClusterEngine(engine, async_twin_client)


DEPLOYMENTS: dict[str, Deployment] = {
    mode.name: mode
    for mode in (
        Deployment("server",
                   "redis:// or rediss:// (TLS; valkey:// and valkeys:// alike) for one server",
                   ("redis", "rediss", "valkey", "valkeys"), parse_server, _connect_server,
                   _redis_engine, _redis_twin, _plain_pool, _plain_async_pool),
        Deployment("socket", "unix:// for a socket", ("unix",), parse_socket,
                   _connect_server, _redis_engine, _redis_twin, _plain_pool,
                   _plain_async_pool),
        Deployment("cluster",
                   "redis+cluster:// or rediss+cluster:// (TLS; valkey+cluster:// and "
                   "valkeys+cluster:// alike) for a cluster",
                   ("redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster"),
                   parse_cluster, _reach_cluster,
                   _cluster_engine, _cluster_twin, _plain_pool, _plain_async_pool),
        # A django-redis cache alias with its SentinelClient: failover follows the service.
        Deployment("sentinel", "", (), None, None, _redis_engine, _redis_twin,
                   _sentinel_pool, _sentinel_async_pool, pool_class=SentinelConnectionPool),
    )
}

_BY_SCHEME = {scheme: mode for mode in DEPLOYMENTS.values() for scheme in mode.schemes}
#: The schemes, for messages: "redis:// or rediss:// (TLS) for one server, unix:// ...".
_SCHEMES_SAID = ", ".join(mode.said for mode in DEPLOYMENTS.values() if mode.schemes)


def deployment(url: RedisURL) -> Deployment:
    """The mode a checked `REDIS_URL` is deployed in."""
    return DEPLOYMENTS[url.kind]


def deployment_of(client: Any) -> Deployment:
    """The mode of a limiter client made from a cache alias's (a Sentinel pool's, else a
    plain server's)."""
    return _pool_mode(client.connection_pool)


def engine_on_url(url: RedisURL, timeouts: tuple[float, float],
                  shared: Mapping[str, Any]) -> tuple[StoreEngine, AsyncEngine | None]:
    """The store engine on `REDIS_URL`'s Redis and its asyncio twin. `shared` are the
    engine's keyword arguments (its `breaker` also spares an unreachable cluster's seeds).
    ImportError when the mode's engine is not installed; EngineUnavailable when a cluster
    has no seed node that answers."""
    mode = deployment(url)
    if mode.connect is None:
        raise ValueError(f"{url.shown}: a {mode.name} is reached through a cache alias")
    build = mode.engine()  # before connecting: a missing engine is a configuration error
    client = mode.connect(url, timeouts, shared["breaker"])
    engine = build(client, **shared)
    return engine, mode.twin(engine, client)


def engine_on_client(client: Any, shared: Mapping[str, Any]
                     ) -> tuple[StoreEngine, AsyncEngine | None]:
    """The store engine on a limiter client (`limiter_client`) and its asyncio twin."""
    mode = deployment_of(client)
    engine = mode.engine()(client, **shared)
    return engine, mode.twin(engine, client)
