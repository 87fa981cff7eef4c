"""The waiting room: delayed (leaky-bucket) requests cannot tie up every worker.

Real threads make real requests; a waiting request is held on an Event the test
controls (through the app's clock, whose `sleep()` is the one place the request path
waits), so the tests know who is waiting without timing anything.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.test import Client

from ratelimits.pipeline.waiting import room
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock

pytestmark = pytest.mark.django_db


class Gate(Clock):
    """A clock whose waits last until the gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.opened.wait(10)


@pytest.fixture
def gate():
    """Waiting requests block until the gate opens; yields a function to start one."""
    clock = Gate()
    threads, results = [], []

    def start(ip: str) -> None:
        before = room.waiting()

        def run() -> None:
            results.append(Client().get("/hello/", REMOTE_ADDR=ip).status_code)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10
        while room.waiting() == before:
            assert time.monotonic() < deadline, "the request never started waiting"
            time.sleep(0.005)

    with using_clock(clock):
        yield start, results
        clock.opened.set()
        for thread in threads:
            thread.join(10)


@pytest.fixture
def queue(make_policy, settings, client):
    """1 request per 10 s per IP with a queue of 5. A test names its clock (`gate`,
    `waits`) before this fixture, so that every request of the test, these first ones
    too, is decided at that clock's standing time: a turn is then exactly 10 s after the
    last, however long the machine takes between requests."""
    settings.RATELIMITS = {
        **settings.RATELIMITS,
        "MAX_DELAY": 60,
        "MAX_WAITING": 2,
        "MAX_WAITING_PER_CLIENT": 1,
    }
    make_policy(name="queue", algorithm="leaky_bucket", limit=1, period=10, burst=5, path="*")
    for ip in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):  # each client's first passes at once
        assert client.get("/hello/", REMOTE_ADDR=ip).status_code == 200


def test_a_second_waiting_request_of_one_client_is_refused_at_once(client, gate, queue):
    start, _ = gate
    start("10.0.0.1")  # waits its turn
    began = time.monotonic()
    response = client.get("/hello/", REMOTE_ADDR="10.0.0.1")
    assert response.status_code == 429
    assert time.monotonic() - began < 1  # refused, not held
    # the turn it was refused for: 20 s away (two requests ahead at 1 per 10 s)
    assert response["Retry-After"] == "20"


def test_other_clients_wait_while_the_room_has_places_then_are_refused(client, gate, queue):
    start, _ = gate
    start("10.0.0.1")
    start("10.0.0.2")  # a second client may wait beside the first
    assert room.waiting() == 2
    response = client.get("/hello/", REMOTE_ADDR="10.0.0.3")  # the room is full
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert room.waiting() == 2


def test_the_place_is_given_back_after_the_wait(client, waits, queue):
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    # turns of 10 and 20 s
    assert waits.slept == [10, 20] and room.waiting() == 0
