"""What only the Redis backend does: keys, TTLs, scripts, server time, round trips."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import ALGORITHMS, EngineUnavailable, Limit, RedisEngine, keynames
from ratelimits.engine.aio import AsyncRedisEngine
from ratelimits.engine.heartbeat import BEAT_EVERY
from ratelimits.engine.keynames import (
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    offender_errors_key,
    offenders_key,
)
from ratelimits.engine.tally import discard_all
from tests.engine.conftest import T0

# a client's own key, or a window algorithm's shard of a policy (8 + 3 characters)
KEY = re.compile(r"^rl:\{([A-Za-z0-9_-]{16}|[A-Za-z0-9_-]{8}[0-9a-f]{3})\}:[a-z]{1,2}(:\d+)?$")


def limit_for(algorithm: str, key: str = "client", **kwargs) -> Limit:
    return Limit(key, algorithm, 5, 60, name="p", **kwargs)


@pytest.fixture
def engine(redis_client):
    return RedisEngine(redis_client, version_key="rl:version")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_key_has_a_ttl_no_longer_than_needed(engine, redis_client, algorithm):
    """Each key lives exactly as long as its state matters: until the limit is reset."""
    decision = engine.evaluate([limit_for(algorithm)], now=T0 + 10)
    reset_ms = decision.results[0].reset_after * 1000
    assert 10_000 <= reset_ms <= 120_000  # two periods at most (the previous window)
    keys = [k.decode() for k in redis_client.keys("rl:{*")]
    assert len(keys) == 1
    for key in keys:
        assert KEY.match(key), key
        ttl = redis_client.pttl(key)
        # not a millisecond more than the state needs, and no less (a second of slack
        # for the time this test takes)
        assert reset_ms - 1_000 < ttl <= reset_ms, (key, ttl, reset_ms)


def test_stats_keys_expire_after_a_day_and_an_hour(engine, redis_client):
    engine.evaluate([limit_for("gcra")])
    engine.flush()  # the counts are tallied in process, sent within a second
    (key,) = redis_client.keys("rl:s:*")
    assert STATS_TTL - 5 < redis_client.ttl(key) <= STATS_TTL


@pytest.mark.parametrize(
    "client_key",
    ["x" * 1_000_000, "\x00\x01\n\r", "caf\u00e9 \U0001f600", "\udcff invalid utf-8", ""],
)
def test_any_client_key_becomes_one_fixed_length_key(engine, redis_client, client_key):
    decision = engine.evaluate([limit_for("fixed_window", client_key)])
    assert decision.allowed
    (key,) = redis_client.keys("rl:{*")
    assert KEY.match(key.decode()) and len(key) < 40


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_window_clients_are_fields_of_a_few_small_hashes(redis_client, monkeypatch,
                                                          algorithm):
    """No key per client: 300 clients of one policy fill one compact hash per shard and
    window, each client's count is its own, and the hashes expire with their window."""
    monkeypatch.setattr(keynames, "WINDOW_SHARDS", 8)
    keynames._cell.cache_clear()
    try:
        engine = RedisEngine(redis_client)
        clients = [Limit(f"10.0.{i // 256}.{i % 256}", algorithm, 2, 60, name="p")
                   for i in range(300)]
        admitted = sum(engine.evaluate([c], now=T0 + 1 + t).allowed
                       for t in range(3) for c in clients)
        assert admitted == 2 * len(clients)
        hashes = redis_client.keys("rl:{*")
        assert len(hashes) == 8
        assert {redis_client.object("encoding", k) for k in hashes} == {b"listpack"}
        assert sum(redis_client.hlen(k) for k in hashes) == len(clients)
        ttl = [redis_client.pttl(k) for k in hashes]
        window_end = (60 if algorithm == "fixed_window" else 120) * 1000
        # T0 is a whole number of minutes: a window's end, 59 s after the first writes
        # (and a second of slack for the time this test takes)
        assert all(window_end - 2_000 <= t <= window_end - 1_000 for t in ttl), ttl
        engine.reset(clients[0], now=T0 + 5)
        assert engine.evaluate([clients[0]], now=T0 + 5).allowed
        assert not engine.evaluate([clients[1]], now=T0 + 5).allowed
    finally:
        keynames._cell.cache_clear()


