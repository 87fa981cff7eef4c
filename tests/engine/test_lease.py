"""Leases on a real Redis and a real PostgreSQL: what lua/lease.lua and its twin
`ratelimits_lease_v1` grant and take back at explicit times (the same scenarios on
both), the process's book of leases, and the engine calls' failures."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import EngineUnavailable, Limit, MemoryEngine, RedisEngine
from ratelimits.engine.aio import AsyncRedisEngine
from ratelimits.engine.keynames import base_key, cell
from ratelimits.engine.lease import LEASE_SECONDS, Grant, Leases, Leftover
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from tests.engine.conftest import T0, stored_count

MINUTE = 60.0
WINDOW = int(T0 // MINUTE)  # T0 is aligned: the window that starts at T0


def fixed(batch: int = 50, limit: int = 120, cost: int = 1) -> Limit:
    return Limit("client", "fixed_window", limit, MINUTE, cost=cost, name="fw", batch=batch)


def sliding(batch: int = 50, limit: int = 100, cost: int = 1) -> Limit:
    return Limit("client", "sliding_window", limit, MINUTE, cost=cost, name="sw", batch=batch)


def unleased(limit: Limit) -> Limit:
    return dataclasses.replace(limit, batch=None)


@pytest.fixture
def redis_engine(redis_client: redis.Redis) -> RedisEngine:
    return RedisEngine(redis_client)


@pytest.fixture
def engine(leasing_engine: RedisEngine | PostgresEngine) -> RedisEngine | PostgresEngine:
    """The store engine a scenario runs on: Redis, then PostgreSQL."""
    return leasing_engine


def count(client: redis.Redis, limit: Limit, window: int = WINDOW) -> int:
    key, field = cell("rl:", limit)
    return int(client.hget(f"{key}:{window}", field) or 0)


# -- the script -------------------------------------------------------------------------


def test_a_fixed_window_grants_the_batch_then_the_rest_then_none(engine):
    limit = fixed()
    first, second, third, fourth = (engine.lease([limit], now=T0 + 10)[0] for _ in range(4))
    assert (first.units, first.remaining) == (50, 70)
    assert (second.units, second.remaining) == (50, 20)
    assert (third.units, third.remaining) == (20, 0)  # partial: what the window had left
    assert (fourth.units, fourth.remaining) == (0, 0)
    assert fourth.retry_after == 50.0  # the window's end
    assert first.ends_after == first.reset_after == 50.0
    assert first.window == WINDOW
    assert stored_count(engine, limit, WINDOW) == 120  # charged when granted, not when spent
    # the next window grants again
    assert engine.lease([limit], now=T0 + MINUTE)[0].units == 50


def test_a_grant_is_at_least_the_cost_or_nothing(engine):
    limit = fixed(batch=10, limit=12, cost=3)
    assert engine.lease([limit], now=T0)[0].units == 10
    none = engine.lease([limit], now=T0 + 1)[0]
    assert none.units == 0  # 2 left, one request needs 3: none is taken
    assert none.remaining == 2
    assert stored_count(engine, limit, WINDOW) == 10


def test_leased_and_unleased_requests_share_one_count(engine):
    limit = fixed(limit=60)
    engine.lease([limit], now=T0)
    decision = engine.evaluate([unleased(limit)], now=T0 + 1)
    assert decision.allowed and decision.results[0].remaining == 9
    for _ in range(9):
        engine.evaluate([unleased(limit)], now=T0 + 2)
    assert engine.lease([limit], now=T0 + 3)[0].units == 0
    assert not engine.evaluate([unleased(limit)], now=T0 + 3).allowed


def test_give_back_returns_units_to_the_current_window_only(engine):
    limit = fixed()
    grant = engine.lease([limit], now=T0 + 5)[0]
    assert engine.give_back([Leftover(limit, grant.window, 20)], now=T0 + 6) == 20
    assert stored_count(engine, limit, WINDOW) == 30
    # more than was counted: never below zero
    assert engine.give_back([Leftover(limit, grant.window, 500)], now=T0 + 7) == 30
    assert stored_count(engine, limit, WINDOW) == 0
    # a window that ended keeps its count
    engine.lease([limit], now=T0 + 8)
    assert engine.give_back([Leftover(limit, grant.window, 50)], now=T0 + MINUTE + 1) == 0
    assert stored_count(engine, limit, WINDOW) == 50


def test_give_back_keeps_the_window_key_expiry(redis_engine, redis_client):
    limit = fixed()
    redis_engine.lease([limit], now=T0 + 30)
    redis_engine.give_back([Leftover(limit, WINDOW, 10)], now=T0 + 31)
    key = f"{cell('rl:', limit)[0]}:{WINDOW}"
    assert 0 < redis_client.pttl(key) <= 30_000


def test_give_back_and_a_new_lease_in_one_call(engine):
    limit = fixed(limit=100)
    engine.lease([limit], now=T0)
    engine.lease([limit], now=T0)  # the window is spent
    # 30 units of the first lease come back before the new lease is counted
    grant = engine.lease([limit], now=T0 + 1, back=[Leftover(limit, WINDOW, 30)])[0]
    assert grant.units == 30
    assert stored_count(engine, limit, WINDOW) == 100


def test_a_sliding_window_grant_counts_the_previous_window_by_its_weight(engine):
    limit = sliding(limit=100)
    assert [engine.lease([limit], now=T0 + 10)[0].units for _ in range(3)] == [50, 50, 0]
    # 10 s into the next window the previous 100 weigh 100 * 50/60 = 83.3: 16 are left
    grant = engine.lease([limit], now=T0 + MINUTE + 10)[0]
    assert grant.units == 16
    assert grant.window == WINDOW + 1
    # the grant ends with its window, not at the estimate's reset a period later
    assert grant.ends_after == 50.0
    assert grant.reset_after == 110.0
    # the unleased check agrees: the window is full
    refused = engine.evaluate([unleased(limit)], now=T0 + MINUTE + 10)
    assert not refused.allowed
    none = engine.lease([limit], now=T0 + MINUTE + 10)[0]
    assert none.units == 0
    assert none.retry_after == refused.results[0].retry_after  # the same honest wait
    assert none.remaining == refused.results[0].remaining
    # as the previous window's weight falls, more can be leased (6 s: 10 units of weight)
    assert engine.lease([limit], now=T0 + MINUTE + 16)[0].units == 10


def test_a_sliding_window_lease_never_lets_the_estimate_exceed_the_limit(engine):
    # whatever mix of leases and single requests, the unleased check of cost 1 refuses
    # exactly when no unit is left to lease
    limit = sliding(batch=7, limit=40)
    for t in (0, 13, 29, 47, 60, 61, 75, 88, 101, 119):
        now = T0 + t
        while engine.lease([limit], now=now)[0].units:
            pass
        assert not engine.evaluate([unleased(limit)], now=now).allowed


def test_one_call_leases_several_limits_in_the_request_order(engine):
    a, b = fixed(batch=5, limit=5), sliding(batch=8)
    grants = engine.lease([a, b, dataclasses.replace(a, key="other")], now=T0)
    assert [(g.limit.name, g.units) for g in grants] == [("fw", 5), ("sw", 8), ("fw", 5)]


def test_the_lease_script_is_reloaded_after_a_script_flush(redis_engine, redis_client):
    limit = fixed()
    redis_engine.lease([limit], now=T0)
    redis_client.script_flush()
    assert redis_engine.lease([limit], now=T0)[0].units == 50
    redis_client.script_flush()
    assert redis_engine.give_back([Leftover(limit, WINDOW, 10)], now=T0) == 10


def test_the_asyncio_twin_reloads_the_lease_script_after_a_script_flush(
        redis_engine, redis_client, redis_url):
    twin = AsyncRedisEngine(redis_engine, lambda: redis.asyncio.Redis.from_url(redis_url))
    limit = fixed()
    redis_engine.lease([limit], now=T0)
    redis_client.script_flush()
    assert asyncio.run(twin.lease([limit], now=T0))[0].units == 50


def test_a_limit_without_batch_cannot_be_leased(engine):
    with pytest.raises(ValueError, match="no batch"):
        engine.lease([unleased(fixed())], now=T0)


def test_an_unreachable_store_raises_engine_unavailable():
    # no retries: redis-py's default three, with backoff, only make the failure slow
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    engine = RedisEngine(client)
    with pytest.raises(EngineUnavailable):
        engine.lease([fixed()], now=T0)
    with pytest.raises(EngineUnavailable):
        engine.give_back([Leftover(fixed(), WINDOW, 3)], now=T0)


def test_the_server_clock_is_used_without_now(engine):
    grant = engine.lease([fixed()])[0]
    assert grant.units == 50
    assert 0 < grant.ends_after <= MINUTE


# -- the book ---------------------------------------------------------------------------


def grant(limit: Limit, units: int, *, ends_after: float = 30.0, remaining: int = 100,
          window: int = WINDOW) -> Grant:
    return Grant(limit, units, window, remaining, ends_after, 0.0, ends_after)


def test_the_book_spends_units_until_the_lease_is_empty():
    book, limit = Leases(), fixed(batch=3)
    first = book.grant(grant(limit, 3), at=100.0)
    assert first is not None and first.remaining == 102  # as of the lease: 100 + 2 held
    holds = [book.take(limit, 100.1), book.take(limit, 100.2)]
    assert all(holds) and holds[-1].remaining == 100
    assert book.take(limit, 100.3) is None  # spent: a new lease is needed
    assert book.leftovers() == []  # nothing to give back


def test_a_lease_ends_after_a_second_or_at_its_window_end():
    book, limit = Leases(), fixed(batch=10)
    book.grant(grant(limit, 10), at=100.0)
    assert book.take(limit, 100.0 + LEASE_SECONDS - 0.01) is not None
    assert book.take(limit, 100.0 + LEASE_SECONDS) is None
    assert book.leftovers() == [Leftover(limit, WINDOW, 8)]
    book.grant(grant(limit, 10, ends_after=0.25), at=200.0)
    assert book.take(limit, 200.2) is not None
    assert book.take(limit, 200.25) is None  # the window ended first
    assert book.leftovers() == [Leftover(limit, WINDOW, 8)]


def test_a_cancelled_hold_puts_its_units_back():
    book, limit = Leases(), fixed(batch=4, cost=2)
    hold = book.grant(grant(limit, 4), at=100.0)
    assert hold is not None and book.units(limit) == 2
    book.cancel(hold)
    assert book.units(limit) == 4
    # the last units: the lease empties, and a cancel brings it back
    a, b = book.take(limit, 100.1), book.take(limit, 100.1)
    assert a and b and book.units(limit) == 0
    book.cancel(b)
    assert book.units(limit) == 2
    # a hold whose lease ended meanwhile goes back to the store
    book.take(limit, 100.0 + LEASE_SECONDS)  # ends the lease: 2 units to give back
    book.cancel(a)
    assert sorted(x.units for x in book.leftovers()) == [2, 2]


def test_a_grant_smaller_than_the_cost_is_handed_back():
    book, limit = Leases(), fixed(batch=10, cost=4)
    assert book.grant(grant(limit, 3), at=100.0) is None
    assert book.leftovers() == [Leftover(limit, WINDOW, 3)]


def test_a_new_grant_ends_the_old_lease():
    book, limit = Leases(), fixed(batch=10)
    book.grant(grant(limit, 10), at=100.0)
    book.grant(grant(limit, 10, window=WINDOW + 1), at=100.5)
    assert book.leftovers() == [Leftover(limit, WINDOW, 9)]
    assert book.units(limit) == 9


def test_quiet_clients_leases_end_and_give_back():
    book = Leases()
    quiet = [fixed(batch=5, limit=5) for _ in range(1)] + [
        dataclasses.replace(fixed(batch=5, limit=5), key=f"c{i}") for i in range(3)
    ]
    for limit in quiet:
        book.grant(grant(limit, 5), at=100.0)
    busy = dataclasses.replace(fixed(), key="busy")
    book.grant(grant(busy, 50), at=100.5)
    book.take(busy, 101.1)  # a second on: the sweep ends every lease that ran out
    assert len(book) == 1
    assert sum(x.units for x in book.leftovers()) == 4 * 4


def test_threads_never_spend_more_than_the_lease():
    book, limit = Leases(seconds=1e9), fixed(batch=1000, limit=1000)
    book.grant(grant(limit, 1000), at=0.0)
    taken: list[int] = []

    def spend() -> None:
        n = 0
        while book.take(limit, 1.0) is not None:
            n += 1
        taken.append(n)

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 999  # 1000 granted, one reserved by the grant itself


def test_a_forked_child_does_not_spend_its_parents_units():
    book, limit = Leases(), fixed(batch=10)
    book.grant(grant(limit, 10), at=100.0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, b"1" if book.take(limit, 100.1) is None else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert book.take(limit, 100.1) is not None  # the parent still has them


# -- the in-process engine --------------------------------------------------------------


def test_the_memory_engine_decides_a_leased_limit_exactly():
    # one process: nothing to lease; batch changes nothing, the limit holds exactly
    engine = MemoryEngine()
    limit = fixed(limit=1000)
    admitted: list[int] = []

    def run() -> None:
        admitted.append(sum(engine.evaluate([limit], now=T0 + 1).allowed for _ in range(200)))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 1000


# -- through LocalFirst: many processes, one limit ------------------------------------------

RACERS = 8
RACE_LIMIT, RACE_BATCH = 1000, 50
ATTEMPTS = 200  # at least 1,600 attempts for 1,000 units ...
RACE_SECONDS = 0.5  # ... over half a second, so that the processes interleave


def _race(engine_of, url_or_ports, start, reports) -> None:
    front = LocalFirst(engine_of(url_or_ports))
    limit = Limit("hot", "fixed_window", RACE_LIMIT, MINUTE, name="race", batch=RACE_BATCH)
    start.wait()
    began = time.monotonic()
    admitted = attempts = 0
    while attempts < ATTEMPTS or time.monotonic() - began < RACE_SECONDS:
        # time runs on from the start of an aligned minute: one window, leases that end
        # after a second as they would in production
        admitted += front.evaluate([limit], now=T0 + time.monotonic() - began).allowed
        attempts += 1
    reports.append(admitted)


def _redis_engine(url: str) -> RedisEngine:
    return RedisEngine(redis.Redis.from_url(url))


def _cluster_engine(port: int) -> Any:
    from ratelimits.engine.cluster import ClusterEngine

    return ClusterEngine(redis.cluster.RedisCluster(host="127.0.0.1", port=port), stats=False)


def race(engine_of, where, racers: int = RACERS) -> list[int]:
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    with ctx.Manager() as manager:
        reports = manager.list()
        procs = [ctx.Process(target=_race, args=(engine_of, where, start, reports))
                 for _ in range(racers)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        return list(reports)


def lease_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.slow
def test_eight_processes_never_admit_more_than_the_limit_and_lease_in_batches(private_redis):
    client = redis.Redis.from_url(private_redis.url)
    client.config_resetstat()
    admitted = race(_redis_engine, private_redis.url)
    total = sum(admitted)
    assert RACE_LIMIT - RACERS * RACE_BATCH <= total <= RACE_LIMIT
    key, field = cell("rl:", Limit("hot", "fixed_window", 1, MINUTE, name="race"))
    # charged before spent, never past the limit
    assert int(client.hget(f"{key}:{WINDOW}", field)) <= RACE_LIMIT
    # a lease call per 50 admissions, give or take each process's last partial lease, its
    # refusal (remembered for a second after) and the renewals of leases a second old
    calls = lease_calls(client)
    assert total / RACE_BATCH <= calls <= total / RACE_BATCH + 4 * RACERS
    print(f"admitted {total} of {RACE_LIMIT} ({admitted}); {calls} store calls")


def test_units_held_by_idle_processes_are_the_under_admission_bound(engine):
    # eight processes (eight books) each lease 50 and spend one, then go quiet; a ninth
    # spends the rest: the window refuses with 8 x 49 units held, the bound processes x
    # batch; a second later the quiet ones' leases end and their units come back
    limit = Limit("hot", "fixed_window", RACE_LIMIT, MINUTE, name="race", batch=RACE_BATCH)
    quiet = [LocalFirst(engine) for _ in range(RACERS)]
    assert all(front.evaluate([limit], now=T0 + 1).allowed for front in quiet)
    busy = LocalFirst(engine)
    admitted = RACERS
    while busy.evaluate([limit], now=T0 + 2).allowed:
        admitted += 1
    assert admitted == RACE_LIMIT - RACERS * (RACE_BATCH - 1)
    # their next requests, a second on: each lease ended, its 49 units go back with the
    # next lease call and come out again, so every quiet process admits once more
    assert all(front.evaluate([limit], now=T0 + 2 + LEASE_SECONDS).allowed for front in quiet)


@pytest.mark.slow
def test_processes_racing_on_a_cluster_never_admit_more_than_the_limit(cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    try:
        admitted = race(_cluster_engine, cluster.ports[0], racers=4)
        total = sum(admitted)
        assert RACE_LIMIT - 4 * RACE_BATCH <= total <= RACE_LIMIT
    finally:
        client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        client.close()


@pytest.mark.slow
def test_the_cluster_grants_and_takes_back_like_one_server(cluster):
    from ratelimits.engine.cluster import ClusterEngine

    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    engine = ClusterEngine(client, stats=False)
    try:
        # limits of many clients: their keys fall on every primary
        limits = [dataclasses.replace(fixed(batch=40, limit=100), key=f"c{i}")
                  for i in range(12)]
        nodes = {client.get_node_from_key(base_key("rl:", x)).name for x in limits}
        assert len(nodes) == 3
        grants = engine.lease(limits, now=T0 + 1)
        assert [(g.limit.key, g.units, g.remaining) for g in grants] == [
            (x.key, 40, 60) for x in limits]
        back = [Leftover(x, WINDOW, 15) for x in limits]
        again = engine.lease(limits, now=T0 + 2, back=back)
        assert [g.units for g in again] == [40] * 12 and [g.remaining for g in again] == [35] * 12
        assert engine.give_back(back, now=T0 + MINUTE) == 0  # the window has ended
        assert engine.give_back(back, now=T0 + 3) == 15 * 12
        # 65 - 15 counted: 50 left, one lease of 40 and then the last 10
        assert [g.units for g in engine.lease(limits[:2], now=T0 + 4)] == [40, 40]
        assert [g.units for g in engine.lease(limits[:2], now=T0 + 5)] == [10, 10]
    finally:
        engine.close()
        client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        client.close()


# -- calendar windows ------------------------------------------------------------------


def _local(*args: int, zone: str) -> float:
    import datetime as dt
    from zoneinfo import ZoneInfo

    return dt.datetime(*args, tzinfo=ZoneInfo(zone)).timestamp()


def test_a_leased_calendar_day_is_the_unleased_one(engine):
    """A day of Los Angeles with `batch`: the same count (its key, its window) as without,
    refused until local midnight, not until 00:00 UTC."""
    zone = "America/Los_Angeles"
    leased = Limit("u", "fixed_window", 30, 86_400, name="daily", calendar="day",
                   zone=zone, batch=10)
    plain = unleased(leased)
    store = engine
    process = LocalFirst(store)
    at = _local(2027, 1, 15, 7, 13, 17, zone=zone)
    midnight = _local(2027, 1, 16, 0, 0, zone=zone)
    assert midnight - at == 60_403
    assert all(process.evaluate([leased], now=at).allowed for _ in range(15))
    # two leases of 10 charged to the day's count, which the unleased limit reads
    day = int(_local(2027, 1, 15, 0, 0, zone=zone))
    assert stored_count(store, leased, day) == 20
    assert store.evaluate([plain], now=at).results[0].remaining == 9
    while store.evaluate([plain], now=at).allowed:
        pass
    assert all(process.evaluate([leased], now=at).allowed for _ in range(5))  # its lease
    refused = process.evaluate([leased], now=at + 1)
    assert not refused.allowed
    assert refused.retry_after == midnight - at - 1 == store.evaluate(
        [plain], now=at + 1).retry_after
    # a new day at local midnight, for both
    assert process.evaluate([leased], now=midnight).allowed
    assert store.evaluate([plain], now=midnight).results[0].remaining == 30 - 10 - 1


def test_a_leased_calendar_month_is_its_own_length(engine):
    month = Limit("acme", "fixed_window", 10, 30 * 86_400, name="plan", calendar="month",
                  zone="UTC", batch=5)
    process = LocalFirst(engine)
    feb = _local(2028, 2, 10, 12, 0, zone="UTC")  # a leap year: February has 29 days
    assert all(process.evaluate([month], now=feb).allowed for _ in range(10))
    refused = process.evaluate([month], now=feb + 1)
    assert refused.retry_after == _local(2028, 3, 1, zone="UTC") - feb - 1  # on the 1st
    assert process.evaluate([month], now=_local(2028, 3, 1, zone="UTC")).allowed


def test_a_reset_of_a_leased_calendar_window_frees_that_window(engine):
    day = Limit("u", "fixed_window", 2, 86_400, name="daily", calendar="day",
                zone="Europe/Paris", batch=2)
    store = engine
    at = _local(2027, 3, 28, 20, 0, zone="Europe/Paris")
    for _ in range(2):  # the day's count: 2
        assert store.evaluate([unleased(day)], now=at).allowed
    assert store.lease([day], now=at)[0].units == 0
    store.reset(day, now=at + 1)  # the reset of a leased limit (see lua/lease.lua)
    assert store.evaluate([unleased(day)], now=at + 2).allowed
    assert store.lease([day], now=at + 2)[0].units == 1
