"""The deny cache: refusals remembered in process, in front of a real store.

Every scenario gives the engine its time, and counts the scripts the store ran (INFO
commandstats of the private test server, or of every primary of the cluster).
"""

from __future__ import annotations

import time

import pytest
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.local_first import HOLD, DenyCache, LocalFirst
from ratelimits.engine.types import Outcome
from tests.engine.conftest import T0
from tests.redis_server import script_calls

LOGIN = Limit("ip:203.0.113.9", "fixed_window", 2, 60.0, name="login")


def _scripts(client) -> int:
    stats = client.info("commandstats")
    if isinstance(client, redis.cluster.RedisCluster):  # {node: stats}
        return sum(int(s.get("cmdstat_evalsha", {}).get("calls", 0)) for s in stats.values())
    return script_calls(client)


@pytest.fixture
def store(redis_client):
    return RedisEngine(redis_client, version_key="rl:version")


@pytest.fixture
def front(store):
    yield LocalFirst(store)
    store.close()


def _spend(front: LocalFirst, limit: Limit = LOGIN, at: float = T0) -> None:
    for _ in range(limit.limit):
        assert front.evaluate([limit], now=at).allowed


def test_a_refusal_is_answered_in_process_until_the_hold_ends(front, redis_client):
    _spend(front)
    first = front.evaluate([LOGIN], now=T0 + 0.1)  # the store refuses: remembered
    assert not first.allowed
    scripts = _scripts(redis_client)
    for step in range(1, 10):
        at = T0 + 0.1 + step * HOLD / 10 - 0.001
        local = front.evaluate([LOGIN], now=at)
        assert not local.allowed
        # an honest Retry-After: the store's, less the time since
        assert local.results[0].retry_after == pytest.approx(first.results[0].retry_after
                                                             - (at - T0 - 0.1))
        assert local.retry_after == first.retry_after - (1 if step >= 10 else 0)
    assert _scripts(redis_client) == scripts  # not one round trip
    # the hold is over: the store decides again (and still refuses: the window is 60 s)
    assert not front.evaluate([LOGIN], now=T0 + 0.1 + HOLD).allowed
    assert _scripts(redis_client) == scripts + 1


def test_a_short_retry_time_ends_the_refusal_sooner(front, redis_client):
    # a window that ends 0.3 s after the refusal: at its end the client may pass again
    limit = Limit("ip:203.0.113.9", "fixed_window", 1, 1.0, name="short")
    assert front.evaluate([limit], now=T0 + 0.5).allowed
    refused = front.evaluate([limit], now=T0 + 0.7)
    assert refused.results[0].retry_after == pytest.approx(0.3)
    scripts = _scripts(redis_client)
    assert not front.evaluate([limit], now=T0 + 0.99).allowed
    assert _scripts(redis_client) == scripts
    assert front.evaluate([limit], now=T0 + 1.0).allowed  # the store, in a new window
    assert _scripts(redis_client) == scripts + 1