def test_limits_of_one_policy_and_client_share_a_hash_slot(engine, redis_client):
    engine.evaluate([limit_for("sliding_window")], now=T0)
    engine.evaluate([limit_for("sliding_window")], now=T0 + 60)
    keys = redis_client.keys("rl:{*")
    assert len(keys) == 2
    assert len({k.split(b"}")[0] for k in keys}) == 1


def test_time_comes_from_the_server(engine, redis_client, monkeypatch):
    """With this host's clock a day and half an hour ahead, the Redis engine still decides
    on the server's clock: the window, its reset time, the key's TTL, the counters' minute
    and reset()."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400 + 1_800)
    limit = Limit("c", "fixed_window", 1, 3600, name="p")
    decision = engine.evaluate([limit])
    server_now = redis_client.time()[0]
    assert abs(time.time() - server_now - 88_200) < 5  # the shift is in force
    expected = 3600 - server_now % 3600
    assert abs(decision.results[0].reset_after - expected) <= 2
    (key,) = (k.decode() for k in redis_client.keys("rl:{*"))
    assert key.endswith(f":{server_now // 3600}")  # the server's hour names the window
    assert abs(redis_client.pttl(key) / 1000 - expected) <= 2
    engine.flush()
    (stats,) = (k.decode() for k in redis_client.keys("rl:s:*"))
    assert abs(int(stats.rsplit(":", 1)[1]) - server_now // 60) <= 1
    assert not engine.evaluate([limit]).allowed
    engine.reset(limit)  # the server's current window is the one forgotten
    assert engine.evaluate([limit]).allowed


@pytest.mark.parametrize("side", ["blocking", "asyncio"])
def test_script_flush_is_survived(redis_url, redis_client, side):
    """SCRIPT FLUSH and FUNCTION FLUSH (a restart without persistence): the next call
    loads the batch function, and the heartbeat riding on it its script, again; on the
    blocking engine and on its asyncio twin alike (they run the same flows)."""
    engine = RedisEngine(redis_client, version_key="rl:version", live_key="rl:live")
    beat = engine.heartbeat
    assert beat is not None
    at = [0.0]
    beat.clock = lambda: at[0]
    loop = asyncio.new_event_loop()
    if side == "blocking":
        evaluate, read_version = engine.evaluate, engine.read_version
    else:
        twin = AsyncRedisEngine(engine, lambda: redis.asyncio.Redis.from_url(redis_url))

        def evaluate(limits, now):
            return loop.run_until_complete(twin.evaluate(limits, now))

        def read_version():
            return loop.run_until_complete(twin.read_version())

    def flushed() -> None:
        redis_client.script_flush()
        redis_client.function_flush()
        beat.count = None  # learnt again below, or the beat failed
        at[0] += BEAT_EVERY  # the next call carries a beat

    limit = limit_for("sliding_log")
    try:
        assert evaluate([limit], T0).results[0].remaining == 4
        assert engine.live_instances == 1
        flushed()
        assert evaluate([limit], T0).results[0].remaining == 3
        assert engine.live_instances == 1
        flushed()
        assert read_version() == 0
        assert engine.live_instances == 1
    finally:
        loop.close()
        engine.close()


def test_a_flushed_library_is_loaded_again(engine, redis_client):
    limit = limit_for("gcra")
    assert engine.evaluate([limit], now=T0).results[0].remaining == 4
    redis_client.function_flush()
    assert engine.evaluate([limit], now=T0).results[0].remaining == 3
    assert engine.script.mode == "fcall"


def test_without_functions_the_same_script_runs_by_evalsha(private_redis):
    """A user whose ACL denies Functions (as a server without them, Redis 6, answers an
    unknown command) gets the same decisions from EVALSHA of the same script."""
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-function", "-fcall", "-fcall_ro"])
    client = redis.Redis(port=private_redis.port, username="app", password="pw")
    engine = RedisEngine(client)
    limit = limit_for("sliding_log")
    assert [engine.evaluate([limit], now=T0).allowed for _ in range(6)] == [True] * 5 + [False]
    assert engine.script.mode == "evalsha"
    stats = admin.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 6 + 1  # the first met NOSCRIPT
    assert stats["cmdstat_fcall"]["rejected_calls"] == 1  # asked once, never again
    client.close()
    admin.close()


def test_one_round_trip_for_any_number_of_limits(private_redis):
    redis_client = redis.Redis.from_url(private_redis.url)
    engine = RedisEngine(redis_client, version_key="rl:version")
    # the tally's flush (a script of its own, from a thread) stays out of the count
    engine.tally.every = 30.0
    limits = [Limit(f"c{i}", a, 5, 60, name=f"p{i}") for i, a in enumerate(ALGORITHMS * 3)]
    engine.evaluate(limits, now=T0)  # loads the library
    before = redis_client.info("commandstats")
    for _ in range(10):
        engine.evaluate(limits, now=T0)
    after = redis_client.info("commandstats")

    def calls(stats, name):
        return stats.get(f"cmdstat_{name}", {}).get("calls", 0)

    assert calls(after, "fcall") - calls(before, "fcall") == 10
    assert calls(after, "evalsha") == calls(before, "evalsha")
    assert calls(after, "eval") == calls(before, "eval")


def test_counts_are_tallied_and_ride_a_call_about_twice_a_second(private_redis, monkeypatch):
    """The script counts nothing; the process adds each policy's outcomes up and a call
    carries them once they are half a flush interval old: one HINCRBY per policy and
    outcome, not one per request."""
    from ratelimits.engine import tally

    client = redis.Redis.from_url(private_redis.url)
    engine = RedisEngine(client)
    engine.tally.every = 30.0  # the background flush stays out of this test
    limit = Limit("c", "gcra", 40, 60, name="p")  # gcra: no HINCRBY of its own
    for _ in range(50):
        engine.evaluate([limit], now=T0)

    def hincrbys():
        return client.info("commandstats").get("cmdstat_hincrby", {}).get("calls", 0)

    assert hincrbys() == 0 and engine.tally.pending()
    later = time.monotonic() + 16
    monkeypatch.setattr(tally.time, "monotonic", lambda: later)
    engine.evaluate([limit], now=T0)  # carries the fifty, counts itself
    assert hincrbys() == 2  # a: 40, r: 10
    raw = client.hgetall(f"rl:s:p:{int(T0 // 60)}")
    assert {k.decode(): int(v) for k, v in raw.items()} == {"a": 40, "r": 10}
    assert engine.counters("p", int(T0 // 60)) == {"a": 40, "r": 11}  # tally sent first
    client.close()


def test_an_unreachable_server_raises_engine_unavailable():
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    engine = RedisEngine(client)
    with pytest.raises(EngineUnavailable):
        engine.evaluate([limit_for("gcra")])


def test_offender_lists_and_their_errors_are_bounded_and_expire(engine, redis_client):
    limit = Limit("", "fixed_window", 1, 60, name="p")
    for i in range(OFFENDERS_CAP + 30):  # a full list, then 30 entrants with an error
        if i == OFFENDERS_CAP:  # (a process sends a policy-hour's OFFENDERS_CAP at most)
            engine.flush()
        for _ in range(2):
            engine.evaluate([replace(limit, key=f"c{i}")], now=T0)
    engine.flush()
    hour = int(T0 // 3600)
    members, errors = offenders_key("rl:", "p", hour), offender_errors_key("rl:", "p", hour)
    assert redis_client.zcard(members) == OFFENDERS_CAP
    assert 0 < redis_client.hlen(errors) <= OFFENDERS_CAP
    for key in (members, errors):
        assert OFFENDERS_TTL - 5 < redis_client.ttl(key) <= OFFENDERS_TTL, key


def test_discarded_counts_never_reach_the_store(redis_client):
    """What the suite does between tests: an engine a test left open sends nothing
    into the next test's database, even when it is closed (or flushes) later."""
    engine = RedisEngine(redis_client)
    limit = Limit("x", "fixed_window", 1, 60, name="p")
    for _ in range(2):
        engine.evaluate([limit], now=T0)
    discard_all()
    engine.close()  # sends what is still tallied: nothing
    assert engine.offenders("p", int(T0 // 3600)) == []
    assert engine.counters("p", int(T0 // 60)) == {}
