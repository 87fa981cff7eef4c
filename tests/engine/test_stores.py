"""The stores, found by the scheme of their URL (`engine.stores`): `RATELIMITS["STORE"]`
names any of them, `REDIS_URL` and `DATABASE` stay its spellings for Redis and PostgreSQL,
and a store of one's own is one registered class that requests are then decided in."""

from __future__ import annotations

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from ratelimits.conf import build_config
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.engine.redis_backend import RedisEngine
from ratelimits.engine.stores import (
    PostgresStore,
    RedisStore,
    Store,
    register,
    registered,
    store_url,
)
from ratelimits.pipeline import engines
from ratelimits.pipeline.engines import get_engine


@pytest.mark.parametrize(("url", "store"), [
    ("redis://localhost:6379/0", RedisStore),
    ("REDISS://localhost:6380/0", RedisStore),
    ("unix:///run/redis.sock", RedisStore),
    ("valkey://localhost/0", RedisStore),
    ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", RedisStore),
    ("postgresql://limiter@db:5432/limits", PostgresStore),
    ("postgres://limiter@db/limits", PostgresStore),
])
def test_the_scheme_names_the_store(url, store):
    assert type(store_url(url).store) is store


def test_a_url_is_checked_by_its_store_and_its_password_never_shown():
    checked = store_url("redis://:hunter2@cache.internal:6380/3")
    assert checked.parsed.options["db"] == 3 and checked.parsed.options["port"] == 6380
    assert "hunter2" not in checked.shown and "hunter2" not in repr(checked)
    with pytest.raises(ValueError, match="database number") as refused:
        store_url("redis://:hunter2@cache.internal:6380/three")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("value", ["memcached://cache:11211", "cache:6379", "", 6379])
def test_an_unknown_or_missing_scheme_is_refused_with_the_known_ones(value):
    with pytest.raises(ImproperlyConfigured) as refused:
        build_config({"STORE": value})
    message = str(refused.value)
    assert message.startswith("RATELIMITS['STORE']")
    for said in ("redis://", "postgresql://"):
        assert said in message


def test_one_store_at_most(postgres_url):
    with pytest.raises(ImproperlyConfigured, match="sets STORE and REDIS_URL: the limits "
                                                   "live in one store"):
        build_config({"STORE": postgres_url, "REDIS_URL": "redis://localhost/0"})
    with pytest.raises(ImproperlyConfigured, match="sets STORE and DATABASE"):
        build_config({"STORE": "redis://localhost/0", "DATABASE": "default"})


def test_a_scheme_is_one_stores():
    class Impostor(Store):
        schemes = ("postgresql",)

    with pytest.raises(ValueError, match="postgresql:// is PostgresStore's already"):
        register(Impostor)
    assert type(store_url("postgresql://db/x").store) is PostgresStore


def _state_in(url: str) -> list[bytes]:
    """The clients' state kept in the Redis at `url`."""
    client = redis.Redis.from_url(url)
    try:
        return client.keys("tests-rl:{*")
    finally:
        client.close()


def test_store_decides_in_redis(client, make_policy, settings, private_redis, redis_url):
    settings.RATELIMITS = {**settings.RATELIMITS, "STORE": private_redis.url}
    assert engines.is_shared()
    make_policy(name="by-store", limit=2, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    assert isinstance(get_engine().store, RedisEngine)
    assert _state_in(private_redis.url) and not _state_in(redis_url)  # not the cache's


def test_store_decides_in_postgresql(client, make_policy, settings, postgres_url):
    settings.RATELIMITS = {**settings.RATELIMITS, "STORE": postgres_url}
    make_policy(name="by-store-pg", limit=2, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    store = get_engine().store
    assert isinstance(store, PostgresEngine) and store.conninfo == postgres_url


class _Counted(RedisStore):
    """A Redis reached through a scheme of its own, counting the engines it builds."""

    name = "counted Redis"
    schemes = ("counted-redis",)
    said = "counted-redis:// for the counted Redis"
    built = 0

    def parse(self, url, shown):
        return super().parse("redis" + url[len("counted-redis"):], shown)

    def build(self, url, options):
        type(self).built += 1
        return super().build(url, options)


def test_a_registered_store_decides_requests(client, make_policy, settings, private_redis,
                                             redis_url):
    if not any(type(store) is _Counted for store in registered()):
        register(_Counted)
    settings.RATELIMITS = {**settings.RATELIMITS,
                           "STORE": "counted-redis" + private_redis.url[len("redis"):]}
    before = _Counted.built
    make_policy(name="own-store", limit=1, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    assert _Counted.built == before + 1  # built once, then kept for the process
    assert _state_in(private_redis.url) and not _state_in(redis_url)


def test_a_cache_alias_is_read_without_opening_it_in_the_requests_thread(client, make_policy):
    """On the cache's Redis (no store of its own), the limiter builds its client from the
    alias without leaving the cache open in the thread that built it, so Django does not
    close it after every request the thread serves (the view uses no cache here)."""
    import threading

    from django.core.cache import caches

    make_policy(name="on-cache", limit=5, path="/hello/")
    opened = []

    def serve() -> None:
        engines.reset_engines()  # built again, in this thread, by its first request
        assert client.get("/hello/").status_code == 200
        assert isinstance(get_engine().store, RedisEngine)
        opened.extend(caches.all(initialized_only=True))

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()
    assert opened == []
