"""The asyncio twin of the cluster engine: the same decisions as the blocking one from
the same steps, every node's calls awaited on the event loop, the rare paths (a lost
script, a node out of reach) settled by the blocking rules."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.cluster
from hypothesis import HealthCheck, given, settings

from ratelimits.engine import EngineUnavailable, Limit
from ratelimits.engine.aio import AsyncClusterEngine, AsyncNodes
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.deployments import async_twin_client
from tests.engine.conftest import T0
from tests.engine.test_aio import _limit, requests
from tests.engine.test_cluster_faults import TIMEOUT, _client, _port
from tests.redis_cluster import RedisCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def client(cluster):
    c = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    yield c
    c.close()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def twins(client, **kwargs) -> tuple[ClusterEngine, AsyncClusterEngine]:
    """A blocking engine and an asyncio one on the cluster, each with its own prefix."""
    blocking = ClusterEngine(client, prefix="sync:", version_key="sync:v", **kwargs)
    twin = ClusterEngine(client, prefix="async:", version_key="async:v", **kwargs)
    return blocking, AsyncClusterEngine(twin, async_twin_client)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests)
def test_sync_and_async_cluster_engines_decide_alike(client, loop, sequence):
    """Random requests whose limits spread over the primaries (refunds across slots
    included), at the same explicit times: identical decisions, field for field."""
    client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    blocking, aio = twins(client, stats=False)
    at = T0
    for specs, gap in sequence:
        at += gap / 1e6
        limits = [_limit(*spec) for spec in specs]
        want = blocking.evaluate(limits, now=at)
        got = loop.run_until_complete(aio.evaluate(limits, now=at))
        assert (got.allowed, got.retry_after, got.delay, got.version) == (
            want.allowed, want.retry_after, want.delay, want.version)
        assert got.results == want.results
        if want.token is not None:  # concurrency slots: both release theirs
            blocking.release(want)
            loop.run_until_complete(aio.release(got))


def _spread(client, client_key: str = "c") -> list[Limit]:
    """Three limits of one request, each on another primary."""
    found: dict[str, Limit] = {}
    for i in range(200):
        limit = Limit(f"{client_key}{i}", "fixed_window", 1, 60, name="p")
        from ratelimits.engine.keynames import base_key

        found.setdefault(client.get_node_from_key(base_key("async:", limit)).name, limit)
        if len(found) == 3:
            return list(found.values())
    raise AssertionError("no three limits on three primaries")


def test_every_node_is_asked_from_the_event_loop_and_no_thread(client, loop, monkeypatch):
    _, aio = twins(client)
    limits = _spread(client)
    # A new cluster has no script loaded: that first call is the rare path, settled
    # apart. Other clients' limits on the same primaries load them first.
    assert loop.run_until_complete(aio.evaluate(_spread(client, "warm-"), now=T0)).allowed
    seen = []
    node_wire = AsyncNodes.wire

    def spy(self, node):
        seen.append(threading.get_ident())
        return node_wire(self, node)

    def no_thread(*args, **kwargs):
        raise AssertionError("a thread was asked for on the request path")

    monkeypatch.setattr(AsyncNodes, "wire", spy)
    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    first = loop.run_until_complete(aio.evaluate(limits, now=T0))
    second = loop.run_until_complete(aio.evaluate(limits, now=T0))
    assert first.allowed and not second.allowed
    assert set(seen) == {threading.get_ident()} and len(seen) >= 6  # 3 nodes, twice


def test_a_refusal_on_one_primary_refunds_the_others_awaited(client, loop):
    _, aio = twins(client)
    limits = _spread(client)
    loop.run_until_complete(aio.evaluate(limits[:1], now=T0))  # the first one is spent
    refused = loop.run_until_complete(aio.evaluate(limits, now=T0))
    assert not refused.allowed
    assert [r.outcome.value for r in refused.results] == ["r", "o", "o"]
    # the other two were given back: each still admits its one request
    again = loop.run_until_complete(aio.evaluate(limits[1:], now=T0))
    assert again.allowed


def test_a_script_the_nodes_lost_is_loaded_again(client, loop):
    _, aio = twins(client)
    limits = _spread(client)
    assert loop.run_until_complete(aio.evaluate(limits[:1], now=T0)).allowed
    for node in client.get_primaries():
        client.get_redis_connection(node).script_flush()
    decision = loop.run_until_complete(aio.evaluate(limits, now=T0))
    assert not decision.allowed  # the count survived: the script ran again, after loading
    assert [r.outcome.value for r in decision.results] == ["r", "o", "o"]
    assert loop.run_until_complete(aio.evaluate(limits[1:], now=T0)).allowed


def test_read_version_and_release_are_awaited_too(client, loop):
    _, aio = twins(client)
    version = aio.twin.bump_version()
    assert loop.run_until_complete(aio.read_version()) == version
    slots = Limit("c", "concurrency", 1, 60, name="slots")
    held = loop.run_until_complete(aio.evaluate([slots], now=T0))
    assert held.allowed and held.token
    assert not loop.run_until_complete(aio.evaluate([slots], now=T0)).allowed
    loop.run_until_complete(aio.release(held))
    assert loop.run_until_complete(aio.evaluate([slots], now=T0)).allowed


def test_a_primary_out_of_reach_fails_fast_and_leaves_nothing_charged(loop):
    """A request whose limits live on two primaries, one of them dead: the awaited call
    fails as unavailable within the timeouts, the primary that charged gives the units
    back (all or nothing), and the breaker then fails calls at once."""

    small = RedisCluster(replicas=0).start()  # no replica: the dead primary stays dead
    try:
        client = _client(small.ports)
        victim = small.ports[0]
        breaker = CircuitBreaker(failures=1, cooldown=30)
        aio = AsyncClusterEngine(ClusterEngine(_client(small.ports), breaker=breaker),
                                 async_twin_client)

        def placed(name: str, on) -> Limit:
            for i in range(10_000):
                limit = Limit(f"ip:198.51.100.{i}", "fixed_window", 5, 60, name=name)
                if on(_port(client, limit)):
                    return limit
            raise AssertionError("no key on the wanted primary")

        alive = placed("alive", lambda p: p != victim)
        twin = placed("twin", lambda p: p != victim)
        dead = placed("dead", lambda p: p == victim)
        assert loop.run_until_complete(aio.evaluate([alive, dead], now=T0)).allowed
        fresh = ClusterEngine(_client(small.ports))  # to read what stayed, without a breaker
        small.kill(victim)
        began = time.monotonic()
        with pytest.raises(EngineUnavailable):
            loop.run_until_complete(aio.evaluate([alive, dead], now=T0 + 1))
        assert time.monotonic() - began < 4 * TIMEOUT + 1.0
        with pytest.raises(EngineUnavailable, match="circuit open"):  # at once, now
            loop.run_until_complete(aio.evaluate([alive], now=T0 + 1))
        # nothing stayed charged on the live primary: `alive` has its first request only,
        # as `twin` has after one
        after = fresh.evaluate([alive], now=T0 + 2).results[0]
        other = fresh.evaluate([twin], now=T0 + 2).results[0]
        assert after.remaining == other.remaining - 1
        fresh.close()
        client.close()
    finally:
        small.stop()
