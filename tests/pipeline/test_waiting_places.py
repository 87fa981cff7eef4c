"""A place in the waiting room is taken before a turn is: no turn is reserved for a request
that will not wait for it, and a global policy's waiters are counted per client address.

Real threads make real requests through the middleware on the suite's Redis; a waiting
request is held on the gate the test opens (the app's clock's `sleep()` is the one place
the request path waits), so the test knows who waits without timing anything.
"""

from __future__ import annotations

import threading

import pytest
from django.test import Client

from ratelimits.pipeline.waiting import room
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock

pytestmark = pytest.mark.django_db


class Gate(Clock):
    """A clock that stands still; a wait lasts until the gate opens, and says it began."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = threading.Event()
        self.began = threading.Semaphore(0)

    def sleep(self, seconds: float) -> None:
        self.began.release()
        self.opened.wait(10)


class Waiters:
    """Requests started in threads, each returning once it waits; `end()` opens the gate
    and returns their statuses."""

    def __init__(self, clock: Gate) -> None:
        self.clock = clock
        self.threads: list[threading.Thread] = []
        self.statuses: dict[str, int] = {}

    def start(self, ip: str) -> None:
        def run() -> None:
            self.statuses[ip] = Client().get("/hello/", REMOTE_ADDR=ip).status_code

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        while not self.clock.began.acquire(timeout=0.01):
            if not thread.is_alive():
                raise AssertionError(f"{ip} was answered {self.statuses.get(ip)} instead "
                                     "of waiting for its turn")

    def end(self) -> dict[str, int]:
        self.clock.opened.set()
        for thread in self.threads:
            thread.join(10)
        return self.statuses


@pytest.fixture
def waiters():
    clock = Gate()
    with using_clock(clock):
        started = Waiters(clock)
        yield started
        started.end()


@pytest.fixture
def paced_globally(make_policy, settings):
    """One request a second for everyone together, waiting up to 4 s for a turn; two
    may wait at once, one per client."""
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_WAITING": 2,
                           "MAX_WAITING_PER_CLIENT": 1}
    make_policy(name="paced", algorithm="gcra", limit=1, period=1, burst=1, max_wait=4,
                key="global", path="/hello/")


def test_a_global_policy_counts_its_waiters_per_client_and_burns_no_turn(
    client, paced_globally, waiters
):
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200  # turn now
    waiters.start("10.0.0.1")  # the turn at 1 s
    # every client is "global" to the policy; the room counts them by address: a second
    # client waits beside the first (its turn at 2 s)
    waiters.start("10.0.0.2")
    assert room.waiting() == 2
    # the room is full: refused at once, charged nothing, told when the next turn is free
    third = client.get("/hello/", REMOTE_ADDR="10.0.0.3")
    assert (third.status_code, third["Retry-After"]) == (429, "3")
    # and so is the next one: the refused request took no turn (it would be told 4 s)
    fourth = client.get("/hello/", REMOTE_ADDR="10.0.0.4")
    assert (fourth.status_code, fourth["Retry-After"]) == (429, "3")


def test_a_client_refused_a_second_place_is_charged_nothing(client, make_policy, settings,
                                                             waiters):
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_WAITING_PER_CLIENT": 1}
    make_policy(name="paced", algorithm="gcra", limit=1, period=1, burst=1, max_wait=4,
                key="ip", path="/hello/")
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    waiters.start("10.0.0.1")  # its turn at 1 s
    # its next requests find no place: refused, each told the turn at 2 s, none taking it
    # (a turn taken for a request that does not wait for it would be lost to the client)
    again = [client.get("/hello/", REMOTE_ADDR="10.0.0.1") for _ in range(3)]
    assert [(r.status_code, r["Retry-After"]) for r in again] == [(429, "2")] * 3
    assert waiters.end() == {"10.0.0.1": 200}
    assert room.waiting() == 0


def test_a_request_whose_turn_is_now_passes_when_the_room_is_full(
    client, make_policy, settings, waiters
):
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_WAITING": 1}
    make_policy(name="queue", algorithm="leaky_bucket", limit=1, period=1, burst=3,
                key="ip", path="/hello/")
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    waiters.start("10.0.0.1")  # the one place
    # another client's queue is empty: it needs no place and passes
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.2").status_code == 200
    assert room.waiting() == 1


def test_the_waiters_are_served_and_their_places_given_back(client, paced_globally, waiters):
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    waiters.start("10.0.0.1")
    waiters.start("10.0.0.2")
    assert waiters.end() == {"10.0.0.1": 200, "10.0.0.2": 200}
    assert room.waiting() == 0


def test_who_serves_one_request_at_a_time():
    from ratelimits.pipeline.waiting import one_at_a_time

    class Base:
        def __init__(self, **meta):
            self.META = meta

    assert one_at_a_time(Base(**{"wsgi.multithread": False, "SERVER_NAME": "example.com"}))
    assert not one_at_a_time(Base(**{"wsgi.multithread": True, "SERVER_NAME": "example.com"}))
    assert not one_at_a_time(Base())  # ASGI: no WSGI flag
    # Django's test client says it is single-threaded, but nothing queues behind it
    assert not one_at_a_time(Base(**{"wsgi.multithread": False, "SERVER_NAME": "testserver"}))
