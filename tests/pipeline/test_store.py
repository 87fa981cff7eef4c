"""Engine selection: Redis when the cache alias is Redis-backed, in process otherwise."""

from __future__ import annotations

from django.test import override_settings

from ratelimits.pipeline.engines import get_engine, get_local_engine, is_shared, redis_client_for


def test_django_redis_alias_gives_the_redis_engine():
    from ratelimits.engine import RedisEngine

    assert isinstance(get_engine().store, RedisEngine)
    assert is_shared()
    assert get_engine() is get_engine()  # built once


def test_djangos_redis_cache_gives_the_redis_engine(redis_url):
    from ratelimits.engine import RedisEngine

    caches = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}
    }
    with override_settings(CACHES=caches):
        assert redis_client_for("default").ping()
        assert isinstance(get_engine().store, RedisEngine)


def test_other_caches_give_the_process_local_engine():
    from ratelimits.engine import MemoryEngine

    with override_settings(RATELIMITS={"CACHE": "local"}):
        assert isinstance(get_engine(), MemoryEngine)
        assert get_engine() is get_local_engine()
        assert not is_shared()
