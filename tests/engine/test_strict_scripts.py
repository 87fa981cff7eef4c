"""Every script and function the engines send, run as a strict server runs it: no key
touched that the call did not pass in KEYS, a key in every call, and, with the client's
clock, no `TIME` (see `strict_guard`). Each engine's real paths drive them: decisions of
every algorithm and option, the counts and offenders a call carries, the version, the
heartbeat, leases, renewals, releases, resets, and on Redis Cluster the slot calls, their
refunds and the offenders' script."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.aio import AsyncRedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.lease import Leftover
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import REFUND, RESERVE
from tests.engine.conftest import T0
from tests.engine.strict_guard import REFUSED, guarding

ALGORITHMS = [name for name, entry in REGISTRY.items() if not entry.learned]


def variants(algorithm: str) -> list[Limit]:
    """Limits of `algorithm` with each option it takes, two per call to share a call."""
    base = Limit("client", algorithm, 3, 10, name=f"p-{algorithm}")
    out = [base, dataclasses.replace(base, name=f"lock-{algorithm}", lockout=30),
           dataclasses.replace(base, name=f"shadow-{algorithm}", shadow=True)]
    if algorithm in ("token_bucket", "gcra"):
        out.append(dataclasses.replace(base, name=f"warm-{algorithm}", warmup=20))
    if algorithm in ("token_bucket", "gcra", "leaky_bucket"):
        out.append(dataclasses.replace(base, name=f"wait-{algorithm}", max_wait=5))
    if algorithm == "fixed_window":
        out.append(dataclasses.replace(base, name="day", period=86_400, calendar="day"))
    return out


def at(mode: str, seconds: float) -> float | None:
    """The time a test gives a call in `mode` (see `mode`): T0 + `seconds`, or none."""
    return T0 + seconds if mode == "explicit" else None


def drive(engine: Any, mode: str, *, leases: bool = True) -> None:
    """The engine's paths that run scripts, in `mode`."""
    def when(seconds: float) -> float | None:
        return at(mode, seconds)

    for algorithm in ALGORITHMS:
        limits = variants(algorithm)
        for i, step in enumerate((0.0, 0.5, 1.0, 9.9, 10.2, 10.3, 25.0)):
            engine.evaluate(limits, when(step))
            engine.evaluate([*limits[:1], dataclasses.replace(limits[0], key=f"other{i}")],
                            when(step))
        decision = engine.evaluate([dataclasses.replace(limits[0], key="held")], when(30.0))
        if algorithm == "concurrency":
            engine.renew([decision], when(30.5))
            engine.release(decision)
        entry = REGISTRY[algorithm]
        if not (entry.holds_slots or entry.delays):
            reserve = dataclasses.replace(limits[0], name=f"r-{algorithm}", stage=RESERVE)
            taken = engine.evaluate([reserve], when(40.0))
            if taken.reserved_at is not None:
                engine.evaluate([dataclasses.replace(reserve, stage=REFUND)],
                                taken.reserved_at / 1_000_000)
        for limit in limits:
            engine.reset(limit, when(41.0))
    engine.bump_version()
    engine.read_version(when(42.0))
    if leases:
        for algorithm in ("fixed_window", "sliding_window"):
            limit = Limit("client", algorithm, 50, 10, name=f"lease-{algorithm}", batch=5)
            leased = [limit]
            if algorithm == "fixed_window":
                leased.append(dataclasses.replace(limit, name="lease-day", period=86_400,
                                                  calendar="day"))
            grants = engine.lease(leased, when(50.0))
            engine.give_back([Leftover(g.limit, g.window, 2, g.epoch) for g in grants],
                             when(51.0))
            engine.reset(limit, when(52.0))
    # counts and offenders tallied and not carried: a flush sends them (the offenders'
    # script)
    engine.tally.every = 3600.0
    refused = Limit("client", "fixed_window", 1, 10, name="flushed")
    for _ in range(3):
        engine.evaluate([refused], when(60.0))
    engine.flush()


def clock_of(mode: str) -> str:
    """The engine's clock in `mode`, and the guard's: "store" only in mode "store"."""
    return "store" if mode == "store" else "client"


