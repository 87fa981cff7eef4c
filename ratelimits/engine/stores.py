"""Every kind of store the limits can be kept in, found by the scheme of its URL.

A store is one class: the URL schemes it answers to, how it checks a URL (saying what to
fix), and how it builds its engine (and, where it has one, the engine's asyncio twin). The
settings (`RATELIMITS["STORE"]`, and `REDIS_URL` and `DATABASE`, its spellings for Redis
and PostgreSQL), the settings check and the engine's construction all ask this registry,
so a new store is one class given to `register()`:

    from ratelimits.engine.stores import Store, register

    @register
    class MyStore(Store):
        name = "mystore"
        schemes = ("mystore",)
        said = "mystore:// for my store"

        def build(self, url, options):
            return MyEngine(url.parsed, prefix=options.prefix, ...), None

(an engine implementing `ratelimits.engine.interfaces.StoreEngine`), registered before
the first request: in an `AppConfig.ready()`, say.

Nothing here imports Django, nor a store's client library: each class imports its
engine when it builds one, so a site without psycopg never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.interfaces import AsyncEngine, StoreEngine
from ratelimits.engine.redis_urls import redact_url

__all__ = ["Options", "Store", "StoreURL", "register", "registered", "store_url"]


@dataclass(frozen=True, slots=True)
class Options:
    """What every store's engine is built with, from the settings."""

    #: `KEY_PREFIX`: the start of every key (or name) the engine writes.
    prefix: str
    #: `SOCKET_TIMEOUT` and `CONNECT_TIMEOUT`, in seconds.
    timeout: float
    connect_timeout: float
    #: The process's breaker (kept across engines rebuilt after a failure).
    breaker: CircuitBreaker
    #: `CLOCK` (`keynames.CLOCKS`): whose clock decides a call given no time.
    clock: str = "store"

    @property
    def version_key(self) -> str:
        """Where the policy version is kept."""
        return f"{self.prefix}version"

    @property
    def live_key(self) -> str:
        """Where the heartbeat counts the processes alive (`engine.heartbeat`)."""
        return f"{self.prefix}live"

    def redis_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the Redis engines (`engine.deployments`)."""
        return {"prefix": self.prefix, "version_key": self.version_key,
                "live_key": self.live_key, "breaker": self.breaker, "clock": self.clock}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A checked store URL: its store, what the store read from it, and the URL with
    its password hidden (for messages and logs)."""

    store: Store
    parsed: Any = field(repr=False)
    shown: str


class Store:
    """One kind of store. Subclasses set `name`, `schemes` and `said`, and write
    `build`; `parse` checks a URL (the default keeps it as given)."""

    #: Its name in messages: "Redis".
    name: ClassVar[str] = ""
    #: The URL schemes it answers to, in lower case.
    schemes: ClassVar[tuple[str, ...]] = ()
    #: Its schemes as the settings' messages list them: "postgresql:// for PostgreSQL".
    said: ClassVar[str] = ""
    #: Whether its engine takes leases (a policy's `batch`): a process spends units ahead.
    leases: ClassVar[bool] = True

    def parse(self, url: str, shown: str) -> Any:
        """What the engine needs of `url`; ValueError saying what to fix (with `shown`,
        never the password)."""
        return url

    def build(self, url: StoreURL, options: Options
              ) -> tuple[StoreEngine, AsyncEngine | None]:
        """The store engine on `url` and its asyncio twin (None: async requests call the
        engine in a thread). EngineUnavailable when the store cannot be reached at all
        yet; ImproperlyConfigured-worthy mistakes as ValueError or ImportError."""
        raise NotImplementedError


_STORES: dict[str, Store] = {}

S = TypeVar("S", bound=type[Store])


def register(store: S) -> S:
    """Answer `store`'s schemes with it (a class decorator). A scheme another store
    answers already is refused: ValueError naming both."""
    instance = store()
    if not instance.schemes:
        raise ValueError(f"{store.__name__} names no URL scheme")
    for scheme in instance.schemes:
        held = _STORES.get(scheme.lower())
        if held is not None and type(held) is not store:
            raise ValueError(f"{scheme}:// is {type(held).__name__}'s already; "
                             f"{store.__name__} cannot take it")
    for scheme in instance.schemes:
        _STORES[scheme.lower()] = instance
    return store


def registered() -> tuple[Store, ...]:
    """Every store, once each, in the order they were registered."""
    return tuple(dict.fromkeys(_STORES.values()))


def schemes_said() -> str:
    """The stores' schemes, for messages."""
    return "; ".join(store.said for store in registered())


def store_url(value: Any) -> StoreURL:
    """The store of a `RATELIMITS["STORE"]` URL, checked by that store; ValueError with
    a message that says what to fix."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a URL whose scheme names the store ({schemes_said()}), "
                         f"got {value!r}")
    shown = redact_url(value)
    scheme, sep, _ = value.partition("://")
    store = _STORES.get(scheme.lower()) if sep else None
    if store is None:
        found = f"the scheme {scheme!r}" if sep else "no scheme"
        raise ValueError(f"{shown!r} has {found}: use {schemes_said()}")
    return StoreURL(store, store.parse(value, shown), shown)


# -- the stores this package brings ------------------------------------------------


def _redis_schemes() -> tuple[str, ...]:
    from ratelimits.engine.deployments import DEPLOYMENTS

    return tuple(s for mode in DEPLOYMENTS.values() for s in mode.schemes)


@register
class RedisStore(Store):
    """Redis and Valkey: one server, a socket or a cluster (`engine.deployments`); a
    Sentinel service is reached through a django-redis cache alias (`CACHE`)."""

    name = "Redis"
    schemes = _redis_schemes()
    said = "redis://, rediss://, unix://, redis+cluster:// (and valkey:// alike) for Redis"

    def parse(self, url: str, shown: str) -> Any:
        from ratelimits.engine.deployments import parse_redis_url

        return parse_redis_url(url)

    def build(self, url: StoreURL, options: Options
              ) -> tuple[StoreEngine, AsyncEngine | None]:
        from ratelimits.engine.deployments import engine_on_url

        try:
            return engine_on_url(url.parsed, (options.timeout, options.connect_timeout),
                                 options.redis_kwargs())
        except ImportError as exc:
            if exc.name != "ratelimits.engine.cluster":
                raise
            raise ImportError(
                f"{url.shown!r} names a Redis Cluster, but cluster support is not "
                "installed in this version of ratelimits (ratelimits.engine.cluster is "
                "missing): upgrade ratelimits, or name one server (redis://, rediss://, "
                "unix://).", name=exc.name) from None


@register
class PostgresStore(Store):
    """PostgreSQL, for sites without Redis (`engine.postgres`): a `postgresql://` URL,
    or libpq's connection string built from a DATABASES alias (`DATABASE`)."""

    name = "PostgreSQL"
    schemes = ("postgresql", "postgres")
    said = "postgresql:// (or postgres://) for PostgreSQL"

    def build(self, url: StoreURL, options: Options
              ) -> tuple[StoreEngine, AsyncEngine | None]:
        from ratelimits.engine.postgres import PostgresEngine

        engine = PostgresEngine(url.parsed, prefix=options.prefix,
                                version_key=options.version_key, timeout=options.timeout,
                                connect_timeout=options.connect_timeout,
                                breaker=options.breaker, clock=options.clock)
        return engine, None

