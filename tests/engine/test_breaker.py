"""The circuit breaker on an injected clock, and the engine failing fast while it is open."""

from __future__ import annotations

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import EngineUnavailable, Limit, RedisEngine
from ratelimits.engine.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from tests.redis_server import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_then_one_probe_closes_it():
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown=2.0, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failure()
    breaker.success()  # a success in between resets the count
    for _ in range(3):
        assert breaker.allow()
        breaker.failure()
    assert breaker.state == OPEN and breaker.trips == 1
    assert not breaker.allow()
    clock.now += 2.0
    assert breaker.allow()  # the probe
    assert breaker.state == HALF_OPEN
    assert not breaker.allow()  # only one probe at a time
    breaker.success()
    assert breaker.state == CLOSED and breaker.allow()


def test_a_failed_probe_reopens_for_another_cooldown():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown=1.0, clock=clock)
    breaker.failure()
    clock.now += 1.0
    assert breaker.allow()
    breaker.failure()
    assert breaker.state == OPEN and breaker.trips == 1
    assert not breaker.allow()
    clock.now += 1.0
    assert breaker.allow()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        CircuitBreaker(failures=0)


def test_open_engine_fails_without_touching_the_socket():
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    engine = RedisEngine(client, breaker=CircuitBreaker(failures=2, cooldown=60))
    limit = Limit("c", "gcra", 5, 60)
    for _ in range(2):
        with pytest.raises(EngineUnavailable):
            engine.evaluate([limit])
    start = time.perf_counter()
    with pytest.raises(EngineUnavailable, match="circuit open"):
        engine.evaluate([limit])
    assert time.perf_counter() - start < 0.01


@pytest.mark.slow
def test_a_decision_that_timed_out_names_the_slots_a_resumed_server_takes(private_redis):
    """A paused server runs the timed-out call as it resumes: the error names the slots it
    takes (`EngineError.taken`), and releasing them frees them. A call the open breaker
    stopped reached nothing and names none."""
    import signal

    from ratelimits.engine.keynames import base_key

    client = redis.Redis.from_url(private_redis.url, socket_timeout=0.1,
                                  retry=Retry(NoBackoff(), 0))
    engine = RedisEngine(client, breaker=CircuitBreaker(failures=1, cooldown=60), stats=False)
    slots = Limit("global", "concurrency", 3, 30, name="slots")
    window = Limit("global", "fixed_window", 5, 60, name="window")
    held = redis.Redis.from_url(private_redis.url)
    assert engine.evaluate([slots, window]).allowed  # scripts loaded
    held.delete(base_key(engine.prefix, slots))
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(EngineUnavailable) as timed_out:
            engine.evaluate([slots, window])
        with pytest.raises(EngineUnavailable, match="circuit open") as stopped:
            engine.evaluate([slots, window])
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    assert stopped.value.taken is None
    taken = timed_out.value.taken
    assert taken is not None and [limit for limit, _ in taken.holding()] == [slots]
    assert held.zcard(base_key(engine.prefix, slots)) == 1  # run as the server resumed
    engine.breaker.success()  # the cool-down over
    engine.release(taken)
    assert held.zcard(base_key(engine.prefix, slots)) == 0
    held.close()
