"""Decision semantics shared by both backends: all-or-nothing charging, shadow, cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratelimits.engine import Limit, MemoryEngine
from ratelimits.engine.keynames import OFFENDERS_TTL, US, offenders_key
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Outcome
from tests.engine.conftest import T0


def remaining(engine, limit: Limit, at: float) -> int:
    """What a limit has left, read by a probe that is never charged (a failing partner)."""
    blocker = Limit("probe", "fixed_window", 1, 3600, name="blocker")
    engine.evaluate([blocker], now=at)  # use up the blocker
    decision = engine.evaluate([limit, blocker], now=at)
    assert not decision.allowed
    return decision.results[0].remaining


def test_admitted_request_charges_every_limit(engine):
    a = Limit("c", "fixed_window", 5, 60, name="a")
    b = Limit("c", "sliding_log", 3, 60, name="b")
    decision = engine.evaluate([a, b], now=T0)
    assert decision.allowed
    assert [r.remaining for r in decision.results] == [4, 2]


def test_rejected_request_charges_none(engine):
    wide = Limit("c", "fixed_window", 5, 60, name="wide")
    narrow = Limit("c", "gcra", 2, 60, name="narrow")
    for _ in range(2):
        assert engine.evaluate([wide, narrow], now=T0).allowed
    for _ in range(3):
        decision = engine.evaluate([wide, narrow], now=T0)
        assert not decision.allowed
        assert decision.rejected_by == (decision.results[1],)
        # the wide limit admitted but was not charged: it still has 3 of 5
        assert decision.results[0].allowed and decision.results[0].remaining == 3
    assert engine.evaluate([wide], now=T0).results[0].remaining == 2


@pytest.mark.parametrize(
    "algorithm", [a for a, spec in REGISTRY.items() if not spec.holds_slots]
)
def test_rejected_requests_do_not_extend_the_wait(engine, algorithm):
    """A client that keeps retrying recovers: rejections are never recorded."""
    # a queue of one, so that the second request at T0 is admitted as the others are
    limit = Limit("c", algorithm, 2, 10, burst=1 if REGISTRY[algorithm].delays else None)
    assert engine.evaluate([limit], now=T0).allowed
    assert engine.evaluate([limit], now=T0).allowed
    first = engine.evaluate([limit], now=T0 + 1)
    assert not first.allowed
    for step in range(1, 50):
        engine.evaluate([limit], now=T0 + 1 + step * 0.01)
    assert engine.evaluate([limit], now=T0 + 1 + first.retry_after).allowed


def test_shadow_limit_reports_but_never_blocks(engine):
    enforced = Limit("c", "fixed_window", 10, 60, name="enforced")
    shadow = Limit("c", "fixed_window", 1, 60, shadow=True, name="shadow")
    assert engine.evaluate([enforced, shadow], now=T0).allowed
    decision = engine.evaluate([enforced, shadow], now=T0)
    assert decision.allowed
    assert decision.retry_after == 0
    assert decision.would_reject == (decision.results[1],)
    assert decision.results[1].retry_after > 0
    # the enforced limit was charged twice, the shadow one once (its rejection charged nothing)
    assert decision.results[0].remaining == 8
    assert remaining(engine, shadow, T0) == 0


def test_shadow_and_enforced_rule_keep_their_own_counts(engine):
    """The same rule running enforced and in shadow: separate names, separate state."""
    enforced = Limit("c", "sliding_window", 3, 60, name="login")
    shadow = Limit("c", "sliding_window", 2, 60, shadow=True, name="login-strict")
    outcomes = [engine.evaluate([enforced, shadow], now=T0) for _ in range(4)]
    assert [d.allowed for d in outcomes] == [True, True, True, False]
    assert [d.results[1].allowed for d in outcomes] == [True, True, False, False]


def test_decision_retry_after_is_the_longest_enforced_wait(engine):
    short = Limit("c", "fixed_window", 1, 10, name="short")
    long = Limit("c", "fixed_window", 1, 60, name="long")
    assert engine.evaluate([short, long], now=T0).allowed
    decision = engine.evaluate([short, long], now=T0 + 1)
    assert not decision.allowed
    assert decision.retry_after == pytest.approx(59.0)


def test_cost_counts_units(engine):
    limit = Limit("c", "sliding_log", 10, 60, cost=3)
    assert [engine.evaluate([limit], now=T0).results[0].remaining for _ in range(3)] == [7, 4, 1]
    decision = engine.evaluate([limit], now=T0)
    assert not decision.allowed and decision.results[0].remaining == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "fixed_window", "limit": 5, "cost": 6}, "exceeds the capacity 5"),
        ({"algorithm": "token_bucket", "limit": 50, "burst": 5, "cost": 6}, "capacity 5"),
        ({"algorithm": "gcra", "limit": 10, "burst": 0}, "capacity 0"),
    ],
)
def test_cost_above_capacity_is_refused_up_front(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Limit("c", period=60, **kwargs)


def test_no_limits_is_admitted_and_reports_the_version(engine):
    decision = engine.evaluate([], now=T0)
    assert decision.allowed and decision.results == () and decision.version == 0
    version = engine.bump_version()
    assert version > 0
    assert engine.evaluate([], now=T0).version == version


def test_concurrency_release_frees_the_slot(engine):
    limit = Limit("c", "concurrency", 1, 30)
    held = engine.evaluate([limit], now=T0)
    assert held.allowed and held.token
    assert not engine.evaluate([limit], now=T0 + 1).allowed
    engine.release(held)
    engine.release(held)  # idempotent
    assert engine.evaluate([limit], now=T0 + 2).allowed


def test_rejected_concurrency_request_holds_nothing(engine):
    limit = Limit("c", "concurrency", 1, 30)
    assert engine.evaluate([limit], now=T0).allowed
    rejected = engine.evaluate([limit], now=T0)
    assert rejected.token is None


def test_counters_per_policy_and_minute(engine):
    enforced = Limit("c", "fixed_window", 2, 60, name="api")
    shadow = Limit("c", "fixed_window", 1, 60, shadow=True, name="api-shadow")
    for _ in range(4):
        engine.evaluate([enforced, shadow], now=T0 + 5)
    minute = int((T0 + 5) // 60)
    assert engine.counters("api", minute) == {"a": 2, "r": 2}
    # first admitted, then would-reject twice while the enforced limit admitted, then the
    # request was refused by the enforced limit: shadow still would-reject (not charged)
    assert engine.counters("api-shadow", minute) == {"a": 1, "w": 3}
    assert engine.counters("api", minute + 1) == {}


def test_different_clients_and_policies_do_not_share_state(engine):
    for key, name in [("a", "p"), ("b", "p"), ("a", "q")]:
        assert engine.evaluate([Limit(key, "fixed_window", 1, 60, name=name)], now=T0).allowed


def test_reset_forgets_one_client(engine):
    limit = Limit("c", "fixed_window", 1, 60, name="p")
    assert engine.evaluate([limit], now=T0).allowed
    assert not engine.evaluate([limit], now=T0).allowed
    engine.reset(limit, now=T0)
    assert engine.evaluate([limit], now=T0).allowed


def test_reset_makes_a_warm_client_cold_again(engine):
    limit = Limit("c", "gcra", 1, 1, burst=2, warmup=4, name="p")
    for at in (0, 3, 4.5):  # paced at 3 s, then 1.5 s, then warm
        assert engine.evaluate([limit], now=T0 + at).allowed
    assert engine.evaluate([limit], now=T0 + 5).allowed  # warm: the burst
    engine.reset(limit, now=T0 + 6.5)
    assert engine.evaluate([limit], now=T0 + 6.5).allowed
    # cold again: paced at 3 s, though gcra alone would admit the burst
    refused = engine.evaluate([limit], now=T0 + 6.5)
    assert not refused.allowed and refused.results[0].retry_after == 3.0


def test_offenders_count_refusals_and_would_be_refusals_per_hour(engine):
    enforced = Limit("", "fixed_window", 1, 60, name="login")
    shadow = Limit("", "fixed_window", 1, 60, shadow=True, name="login-shadow")
    for client, tries in (("10.0.0.1", 5), ("10.0.0.2", 3), ("10.0.0.3", 1)):
        for _ in range(tries):
            engine.evaluate([replace(enforced, key=client)], now=T0 + 10)
            engine.evaluate([replace(shadow, key=client)], now=T0 + 10)
    hour = int((T0 + 10) // 3600)
    # the first request of each client was admitted: only the rest are offences
    assert engine.offenders("login", hour) == [("10.0.0.1", 4), ("10.0.0.2", 2)]
    assert engine.offenders("login-shadow", hour) == [("10.0.0.1", 4), ("10.0.0.2", 2)]
    assert engine.offenders("login", hour, n=1) == [("10.0.0.1", 4)]
    assert engine.offenders("login", hour + 1) == []


def test_offenders_list_is_bounded_and_a_persistent_newcomer_still_enters(engine):
    from ratelimits.engine.keynames import OFFENDERS_CAP

    limit = Limit("", "fixed_window", 1, 3600, name="scan")
    for i in range(OFFENDERS_CAP + 50):  # one offence each, from many clients
        for _ in range(2):
            engine.evaluate([replace(limit, key=f"c{i}")], now=T0)
    for _ in range(30):  # a late heavy hitter in a list already full
        engine.evaluate([replace(limit, key="late")], now=T0)
    hour = int(T0 // 3600)
    top = engine.offenders("scan", hour, n=OFFENDERS_CAP * 2)
    assert len(top) == OFFENDERS_CAP
    assert top[0][0] == "late"
    # its guaranteed count: every refusal since it entered, none of the inherited floor
    assert top[0][1] == 29


def test_rotating_keys_cannot_flush_the_real_offender(engine):
    """The attack: one client refused 50 times, then 1,500 rotating keys refused once
    each. Ranked by guaranteed count (count minus the floor inherited on entering a full
    list), the real offender stays first and no junk key claims more than its one."""
    from ratelimits.engine.keynames import OFFENDERS_CAP

    limit = Limit("", "fixed_window", 1, 3600, name="login")
    for _ in range(51):  # the first is admitted: 50 refusals
        engine.evaluate([replace(limit, key="203.0.113.9")], now=T0)
    for i in range(1_500):
        junk = replace(limit, key=f"junk-{i}")
        engine.evaluate([junk], now=T0)
        engine.evaluate([junk], now=T0)
    top = engine.offenders("login", int(T0 // 3600), n=OFFENDERS_CAP * 2)
    assert len(top) == OFFENDERS_CAP  # memory stays bounded
    assert top[0] == ("203.0.113.9", 50)
    assert {count for _, count in top[1:]} == {1}


def test_offenders_expire_after_two_hours(engine):
    limit = Limit("x", "fixed_window", 1, 60, name="p")
    for _ in range(2):
        engine.evaluate([limit], now=T0)
    hour = int(T0 // 3600)
    assert engine.offenders("p", hour) == [("x", 1)]
    key = offenders_key("rl:", "p", hour)
    if isinstance(engine, MemoryEngine):  # expiry on the engine's own clock
        assert engine._store.get(key, T0 * US + OFFENDERS_TTL * US - 1) is not None
        assert engine._store.get(key, T0 * US + OFFENDERS_TTL * US) is None
    elif isinstance(engine, PostgresEngine):  # an hour's list: two hours after it ends
        end = (hour + 1) * 3600 + OFFENDERS_TTL
        engine.sweep(now=end - 0.001)
        assert engine.offenders("p", hour) == [("x", 1)]
        engine.sweep(now=end)
        assert engine.offenders("p", hour) == []
    else:  # Redis expires on its own clock: the TTL is what can be checked
        assert OFFENDERS_TTL - 5 < engine.client.ttl(key) <= OFFENDERS_TTL


def test_each_result_says_what_its_limit_did(engine):
    """The outcome the counters record, returned per limit: nothing re-derives it."""
    tight = Limit("c", "fixed_window", 1, 60, name="tight")
    loose = Limit("c", "fixed_window", 9, 60, name="loose")
    shadow = Limit("c", "fixed_window", 1, 60, shadow=True, name="watch")
    first = engine.evaluate([tight, loose, shadow], now=T0)
    assert [r.outcome for r in first.results] == [Outcome.ADMITTED] * 3
    second = engine.evaluate([tight, loose, shadow], now=T0 + 1)
    assert [r.outcome for r in second.results] == [
        Outcome.REJECTED, Outcome.SPARED, Outcome.WOULD_REJECT
    ]
    assert [engine.counters(n, int(T0 // 60)) for n in ("tight", "loose", "watch")] == [
        {"a": 1, "r": 1}, {"a": 1, "o": 1}, {"a": 1, "w": 1}
    ]


def test_retry_after_is_whole_seconds_rounded_up(engine):
    """gcra 2 per 60 s, burst 1: the next turn is 30 s away, and Retry-After says 30."""
    limit = Limit("c", "gcra", 2, 60, burst=1, name="g")
    assert engine.evaluate([limit], now=T0).allowed
    decision = engine.evaluate([limit], now=T0 + 0.25)
    assert not decision.allowed
    assert decision.results[0].retry_after == pytest.approx(29.75)
    assert decision.retry_after == 30
