"""Which engine decides: Redis through the configured cache's client, else in process.

Built lazily on first use and kept for the life of the process; dropped when `CACHES` or
`RATELIMITS` change (tests, `override_settings`).
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimits.conf import get_config

DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"

_lock = threading.RLock()  # get_engine() may build the local engine inside
_engine: Any = None
_local: Any = None


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


def limiter_client(client: Any, socket_timeout: float, connect_timeout: float) -> Any:
    """A client on the same server as `client`, with the limiter's own short timeouts.

    The cache's pool keeps the cache's timeouts (often seconds) and redis-py's default
    retries with backoff; a limiter on every request must instead fail within tens of
    milliseconds and let the policy's `on_error` decide. Sentinel pools stay Sentinel
    pools, so failover keeps working.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_PRIVATE)}
    kwargs.update(
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        retry_on_error=[],
        health_check_interval=0,
    )
    from redis.sentinel import SentinelConnectionPool

    if isinstance(pool, SentinelConnectionPool):
        new_pool: Any = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name, pool.sentinel_manager, is_master=pool.is_master, **kwargs
        )
    else:
        new_pool = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=new_pool)


def _clock() -> float:
    from ratelimits.pipeline.state import process

    return process.clock()


def _version_key(prefix: str) -> str:
    return f"{prefix}version"


def get_engine() -> Any:
    """The shared engine: `RedisEngine` on a Redis-backed cache, else the local one."""
    global _engine
    engine = _engine
    if engine is None:
        with _lock:
            if _engine is None:
                config = get_config()
                client = redis_client_for(config["CACHE"])
                if client is None:
                    _engine = get_local_engine()
                else:
                    from ratelimits.engine import RedisEngine
                    from ratelimits.engine.breaker import CircuitBreaker

                    _engine = RedisEngine(
                        limiter_client(client, config["SOCKET_TIMEOUT"], config["CONNECT_TIMEOUT"]),
                        prefix=config["KEY_PREFIX"],
                        version_key=_version_key(config["KEY_PREFIX"]),
                        breaker=CircuitBreaker(
                            config["BREAKER_FAILURES"], config["BREAKER_COOLDOWN"], _clock
                        ),
                    )
            engine = _engine
    return engine


def get_local_engine() -> Any:
    """The process-wide in-memory engine (development, and `on_error="local"`)."""
    global _local
    if _local is None:
        from ratelimits.engine import MemoryEngine

        with _lock:
            if _local is None:
                _local = MemoryEngine(version_key=_version_key(get_config()["KEY_PREFIX"]))
    return _local


def is_shared() -> bool:
    """Whether limits are shared between processes (a Redis-backed cache is configured)."""
    return is_redis_backend(cache_backend(get_config()["CACHE"]))


def reset_engines() -> None:
    """Forget the engines; the next call builds them from the current settings."""
    global _engine, _local
    with _lock:
        _engine = None
        _local = None


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "RATELIMITS"):
        reset_engines()
