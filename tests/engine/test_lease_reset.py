"""A reset of a client under a leased limit (the admin's, `manage.py ratelimits reset`)
never lets its window admit more than the limit: the units other processes leased before
the reset are spent without asking the store, so the reset keeps them counted, and units
leased before it can no longer be given back (lua/lease.lua, and its PostgreSQL twin: the
same scenarios on both)."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest
import redis
import redis.cluster

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.lease import LEASE_SECONDS, Leftover
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from tests.engine.conftest import T0, stored_count

MINUTE = 60.0
WINDOW = int(T0 // MINUTE)


def fixed(batch: int = 50, limit: int = 120) -> Limit:
    return Limit("client", "fixed_window", limit, MINUTE, name="fw", batch=batch)


def sliding(batch: int = 50, limit: int = 100) -> Limit:
    return Limit("client", "sliding_window", limit, MINUTE, name="sw", batch=batch)


@pytest.fixture
def engine(leasing_engine: RedisEngine | PostgresEngine) -> RedisEngine | PostgresEngine:
    """The store engine a scenario runs on: Redis, then PostgreSQL."""
    return leasing_engine


# -- the script, at explicit times ----------------------------------------------------------


def test_a_reset_keeps_the_units_leases_may_still_spend(engine):
    limit = fixed()
    engine.lease([limit], now=T0 + 1)
    engine.lease([limit], now=T0 + 1.1)
    assert stored_count(engine, limit, WINDOW) == 100
    engine.reset(limit, now=T0 + 1.5)  # the two leases may still run: their 100 stay
    assert stored_count(engine, limit, WINDOW) == 100
    assert engine.lease([limit], now=T0 + 1.6)[0].units == 20  # what the limit has left


def test_a_reset_after_the_leases_ended_frees_the_whole_window(engine):
    limit = fixed()
    engine.lease([limit], now=T0 + 1)
    engine.reset(limit, now=T0 + 1 + 2 * LEASE_SECONDS)
    assert stored_count(engine, limit, WINDOW) == 0
    assert [engine.lease([limit], now=T0 + 4)[0].units for _ in range(3)] == [50, 50, 20]


def test_a_reset_keeps_only_the_leases_of_the_last_lease_period(engine):
    limit = fixed()
    engine.lease([limit], now=T0 + 1.2)  # ended by T0 + 2.2
    engine.lease([limit], now=T0 + 2.5)  # may run until T0 + 3.5
    engine.reset(limit, now=T0 + 3.2)
    assert stored_count(engine, limit, WINDOW) == 50


def test_units_leased_before_a_reset_are_not_taken_back(engine):
    limit = fixed()
    old = engine.lease([limit], now=T0 + 1)[0]
    engine.reset(limit, now=T0 + 5)  # the lease ended: nothing kept
    new = engine.lease([limit], now=T0 + 6)[0]  # another process's, after the reset
    assert new.epoch == old.epoch + 1 and stored_count(engine, limit, WINDOW) == 50
    # the old lease's unspent units come back to nothing: they are not in the count
    assert engine.give_back([Leftover(limit, old.window, 49, old.epoch)], now=T0 + 7) == 0
    assert stored_count(engine, limit, WINDOW) == 50
    # the new one's do
    assert engine.give_back([Leftover(limit, new.window, 30, new.epoch)], now=T0 + 7) == 30
    assert stored_count(engine, limit, WINDOW) == 20


def test_a_sliding_window_reset_drops_the_previous_window_and_keeps_live_leases(engine):
    limit = sliding()
    engine.lease([limit], now=T0 + 50)
    assert engine.lease([limit], now=T0 + MINUTE + 1)[0].units == 50  # 49.2 weigh in: 1 left
    engine.reset(limit, now=T0 + MINUTE + 1.5)
    # the previous window's count goes; the live lease's 50 stay in the current one
    assert stored_count(engine, limit, WINDOW) == 0
    assert stored_count(engine, limit, WINDOW + 1) == 50
    assert engine.lease([limit], now=T0 + MINUTE + 1.6)[0].units == 50


def test_a_reset_of_a_client_that_never_leased_in_this_window_empties_it(engine):
    limit = fixed()
    unleased = dataclasses.replace(limit, batch=None)
    for _ in range(5):
        engine.evaluate([unleased], now=T0 + 1)
    engine.reset(limit, now=T0 + 2)
    assert stored_count(engine, limit, WINDOW) == 0


# -- several processes race on one window --------------------------------------------------

PROCS = 4
RACE_LIMIT, RACE_BATCH = 100, 20


def _race_limit() -> Limit:
    return Limit("hot", "fixed_window", RACE_LIMIT, MINUTE, name="reset-race",
                 batch=RACE_BATCH)


def _store(url: str) -> RedisEngine | PostgresEngine:
    """A store engine on `url` (Redis or PostgreSQL, by its scheme), in this process."""
    if url.startswith("postgresql"):
        return PostgresEngine(url, timeout=30)  # a loaded machine's racers wait their turn
    return RedisEngine(redis.Redis.from_url(url))


def _worker(url: str, lease_at: float, spend_at: float, barrier, reports) -> None:
    front = LocalFirst(_store(url))
    limit = _race_limit()
    assert front.evaluate([limit], now=lease_at).allowed  # a lease of 20, one spent
    barrier.wait(30)  # every process holds its lease ...
    barrier.wait(30)  # ... and the client was reset meanwhile
    admitted = 0
    while front.evaluate([limit], now=spend_at).allowed:
        admitted += 1
    reports.append(admitted)


def race(url: str, lease_at: float, reset_at: float, spend_at: float) -> list[int]:
    """PROCS processes lease, an admin process resets the client, then they spend all
    they can: what each admitted after the reset."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCS + 1)
    with ctx.Manager() as manager:
        reports = manager.list()
        procs = [ctx.Process(target=_worker, args=(url, lease_at, spend_at, barrier, reports))
                 for _ in range(PROCS)]
        for p in procs:
            p.start()
        barrier.wait(30)
        admin = LocalFirst(_store(url))
        admin.reset(_race_limit(), now=reset_at)
        admin.close()
        barrier.wait(30)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        return list(reports)


