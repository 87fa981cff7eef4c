"""renew(): a concurrency slot lives as long as its request renews it, and no longer."""

from __future__ import annotations

from ratelimits.engine import Limit
from tests.engine.conftest import T0

SLOT = Limit("client", "concurrency", 1, 10.0, name="slots")
TWO = Limit("client", "concurrency", 2, 10.0, cost=2, name="two")


def test_a_renewed_slot_survives_past_its_period_and_still_counts(engine):
    held = engine.evaluate([SLOT], now=T0)
    assert held.allowed and held.token is not None
    engine.renew([held], now=T0 + 8)
    engine.renew([held], now=T0 + 16)
    # 24 s after it was taken, the slot is still held: a second request is refused
    assert not engine.evaluate([SLOT], now=T0 + 24).allowed
    # once renewing stops, it expires a period after the last renewal
    assert engine.evaluate([SLOT], now=T0 + 26).allowed


def test_an_unrenewed_slot_is_reclaimed_after_its_period(engine):
    engine.evaluate([SLOT], now=T0)
    assert not engine.evaluate([SLOT], now=T0 + 9).allowed
    assert engine.evaluate([SLOT], now=T0 + 10.5).allowed


def test_renewing_a_reclaimed_slot_does_not_bring_it_back(engine):
    held = engine.evaluate([SLOT], now=T0)
    engine.renew([held], now=T0 + 11)  # too late: it expired at T0 + 10
    assert engine.evaluate([SLOT], now=T0 + 12).allowed


def test_renew_after_release_adds_nothing(engine):
    held = engine.evaluate([TWO], now=T0)
    engine.release(held)
    engine.renew([held], now=T0 + 1)
    assert engine.evaluate([TWO], now=T0 + 2).allowed  # both units free


def test_renew_keeps_every_unit_of_a_costly_request_and_leaves_others_alone(engine):
    big = Limit("client", "concurrency", 3, 10.0, cost=2, name="units")
    one = Limit("client", "concurrency", 3, 10.0, name="units")
    held = engine.evaluate([big], now=T0)
    other = engine.evaluate([one], now=T0 + 1)
    assert held.allowed and other.allowed
    engine.renew([held], now=T0 + 9)
    # T0 + 12: the unrenewed single unit expired, the two renewed ones remain
    assert engine.evaluate([one], now=T0 + 12).allowed
    assert not engine.evaluate([one], now=T0 + 12.5).allowed


def test_renew_of_decisions_without_slots_is_a_no_op(engine):
    admitted = engine.evaluate([Limit("client", "fixed_window", 5, 10.0, name="fw")], now=T0)
    engine.renew([admitted], now=T0 + 1)
    engine.renew([], now=T0 + 1)
