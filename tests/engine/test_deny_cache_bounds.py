"""The deny cache (`local_first.DenyCache`) stays small under clients that come and go:
an expired refusal goes as new ones are learnt, and past `MAX_REMEMBERED` the oldest go,
so a flood of distinct refused clients costs each process a few megabytes at most."""

from __future__ import annotations

import tracemalloc

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.local_first import HOLD, MAX_REMEMBERED, DenyCache, LocalFirst
from ratelimits.engine.types import Decision, Outcome, Result
from tests.engine.conftest import T0

#: What the deny cache may hold at most (bytes) when it is full.
BUDGET = 6_000_000


def client(i: int) -> Limit:
    return Limit(f"ip:198.18.{i // 256 % 256}.{i % 256}/{i}", "fixed_window", 1, 60.0,
                 name="login")


def refused(limit: Limit) -> Decision:
    return Decision(False, (Result(limit, False, 0, 30.0, 30.0, outcome=Outcome.REJECTED),),
                    30)


def test_rotating_clients_refusals_go_once_expired(redis_client):
    # 50 new clients a second, each refused by the store once: the process keeps only
    # the refusals of the last HOLD seconds, not every client it ever refused
    engine = RedisEngine(redis_client)
    front = LocalFirst(engine)
    per_second = 50
    try:
        for i in range(6 * per_second):
            at = T0 + i / per_second
            assert front.evaluate([client(i)], now=at).allowed
            assert not front.evaluate([client(i)], now=at).allowed  # learnt
            assert len(front.denied) <= HOLD * per_second + 1
        # the newest are still answered in process, the expired ones were dropped
        assert front.denied.answer([client(i)], at) is not None
        assert front.denied.answer([client(0)], at) is None
    finally:
        engine.close()


def test_a_quiet_spell_empties_the_cache_at_the_next_refusal():
    cache = DenyCache()
    for i in range(1_000):
        cache.learn(refused(client(i)), T0)
    assert len(cache) == 1_000
    cache.learn(refused(client(1_000)), T0 + HOLD)
    assert len(cache) == 1


def test_a_flood_of_distinct_clients_keeps_the_newest_within_the_bound():
    cache = DenyCache()
    flood = 3 * MAX_REMEMBERED
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(flood):  # all at one instant: nothing expires
            cache.learn(refused(client(i)), T0)
            assert len(cache) <= MAX_REMEMBERED
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == MAX_REMEMBERED
    assert held < BUDGET, f"{held / 1e6:.1f} MB"
    # the newest refusals are the ones kept, the oldest went first
    assert all(cache.answer([client(i)], T0) is not None
               for i in range(flood - MAX_REMEMBERED, flood))
    assert cache.answer([client(flood - MAX_REMEMBERED - 1)], T0) is None
    print(f"deny cache full: {MAX_REMEMBERED} refusals in {held / 1e6:.1f} MB")


def test_a_refusal_learnt_again_moves_to_the_newest_end():
    cache = DenyCache(size=3)
    for i in range(3):
        cache.learn(refused(client(i)), T0)
    cache.learn(refused(client(0)), T0 + 0.5)  # the oldest, refused again: now the newest
    cache.learn(refused(client(3)), T0 + 0.5)  # full: client 1 goes, not client 0
    assert cache.answer([client(0)], T0 + 0.6) is not None
    assert cache.answer([client(1)], T0 + 0.6) is None
