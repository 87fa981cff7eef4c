"""What a limit counts, on every engine: lockouts, a charge made after the response
(`Limit.stage`), calendar windows. Times are explicit; each row is checked alike on the
in-process engine, Redis, the local-first layer, the cluster and the asyncio twins."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from ratelimits.engine import Limit, MemoryEngine
from ratelimits.engine.types import REFUND, RESERVE, Outcome
from tests.engine.conftest import T0


def _at(*args: int, zone: str = "UTC") -> float:
    """An instant given as a local time of `zone`."""
    from zoneinfo import ZoneInfo

    return dt.datetime(*args, tzinfo=ZoneInfo(zone)).timestamp()


def _row(engine, limit, at):
    decision = engine.evaluate([limit], now=at)
    r = decision.results[0]
    return decision.allowed, r.remaining, round(r.retry_after, 6), r.outcome


# -- lockout ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "token_bucket",
                                       "gcra", "sliding_log"])
def test_a_refused_client_stays_refused_for_the_lockout(every_engine, algorithm):
    limit = Limit("10.0.0.1", algorithm, 2, 10, name="login-ip", lockout=60)
    assert _row(every_engine, limit, T0)[0] is True
    assert _row(every_engine, limit, T0)[0] is True
    # refused: the lockout starts, and Retry-After says when it ends
    assert _row(every_engine, limit, T0 + 1) == (False, 0, 60.0, Outcome.REJECTED)
    # the count would admit again long before: the lockout still refuses, counting down
    assert _row(every_engine, limit, T0 + 30) == (False, 0, 31.0, Outcome.REJECTED)
    assert _row(every_engine, limit, T0 + 60.5) == (False, 0, 0.5, Outcome.REJECTED)
    # over: the client starts afresh
    allowed, _, retry, outcome = _row(every_engine, limit, T0 + 61)
    assert (allowed, retry, outcome) == (True, 0, Outcome.ADMITTED)
    # another client of the same policy was never locked
    other = dataclasses.replace(limit, key="10.0.0.2")
    assert _row(every_engine, other, T0 + 30)[0] is True


def test_a_lockout_starts_only_where_its_limit_refused(every_engine):
    """The request refused by another limit does not lock this one's client; a shadow
    limit that would refuse locks nobody."""
    strict = Limit("u", "fixed_window", 1, 10, name="strict")
    locking = Limit("u", "fixed_window", 5, 10, name="locking", lockout=300)
    watched = Limit("u", "fixed_window", 1, 10, name="watched", lockout=300, shadow=True)
    assert every_engine.evaluate([strict, locking, watched], now=T0).allowed
    refused = every_engine.evaluate([strict, locking, watched], now=T0 + 1)
    assert not refused.allowed
    assert [r.outcome for r in refused.results] == [
        Outcome.REJECTED, Outcome.SPARED, Outcome.WOULD_REJECT]
    assert refused.retry_after == 9  # the strict window's end, not a lockout
    assert every_engine.evaluate([locking], now=T0 + 2).allowed
    assert every_engine.evaluate([watched], now=T0 + 10).allowed  # a new window: no lock


def test_a_reset_ends_the_lockout(engine):
    limit = Limit("victim", "fixed_window", 1, 10, name="login-user", lockout=3600)
    engine.evaluate([limit], now=T0)
    assert not engine.evaluate([limit], now=T0 + 1).allowed
    engine.reset(limit, now=T0 + 2)
    assert engine.evaluate([limit], now=T0 + 3).allowed


def test_lockout_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="lockout must be a number of seconds"):
        Limit("k", "fixed_window", 5, 60, lockout=-1)
    with pytest.raises(ValueError, match="not to an adaptive limit, nor with a batch"):
        Limit("k", "fixed_window", 5, 60, lockout=60, batch=2)


# -- charged after the response ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket", "gcra"])
def test_a_reservation_taken_back_costs_nothing(every_engine, algorithm):
    reserve = Limit("u", algorithm, 3, 3600, name="login", stage=RESERVE)
    refund = dataclasses.replace(reserve, stage=REFUND)
    # reserved and taken back at its own time, as often as you like: nothing stays
    for i in range(5):
        decision = every_engine.evaluate([reserve], now=T0 + i)
        assert decision.allowed and decision.reserved_at == T0 + i
        assert every_engine.evaluate([refund], now=decision.reserved_at).allowed
    # three kept: the fourth is refused, with its lockout or retry time
    for i in range(3):
        assert _row(every_engine, reserve, T0 + 10 + i)[::3] == (True, Outcome.ADMITTED)
    allowed, _, retry, outcome = _row(every_engine, reserve, T0 + 20)
    assert (allowed, outcome) == (False, Outcome.REJECTED) and retry > 0


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket", "gcra"])
def test_reservations_in_flight_count_against_the_limit(every_engine, algorithm):
    """The bound the docs give: a client's requests in flight hold their units, so at
    most `limit` of them are admitted before any response is known."""
    reserve = Limit("u", algorithm, 3, 3600, name="login", stage=RESERVE)
    burst = [every_engine.evaluate([reserve], now=T0) for _ in range(10)]
    assert [d.allowed for d in burst] == [True] * 3 + [False] * 7


def test_a_refund_takes_back_the_window_it_was_charged_in(every_engine):
    """A reservation made at the end of a window and taken back in the next is taken
    from the window it counted in: the new window keeps its full allowance."""
    reserve = Limit("u", "fixed_window", 2, 60, name="otp", stage=RESERVE)
    refund = dataclasses.replace(reserve, stage=REFUND)
    edge = (T0 // 60 + 1) * 60 - 0.5
    early = every_engine.evaluate([reserve], now=edge)
    late = [every_engine.evaluate([reserve], now=edge + 1) for _ in range(2)]
    assert early.allowed and all(d.allowed for d in late)
    every_engine.evaluate([refund], now=early.reserved_at)
    assert not every_engine.evaluate([reserve], now=edge + 2).allowed


def test_a_refund_refuses_nothing_and_rides_with_no_charge(every_engine):
    full = Limit("u", "fixed_window", 1, 60, name="full")
    refund = Limit("u", "fixed_window", 5, 60, name="room", stage=REFUND)
    every_engine.evaluate([full], now=T0)
    decision = every_engine.evaluate([refund], now=T0 + 1)
    assert decision.allowed and decision.results[0].outcome is Outcome.SPARED


def test_a_token_bucket_refilled_since_keeps_the_charge(every_engine):
    """Another request of the client refilled the bucket after the reservation: the cap
    may have absorbed the units, so they are not given back (never more admitted)."""
    reserve = Limit("u", "token_bucket", 2, 3600, name="tb", stage=RESERVE)
    refund = dataclasses.replace(reserve, stage=REFUND)
    first = every_engine.evaluate([reserve], now=T0)
    every_engine.evaluate([reserve], now=T0 + 1)
    every_engine.evaluate([refund], now=first.reserved_at)
    assert not every_engine.evaluate([reserve], now=T0 + 2).allowed


def test_a_reserved_limit_is_refunded_when_another_refuses():
    """The in-process engine's refund (a later layer refused) gives back a reservation
    like any charge."""
    engine = MemoryEngine()
    reserve = Limit("u", "fixed_window", 1, 60, name="login", stage=RESERVE)
    _, receipt = engine.take([reserve], now=T0)
    engine.refund(receipt)
    assert engine.evaluate([reserve], now=T0 + 1).allowed


def test_stages_are_refused_where_they_cannot_hold():
    with pytest.raises(ValueError, match="holds a slot"):
        Limit("k", "concurrency", 5, 60, stage=RESERVE)
    with pytest.raises(ValueError, match="queues a request before the view"):
        Limit("k", "leaky_bucket", 5, 60, stage=REFUND)
    with pytest.raises(ValueError, match="does not go with a batch or a max_wait"):
        Limit("k", "fixed_window", 5, 60, stage=RESERVE, batch=2)
    with pytest.raises(ValueError, match="stage must be one of"):
        Limit("k", "fixed_window", 5, 60, stage=7)


# -- calendar windows --------------------------------------------------------------------


def test_a_day_in_paris_resets_at_local_midnight_and_lasts_23_hours_in_spring(every_engine):
    limit = Limit("u", "fixed_window", 2, 86_400, name="daily", calendar="day",
                  zone="Europe/Paris")
    # 2027-03-28: clocks go from 02:00 to 03:00 in Paris, a day of 23 hours
    morning = _at(2027, 3, 28, 1, 30, zone="Europe/Paris")
    midnight = _at(2027, 3, 29, 0, 0, zone="Europe/Paris")
    assert midnight - _at(2027, 3, 28, 0, 0, zone="Europe/Paris") == 23 * 3600
    assert _row(every_engine, limit, morning)[:2] == (True, 1)
    assert _row(every_engine, limit, morning + 60)[:2] == (True, 0)
    # refused until local midnight, whatever 86,400 s from the epoch would say
    assert _row(every_engine, limit, morning + 120)[:3] == (False, 0, midnight - morning - 120)
    assert _row(every_engine, limit, midnight - 0.5)[:3] == (False, 0, 0.5)
    assert _row(every_engine, limit, midnight)[:2] == (True, 1)


def test_a_month_is_its_own_length(every_engine):
    limit = Limit("acme", "fixed_window", 10_000, 30 * 86_400, name="plan", cost=10_000,
                  calendar="month", zone="UTC")
    feb = _at(2028, 2, 10, 12, 0)  # a leap year: February has 29 days
    assert _row(every_engine, limit, feb)[0] is True
    allowed, _, retry, _ = _row(every_engine, dataclasses.replace(limit, cost=1), feb + 1)
    assert not allowed
    assert retry == _at(2028, 3, 1) - feb - 1  # on the 1st, not 30 days after anything
    assert _row(every_engine, dataclasses.replace(limit, cost=1), _at(2028, 3, 1))[0]


def test_a_week_starts_on_monday(every_engine):
    limit = Limit("u", "fixed_window", 1, 7 * 86_400, name="weekly", calendar="week",
                  zone="America/New_York")
    sunday = _at(2027, 1, 17, 23, 0, zone="America/New_York")
    assert _row(every_engine, limit, sunday)[0]
    assert _row(every_engine, limit, sunday + 1800)[2] == 1800  # Monday 00:00 local
    assert _row(every_engine, limit, sunday + 3600)[0]


def test_a_reset_clears_a_calendar_window(engine):
    limit = Limit("u", "fixed_window", 1, 86_400, name="daily", calendar="day", zone="UTC")
    assert engine.evaluate([limit], now=T0).allowed
    assert not engine.evaluate([limit], now=T0 + 1).allowed
    engine.reset(limit, now=T0 + 2)
    assert engine.evaluate([limit], now=T0 + 3).allowed


def test_calendar_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="calendar applies only to fixed_window"):
        Limit("k", "sliding_window", 5, 86_400, calendar="day")
    with pytest.raises(ValueError, match="calendar must be one of day, week, month"):
        Limit("k", "fixed_window", 5, 86_400, calendar="year")
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        Limit("k", "fixed_window", 5, 86_400, calendar="day", zone="Mars/Olympus")