def redis_engine(client: redis.Redis, mode: str) -> RedisEngine:
    engine = RedisEngine(client, version_key="rl:version", live_key="rl:live",
                         clock=clock_of(mode))
    engine.tally.every = 0.0  # every call carries the counts made so far
    if engine.heartbeat is not None:
        engine.heartbeat.every = 0.0  # and a beat
    return engine


@pytest.fixture(params=["explicit", "client", "store"])
def mode(request: pytest.FixtureRequest) -> str:
    """How a call gets its time: given by the test ("explicit", as the conformance tables
    give it), from this process's clock (`clock="client"`) or from the store's ("store").
    The guard refuses TIME in all but "store"."""
    return str(request.param)


def test_redis_engine_touches_only_its_keys(redis_client, mode):
    with guarding(redis_client, clock=clock_of(mode)) as guarded:
        engine = redis_engine(redis_client, mode)
        try:
            drive(engine, mode)
        finally:
            engine.close()
    # every script the engine sends was run, guarded
    assert guarded.ran([redis_client]) == {"batch_library", "lease_source", "version_source",
                                           "offend_source", "renew_source", "live_source"}


@pytest.mark.slow
def test_cluster_engine_touches_only_its_keys(cluster, mode):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        nodes = [redis.Redis(host="127.0.0.1", port=port) for port in cluster.ports]
        with guarding(nodes[0], clock=clock_of(mode)) as guarded:
            for node in nodes[1:]:
                node.script_flush()
            engine = ClusterEngine(client, version_key="rl:version", live_key="rl:live",
                                   clock=clock_of(mode))
            engine.tally.every = 0.0
            if engine.heartbeat is not None:
                engine.heartbeat.every = 0.0
            try:
                drive(engine, mode)
            finally:
                engine.close()
        assert guarded.ran(nodes) == {"slot_source", "refund_source", "lease_source",
                                      "version_source", "offend_source", "renew_source",
                                      "live_source"}
    finally:
        client.close()


def test_the_guard_refuses_an_undeclared_key(redis_client):
    """The guard can fail: a script reaching past its KEYS is refused."""
    from tests.engine.strict_guard import guard_lua, guarded_source, key_positions

    guard = guard_lua(key_positions(redis_client), no_time=True)
    with pytest.raises(redis.ResponseError, match=REFUSED):
        redis_client.eval(guarded_source("return redis.call('GET', 'other')", guard), 1, "k")
    with pytest.raises(redis.ResponseError, match="without keys"):
        redis_client.eval(guarded_source("return 1", guard), 0)
    with pytest.raises(redis.ResponseError, match="TIME"):
        redis_client.eval(guarded_source("return redis.call('TIME')", guard), 1, "k")
    assert redis_client.eval(guarded_source("return redis.call('GET', KEYS[1])", guard),
                             1, "k") is None


def test_the_asyncio_engine_touches_only_its_keys(redis_client, redis_url, mode):
    """The asyncio twin sends the same scripts from its own path: decisions and leases."""
    async def run(engine: AsyncRedisEngine) -> None:
        for algorithm in ALGORITHMS:
            limits = variants(algorithm)
            for step in (0.0, 9.9, 10.2):
                await engine.evaluate(limits, at(mode, step))
        limit = Limit("client", "sliding_window", 50, 10, name="lease", batch=5)
        await engine.lease([limit], at(mode, 20))

    with guarding(redis_client, clock=clock_of(mode)) as guarded:
        twin = redis_engine(redis_client, mode)
        opened: list[redis.asyncio.Redis] = []

        def connect() -> redis.asyncio.Redis:
            opened.append(redis.asyncio.Redis.from_url(redis_url))
            return opened[-1]

        async def main() -> None:
            try:
                await run(AsyncRedisEngine(twin, connect))
            finally:
                for client in opened:
                    await client.aclose()

        try:
            asyncio.run(main())
        finally:
            twin.close()
    assert {"batch_library", "lease_source"} <= guarded.ran([redis_client])