def test_local_refusals_reach_counters_and_offenders(front, store):
    _spend(front)
    for i in range(5):
        assert not front.evaluate([LOGIN], now=T0 + 0.1 + i / 10).allowed
    minute, hour = int(T0 // 60), int(T0 // 3600)
    # read through the engine: this process's tally is sent first
    assert front.counters("login", minute) == {"a": 2, "r": 5}
    assert front.offenders("login", hour) == [("ip:203.0.113.9", 5)]


def test_the_next_script_call_carries_the_tally(front, store, redis_client, monkeypatch):
    from ratelimits.engine import tally

    store.tally.every = 30.0  # the background flush stays out of this test
    _spend(front)
    for i in range(4):
        assert not front.evaluate([LOGIN], now=T0 + 0.1 + i / 10).allowed
    assert store.tally.pending()
    later = time.monotonic() + 16  # the counts are due
    monkeypatch.setattr(tally.time, "monotonic", lambda: later)
    other = Limit("ip:198.51.100.1", "fixed_window", 2, 60.0, name="login")
    scripts = _scripts(redis_client)
    assert front.evaluate([other], now=T0 + 0.5).allowed  # a call made anyway ...
    assert _scripts(redis_client) == scripts + 1  # ... and no call of its own
    raw = redis_client.hgetall(f"rl:s:login:{int(T0 // 60)}")
    assert {k.decode(): int(v) for k, v in raw.items()} == {"a": 2, "r": 4}
    assert store.tally.take()[0] == {("login", int(T0 // 60)): {"a": 1}}  # the new one


def test_other_limits_of_a_refused_request_are_spared_and_shadow_reported(front):
    watch = Limit("ip:203.0.113.9", "gcra", 1, 60.0, shadow=True, name="watch")
    wide = Limit("global", "fixed_window", 1000, 60.0, name="wide")
    _spend(front, LOGIN)
    assert front.evaluate([watch], now=T0).allowed  # its one request a minute
    first = front.evaluate([LOGIN, watch, wide], now=T0 + 0.1)
    assert [r.outcome for r in first.results] == [Outcome.REJECTED, Outcome.WOULD_REJECT,
                                                  Outcome.SPARED]
    local = front.evaluate([LOGIN, watch, wide], now=T0 + 0.2)
    assert [r.outcome for r in local.results] == [Outcome.REJECTED, Outcome.WOULD_REJECT,
                                                  Outcome.SPARED]
    assert not local.allowed and local.rejected_by[0].limit == LOGIN
    assert local.would_reject[0].limit == watch


def test_a_shadow_refusal_alone_never_answers(front, redis_client):
    watch = Limit("ip:203.0.113.9", "fixed_window", 1, 60.0, shadow=True, name="watch")
    assert front.evaluate([watch], now=T0).allowed
    assert front.evaluate([watch], now=T0 + 0.1).would_reject
    scripts = _scripts(redis_client)
    assert front.evaluate([watch], now=T0 + 0.2).allowed
    assert _scripts(redis_client) == scripts + 1


def test_a_concurrency_refusal_is_never_remembered(front, redis_client):
    slots = Limit("ip:203.0.113.9", "concurrency", 1, 60.0, name="slots")
    held = front.evaluate([slots], now=T0)
    assert held.allowed
    assert not front.evaluate([slots], now=T0 + 0.1).allowed
    front.release(held)  # the slot is free at once: the next request must see it
    assert front.evaluate([slots], now=T0 + 0.2).allowed


def test_a_reset_in_this_process_forgets_the_refusal(front):
    _spend(front)
    assert not front.evaluate([LOGIN], now=T0 + 0.1).allowed
    front.reset(LOGIN, now=T0 + 0.2)
    assert front.evaluate([LOGIN], now=T0 + 0.3).allowed


def test_an_edited_limit_is_a_different_entry(front):
    _spend(front)
    assert not front.evaluate([LOGIN], now=T0 + 0.1).allowed
    raised = Limit(LOGIN.key, LOGIN.algorithm, 5, LOGIN.period, name=LOGIN.name)
    assert front.evaluate([raised], now=T0 + 0.2).allowed  # the store decides the new limit


def test_a_flood_of_distinct_clients_keeps_the_cache_bounded():
    cache = DenyCache(size=100)
    from ratelimits.engine.types import Decision, Result

    for i in range(1_000):
        limit = Limit(f"ip:198.18.0.{i}", "fixed_window", 1, 60.0, name="login")
        cache.learn(Decision(False, (Result(limit, False, 0, 30.0, 30.0,
                                            outcome=Outcome.REJECTED),), 30), T0)
        assert len(cache) <= 100


def test_the_store_down_raises_as_before(front, private_redis):
    # no retries: redis-py's default three, with backoff, only make the failure slow
    dead = LocalFirst(RedisEngine(redis.Redis(port=private_redis.port, socket_timeout=0.2,
                                              retry=Retry(NoBackoff(), 0))))
    private_redis.stop()
    from ratelimits.engine import EngineUnavailable

    with pytest.raises(EngineUnavailable):
        dead.evaluate([LOGIN], now=T0)


def test_on_a_cluster_too(cluster):
    client = redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode("127.0.0.1", p) for p in cluster.ports])
    client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    engine = ClusterEngine(client)
    front = LocalFirst(engine)
    try:
        _spend(front)
        assert not front.evaluate([LOGIN], now=T0 + 0.1).allowed
        scripts = _scripts(client)
        for i in range(5):
            assert not front.evaluate([LOGIN], now=T0 + 0.2 + i / 10).allowed
        assert _scripts(client) == scripts
        assert front.counters("login", int(T0 // 60)) == {"a": 2, "r": 6}
    finally:
        engine.close()
        client.close()
