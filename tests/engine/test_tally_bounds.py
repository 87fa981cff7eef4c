"""What a process tallies while the store is away stays bounded, and is sent in slices
once it is back: a request is never slowed by the counts of an outage (`tally`)."""

from __future__ import annotations

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import EngineUnavailable, Limit, RedisEngine
from ratelimits.engine.constants import OFFENDERS_CAP
from ratelimits.engine.keynames import to_us
from ratelimits.engine.tally import CARRY_MOST, Tally
from ratelimits.engine.types import Decision, Outcome, Result
from tests.engine.conftest import T0

POLICIES = ("login", "api")
#: The socket timeout the red team's site ran with: a call slower than this fails.
TIMEOUT = 0.1
HOUR = int(T0 // 3600)


def refusal(key: str) -> Decision:
    """One request of client `key` refused by every policy (as a fallback engine or a
    per-process policy decides it while the store is away)."""
    results = tuple(Result(Limit(key, "fixed_window", 5, 60.0, name=name), False, 0, 30.0,
                           30.0, outcome=Outcome.REJECTED) for name in POLICIES)
    return Decision(False, results, 30)


def test_an_outage_under_rotating_clients_stays_bounded_and_recovers_at_once(private_redis):
    client = redis.Redis(port=private_redis.port, socket_timeout=TIMEOUT,
                         socket_connect_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0))
    engine = RedisEngine(client)
    probe = Limit("probe", "fixed_window", 10**6, 3600.0, name="probe")
    try:
        assert engine.evaluate([probe], now=T0).allowed
        private_redis.proc.kill()  # the store goes away
        private_redis.proc.wait()
        # two minutes of refusals: 40,000 clients seen once, one client every tenth time
        refused = {T0: 0, T0 + 60: 0}
        heavy = 0
        for i in range(40_000):
            at = T0 + i * 120 / 40_000
            if i % 10 == 0:
                key, heavy = "ip:203.0.113.9", heavy + 1
            else:
                key = f"ip:198.18.{i // 256}.{i % 256}"
            engine.count_locally(refusal(key), to_us(at))
            refused[T0 + 60 * ((at - T0) // 60)] += 1
            if i % 10_000 == 0:
                with pytest.raises(EngineUnavailable):
                    engine.flush()  # what the flush in the background meets
        # what waits: per policy, each minute's count and at most the list's offenders
        # (and the probe's admission)
        assert len(engine.tally) <= len(POLICIES) * (len(refused) + OFFENDERS_CAP) + 1
        with pytest.raises(EngineUnavailable):
            engine.evaluate([probe], now=T0 + 120)

        private_redis.start()  # back, empty
        slowest = 0.0
        deadline = time.monotonic() + 10
        while len(engine.tally) > 1 and time.monotonic() < deadline:  # (1: the probe's)
            began = time.monotonic()
            assert engine.evaluate([probe], now=T0 + 121).allowed  # never raises
            slowest = max(slowest, time.monotonic() - began)
        assert len(engine.tally) <= 1, "the counts never left the process"
        assert slowest < TIMEOUT, f"a request took {slowest * 1000:.0f} ms"
        # every refusal arrived, exactly, and the client refused most leads the list
        for name in POLICIES:
            for minute_at, n in refused.items():
                assert engine.counters(name, int(minute_at // 60)) == {"r": n}
            top = engine.offenders(name, HOUR, n=OFFENDERS_CAP)
            assert top[0] == ("ip:203.0.113.9", heavy)
            assert len(top) <= OFFENDERS_CAP
            assert all(n == 1 for _, n in top[1:])  # rotating keys inflate nobody
        print(f"after the outage: {len(refused) * 20_000} refusals sent, "
              f"slowest request {slowest * 1000:.1f} ms")
    finally:
        engine.close()
        client.close()


def test_a_call_carries_a_slice_and_a_flush_sends_everything(redis_client):
    sent: list[tuple[int, int]] = []

    def send(counts, offenders):
        sent.append((sum(map(len, counts.values())), sum(map(len, offenders.values()))))
        counts.clear()
        offenders.clear()

    tally = Tally(send, every=30.0)
    for i in range(30):  # 30 policies, each with a full list of offenders
        for j in range(OFFENDERS_CAP):
            limit = Limit(f"c{j}", "fixed_window", 1, 60.0, name=f"p{i}")
            tally.add(Decision(False, (Result(limit, False, 0, 1.0, 1.0,
                                              outcome=Outcome.REJECTED),), 1), to_us(T0))
    counts, offenders = tally.take()
    carried = sum(map(len, counts.values())) + sum(map(len, offenders.values()))
    assert carried <= CARRY_MOST + OFFENDERS_CAP  # whole policy-hours, about CARRY_MOST
    tally.restore(counts, offenders)
    tally.flush()
    assert len(sent) > 1  # in several round trips
    assert sum(c for c, _ in sent) == 30 and sum(o for _, o in sent) == 30 * OFFENDERS_CAP
    assert not tally.pending()
    tally.close()


def test_after_a_failed_call_no_call_carries_counts_for_a_while(redis_client, monkeypatch):
    from ratelimits.engine import tally as tally_module

    engine = RedisEngine(redis_client)
    limit = Limit("c", "fixed_window", 1, 60.0, name="p")
    engine.evaluate([limit], now=T0)
    later = time.monotonic() + 16  # the counts are due
    monkeypatch.setattr(tally_module.time, "monotonic", lambda: later)
    assert engine.tally.due()
    counts, offenders = engine.tally.take()
    engine.tally.restore(counts, offenders)  # the call that carried them failed
    assert engine.tally.pending() and not engine.tally.due()
    # a flush interval on, the next call carries them again
    monkeypatch.setattr(tally_module.time, "monotonic", lambda: later + engine.tally.every)
    assert engine.tally.due()
    engine.close()


def test_a_failed_flush_is_tried_again_with_no_traffic_to_carry_it():
    """The last counts of a burst, met by a store that failed once: sent by the flush's
    own retry a moment later, not left until the next request of the process."""
    sent: list[int] = []
    failures = [EngineUnavailable("the store did not answer in time")]

    def send(counts, offenders):
        if failures:
            raise failures.pop()
        sent.append(sum(n for fields in counts.values() for n in fields.values()))
        counts.clear()
        offenders.clear()

    tally = Tally(send, every=0.05)
    tally.add(refusal("ip:203.0.113.9"), to_us(T0))  # and no more traffic
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not failures and sent == [len(POLICIES)]
    assert not tally.pending()
    tally.close()


def test_counts_tallied_while_a_flush_sends_are_sent_with_no_traffic_after_them():
    """The last refusals of a burst, counted while the background flush was sending the
    ones before: no flush was scheduled for them (one was running), and no request came
    after them to carry them. The flush sends them a moment later by itself."""
    sent: list[int] = []
    tally: Tally

    def send(counts, offenders):
        if not sent:  # meanwhile, another thread counts the last refusal of the burst
            tally.add(refusal("ip:203.0.113.7"), to_us(T0))
        sent.append(sum(n for fields in counts.values() for n in fields.values()))
        counts.clear()
        offenders.clear()

    tally = Tally(send, every=0.05)
    tally.add(refusal("ip:203.0.113.9"), to_us(T0))
    deadline = time.monotonic() + 10
    while sum(sent) < 2 * len(POLICIES) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [len(POLICIES), len(POLICIES)]
    assert not tally.pending()
    tally.close()
