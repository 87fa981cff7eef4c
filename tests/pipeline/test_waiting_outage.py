"""Concurrency slots whose release failed while Redis was paused are freed once it answers.

A real redis-server is paused (SIGSTOP: it accepts connections and never answers);
another request's decision times out and opens the circuit breaker, and then the
requests in flight end, so their releases cannot reach the store; it is resumed
(SIGCONT). The slots must come back at once, not after their `period` (a 3 s pause once
cut a limit to a third for 30 s). The views block until the test lets them go: how long
they run is the point, never a window waited for.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest
import redis
from django.http import HttpResponse
from django.test import Client
from django.urls import path

from ratelimits.engine.keynames import base_key
from ratelimits.engine.types import Limit
from ratelimits.pipeline.watchdog import watchdog
from tests.settings import RATELIMITS

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__), pytest.mark.slow]

COOLDOWN = 0.5
SLOTS = Limit("global", "concurrency", 3, 30, name="three-at-once")


class Slow:
    """Requests whose view runs until the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.finish = threading.Event()
        self.threads: list[threading.Thread] = []
        self.statuses: list[int] = []

    def view(self, request):
        self.entered.release()
        self.finish.wait(10)
        return HttpResponse("done")

    def start(self, n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(
                target=lambda: self.statuses.append(Client().get("/slow/").status_code))
            thread.start()
            self.threads.append(thread)
        for _ in range(n):
            while not self.entered.acquire(timeout=0.01):
                assert len(self.statuses) < n, f"refused instead of served: {self.statuses}"

    def end(self) -> list[int]:
        self.finish.set()
        for thread in self.threads:
            thread.join(10)
        return self.statuses


#: The requests of the test running now.
current = {"slow": Slow()}
urlpatterns = [path("slow/", lambda request: current["slow"].view(request)),
               path("fast/", lambda request: HttpResponse("fast"))]


@pytest.fixture
def running(private_redis, settings, make_policy, clock):
    """Three slots on a private server; the breaker opens at the first failure and its
    cool-down ends when the test moves the clock."""
    slow = current["slow"] = Slow()
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    settings.RATELIMITS = {**settings.RATELIMITS, "BREAKER_FAILURES": 1,
                           "BREAKER_COOLDOWN": COOLDOWN}
    make_policy(name=SLOTS.name, algorithm="concurrency", limit=3, period=30, key="global",
                path="/slow/")
    make_policy(name="window", limit=100, period=60, path="/fast/")
    yield slow
    slow.end()


def held(server) -> int:
    return int(redis.Redis.from_url(server.url).zcard(base_key(RATELIMITS["KEY_PREFIX"], SLOTS)))


def test_slots_whose_release_failed_during_a_pause_come_back_when_redis_answers(
    running, private_redis, clock, caplog
):
    slow = running
    slow.finish.set()
    assert Client().get("/slow/").status_code == 200  # snapshot and scripts loaded
    # its entry is taken, so start() waits for the three below and not for this one
    assert slow.entered.acquire(timeout=0)
    slow.finish.clear()
    slow.start(3)
    assert held(private_redis) == 3
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        # a decision times out: the circuit opens (on_error "allow" admits the request)
        assert Client().get("/fast/").status_code == 200
        with caplog.at_level(logging.WARNING, "ratelimits"):
            assert slow.end() == [200, 200, 200]  # their releases meet the open circuit
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    # releases that met the open circuit are still held; one that only timed out may
    # have been run by Redis as it resumed
    assert held(private_redis) >= 1 and watchdog.unreleased() >= 1
    clock.advance(COOLDOWN)  # the breaker lets one call try the store again
    deadline = time.monotonic() + 5
    while held(private_redis) and time.monotonic() < deadline:
        time.sleep(0.02)  # the watchdog tries the releases again every RETRY_EVERY
    assert held(private_redis) == 0 and watchdog.unreleased() == 0
    assert caplog.text.count("could not release concurrency slots") == 1  # once
    # all three slots serve requests again, long before their period
    fresh = current["slow"] = Slow()
    fresh.start(3)
    assert fresh.end() == [200, 200, 200]