@pytest.fixture(params=["redis", "postgres"])
def shared(request: pytest.FixtureRequest):
    """A store's URL for the racing processes, and an engine on it that reads the count."""
    if request.param == "redis":
        request.getfixturevalue("redis_client")  # its database emptied for the test
        url = request.getfixturevalue("redis_url")
    else:
        url = request.getfixturevalue("postgres_url")
    engine = _store(url)
    yield url, engine
    engine.close()


def test_a_reset_while_processes_hold_leases_admits_no_more_than_the_limit(shared):
    # 4 x 20 leased, 4 spent, 76 held when the client is reset: the window has 20 left
    url, engine = shared
    admitted = race(url, T0 + 1, T0 + 1.2, T0 + 1.5)
    assert sum(admitted) == PROCS * (RACE_BATCH - 1) + (RACE_LIMIT - PROCS * RACE_BATCH)
    assert stored_count(engine, _race_limit(), WINDOW) <= RACE_LIMIT
    print(f"after a reset with leases held: {sum(admitted)} admitted ({admitted}) "
          f"against {RACE_LIMIT}")


def test_leases_that_ended_before_a_reset_give_nothing_back_after_it(shared):
    # the leases ended before the reset: it frees the whole window, and the 76 units they
    # held, given back with the next lease calls, are not taken off the new count
    url, engine = shared
    admitted = race(url, T0 + 1, T0 + 1 + 2 * LEASE_SECONDS, T0 + 3.5)
    assert sum(admitted) == RACE_LIMIT
    assert stored_count(engine, _race_limit(), WINDOW) == RACE_LIMIT


@pytest.mark.slow
def test_a_reset_on_a_cluster_keeps_the_units_leases_may_still_spend(cluster):
    from ratelimits.engine.cluster import ClusterEngine

    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    engine = ClusterEngine(client, stats=False)
    try:
        limit = fixed()
        old = engine.lease([limit], now=T0 + 1)[0]
        engine.reset(limit, now=T0 + 1.5)
        assert engine.lease([limit], now=T0 + 1.6)[0].units == 50  # 120 - 50 kept: 70
        engine.reset(limit, now=T0 + 5)
        assert engine.give_back([Leftover(limit, old.window, 50, old.epoch)],
                                now=T0 + 6) == 0
        assert [g.units for g in (engine.lease([limit], now=T0 + 6)[0] for _ in range(3))] \
            == [50, 50, 20]
    finally:
        engine.close()
        client.close()
