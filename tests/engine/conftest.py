"""Every engine test runs against both backends: Redis (real server) and in-process; the
conformance tables against every engine there is (`every_engine`), PostgreSQL's too (on
the machine's server, in a database of the run's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from ratelimits.engine import Limit, MemoryEngine, RedisEngine
from ratelimits.engine.aio import AsyncClusterEngine, AsyncRedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.deployments import async_twin_client
from ratelimits.engine.keynames import cell, client_key
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.engine.types import Decision

#: An epoch second aligned to every window used in the tables (divisible by 3600).
T0 = 1_800_000_000.0


@pytest.fixture
def clean_state() -> Iterator[None]:
    """Off here: an engine test builds its own engine on a database `redis_client` flushes,
    and keeps no process state for the app's reset (or a DBSIZE per test) to clear."""
    yield


#: A PostgreSQL engine's timeout in the tables' tests, which test what is decided, not
#: how soon: a loaded two-core machine has kept a call past the default's second.
LOADED = 5.0


@pytest.fixture(params=["redis", "redis-client-clock", "memory", "postgres"])
def engine(request: pytest.FixtureRequest):
    """Each engine: in process, Redis with its scripts reading the server's clock or
    with each call sending this process's (`clock="client"`, see `keynames.CLOCKS`), and
    PostgreSQL."""
    if request.param == "postgres":
        engine = PostgresEngine(request.getfixturevalue("postgres_url"),
                                version_key="rl:version", timeout=LOADED)
        yield engine
        engine.close()
        return
    if request.param != "memory":
        client = request.getfixturevalue("redis_client")
        clock = "client" if request.param == "redis-client-clock" else "store"
        engine = RedisEngine(client, version_key="rl:version", clock=clock)
        yield engine
        # Its tally sends counts and offenders from a thread up to FLUSH_EVERY later:
        # closed here, they reach this test's database, never the next test's.
        engine.close()
        return
    yield MemoryEngine(version_key="rl:version")


class Blocking:
    """An asyncio engine's `evaluate`, run to its end on an event loop of its own: the
    blocking call the conformance tables make of every engine."""

    def __init__(self, engine: AsyncRedisEngine | AsyncClusterEngine,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        return self.loop.run_until_complete(self.engine.evaluate(limits, now))


class Opened:
    """The asyncio clients an engine opened, closed on its loop at the end of the test."""

    def __init__(self) -> None:
        self.clients: list[redis.asyncio.Redis] = []

    def keep(self, client: redis.asyncio.Redis) -> redis.asyncio.Redis:
        self.clients.append(client)
        return client

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        for client in self.clients:
            loop.run_until_complete(client.aclose())


def _redis(request: pytest.FixtureRequest) -> RedisEngine:
    return RedisEngine(request.getfixturevalue("redis_client"), version_key="rl:version")


def _cluster(request: pytest.FixtureRequest) -> ClusterEngine:
    port = request.getfixturevalue("cluster").ports[0]
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=port)
    request.addfinalizer(client.close)
    return ClusterEngine(client, version_key="rl:version")


def _on_loop(request: pytest.FixtureRequest,
             build: Callable[[Opened], AsyncRedisEngine | AsyncClusterEngine]) -> Blocking:
    loop = asyncio.new_event_loop()
    opened = Opened()
    engine = build(opened)

    def close() -> None:
        opened.close(loop)
        engine.twin.close()
        loop.close()

    request.addfinalizer(close)
    return Blocking(engine, loop)


def _async_redis(request: pytest.FixtureRequest) -> Blocking:
    url = request.getfixturevalue("redis_url")
    twin = _redis(request)
    return _on_loop(request, lambda opened: AsyncRedisEngine(
        twin, lambda: opened.keep(redis.asyncio.Redis.from_url(url))))


def _async_cluster(request: pytest.FixtureRequest) -> Blocking:
    twin = _cluster(request)
    return _on_loop(request, lambda opened: AsyncClusterEngine(
        twin, lambda node: opened.keep(async_twin_client(node))))


#: Every engine the conformance tables run on: its name and how a test builds it (on the
#: test's clean Redis database, or on the run's cluster, emptied for the test).
ENGINES: dict[str, Callable[[pytest.FixtureRequest], Any]] = {
    "memory": lambda request: MemoryEngine(version_key="rl:version"),
    "redis": _redis,
    "local-first": lambda request: LocalFirst(_redis(request)),
    "cluster": _cluster,
    "async-redis": _async_redis,
    "async-cluster": _async_cluster,
    "postgres": lambda request: PostgresEngine(request.getfixturevalue("postgres_url"),
                                               version_key="rl:version", timeout=LOADED),
}


#: The engines that need the run's cluster: left out of `make test-fast`.
ON_CLUSTER = frozenset({"cluster", "async-cluster"})


@pytest.fixture(params=[pytest.param(name, marks=[pytest.mark.slow] if name in ON_CLUSTER else [])
                        for name in ENGINES])
def every_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each engine in turn, its `evaluate(limits, now)` blocking (an asyncio one run on a
    loop of its own); closed after the test, so its tally reaches this test's store."""
    engine = ENGINES[request.param](request)
    yield engine
    if not isinstance(engine, Blocking):
        engine.close()


@pytest.fixture(params=["redis", "postgres"])
def leasing_engine(request: pytest.FixtureRequest) -> Iterator[RedisEngine | PostgresEngine]:
    """A store engine that leases (`batch`): Redis, then PostgreSQL, for scenarios both
    must pass alike."""
    if request.param == "redis":
        yield RedisEngine(request.getfixturevalue("redis_client"))
        return
    pg = PostgresEngine(request.getfixturevalue("postgres_url"))
    yield pg
    pg.close()


def stored_count(engine: RedisEngine | PostgresEngine, limit: Limit, window: int) -> int:
    """The count `engine` keeps for window number `window` of `limit` (prefix "rl:"), read
    from its store."""
    if isinstance(engine, RedisEngine):
        key, field = cell("rl:", limit)
        return int(engine.client.hget(f"{key}:{window}", field) or 0)
    row = engine.client.execute("SELECT v[1] FROM ratelimits_state_v1 WHERE k = %s",
                                (f"{client_key('rl:', limit)}:{window}",)).fetchone()
    return 0 if row is None else int(row[0])
