"""Every engine offers what its interface declares, by name, with the same parameters;
each asyncio twin offers exactly the async half of a store engine."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import pytest
import redis.cluster

from ratelimits.engine import MemoryEngine, RedisEngine
from ratelimits.engine.adaptive import AdaptiveEngine
from ratelimits.engine.aio import AsyncClusterEngine, AsyncRedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.interfaces import AsyncEngine, Engine, Holder, StoreEngine, Watch
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine

WRAPPERS = (LocalFirst, AsyncRedisEngine, AsyncClusterEngine)


def declared(protocol: type) -> dict[str, Any]:
    """The members a protocol declares, its protocol bases' included."""
    out: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass is not Protocol and getattr(klass, "_is_protocol", False):
            out.update((k, v) for k, v in vars(klass).items() if not k.startswith("_"))
    return out


def parameters(function: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def accepts(offered: Any, wanted: Any) -> bool:
    """Whether `offered` takes every parameter of `wanted`, by the same name, kind and
    default, in the same order (anything more it takes has a default)."""
    have, want = parameters(offered), parameters(wanted)
    extra = have[len(want):]
    return have[:len(want)] == want and all(p.default is not p.empty for p in extra)


def missing(engine: object, protocol: type) -> list[str]:
    """What `engine` lacks of `protocol`, or offers under another shape."""
    cls = type(engine)
    wrong = []
    for name, member in declared(protocol).items():
        if isinstance(member, property):  # an attribute or a property will do
            if not hasattr(engine, name):
                wrong.append(f"{name} (attribute)")
            continue
        offered = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(offered):
            wrong.append(f"{name} (not a method)")
        elif inspect.iscoroutinefunction(offered) != inspect.iscoroutinefunction(member):
            wrong.append(f"{name} (sync/async)")
        elif not accepts(offered, member):
            wrong.append(f"{name}{inspect.signature(offered)} for {inspect.signature(member)}")
    return wrong


@pytest.fixture
def engines(redis_client, cluster, postgres_url) -> dict[str, tuple[object, type]]:
    """One engine of each class, each with the interface it promises."""
    store = RedisEngine(redis_client)
    on_postgres = PostgresEngine(postgres_url)
    on_cluster = ClusterEngine(redis.cluster.RedisCluster(host="127.0.0.1",
                                                          port=cluster.ports[0]))
    built: dict[str, tuple[object, type]] = {
        "memory": (MemoryEngine(), Engine),
        "redis": (store, StoreEngine),
        "cluster": (on_cluster, StoreEngine),
        "local first": (LocalFirst(store), StoreEngine),
        "postgres": (on_postgres, StoreEngine),
        "adaptive": (AdaptiveEngine(), Holder),
    }
    yield built
    store.close()
    on_postgres.close()
    on_cluster.close()
    on_cluster.client.close()


def test_every_engine_offers_its_interface_by_name(engines):
    for name, (engine, protocol) in engines.items():
        assert missing(engine, protocol) == [], name


def test_each_store_engines_watch_offers_the_watch_interface(engines):
    for name in ("redis", "cluster", "postgres"):
        engine, _ = engines[name]
        assert engine.watch() is None  # built without a version key: nothing to hear
        engine.version_key = "rl:version"
        watch = engine.watch()
        assert missing(watch, Watch) == [], name


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda cls: cls.__name__)
def test_wrappers_pass_each_method_by_name(wrapper):
    """No fall-through: what a wrapper offers is what it declares."""
    assert "__getattr__" not in vars(wrapper)


@pytest.mark.parametrize("twin", [AsyncRedisEngine, AsyncClusterEngine],
                         ids=lambda cls: cls.__name__)
def test_each_async_twin_offers_exactly_the_async_half_of_a_store_engine(twin):
    half = declared(AsyncEngine)
    store = declared(StoreEngine)
    assert set(half) <= set(store)
    offered = {name for name, member in vars(twin).items()
               if not name.startswith("_") and inspect.iscoroutinefunction(member)}
    assert offered == set(half)
    for name in half:
        method = vars(twin)[name]
        # the store engine's parameters exactly, the call awaited
        assert parameters(method) == parameters(store[name]), name
        assert parameters(half[name]) == parameters(store[name]), name


def test_an_engine_without_a_method_is_told_apart():
    """The check above sees a missing method and a changed parameter."""

    class Lacking(MemoryEngine):
        bump_version = None  # type: ignore[assignment]

        def reset(self, limit, when=None):  # type: ignore[override]
            return None

    wrong = missing(Lacking(), Engine)
    assert "bump_version (not a method)" in wrong
    assert any(w.startswith("reset(") for w in wrong)
