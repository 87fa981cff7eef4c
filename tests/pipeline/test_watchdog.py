"""Concurrency slots live as long as their request: the watchdog renews them.

The views below block until the test lets them go: how long they run is the requests'
own duration (the point of the test), never a wait for a window to pass.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.http import HttpResponse
from django.test import Client
from django.urls import path

from ratelimits.pipeline.watchdog import watchdog

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

entered = threading.Semaphore(0)
finish = threading.Event()


def slow(request):
    entered.release()
    finish.wait(10)
    return HttpResponse("done")


def fast(request):
    return HttpResponse("fast")


urlpatterns = [path("slow/", slow), path("fast/", fast)]


@pytest.fixture
def running():
    """Start slow requests in threads; the test lets them finish; returns their statuses."""
    global entered
    entered = threading.Semaphore(0)
    finish.clear()
    threads: list[threading.Thread] = []
    results: list[int] = []

    def start(n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=lambda: results.append(Client().get("/slow/").status_code))
            t.start()
            threads.append(t)
        for _ in range(n):
            assert entered.acquire(timeout=10), "a slow request never reached its view"

    yield start, results
    finish.set()
    for t in threads:
        t.join(10)


def test_long_requests_keep_their_slots_past_the_period(client, make_policy, running, any_store):
    start, results = running
    make_policy(name="two-at-once", algorithm="concurrency", limit=2, period=1, path="/slow/")
    assert client.get("/fast/").status_code == 200  # the snapshot is loaded in this thread
    start(2)
    time.sleep(2.0)  # the two requests run for twice the period
    assert client.get("/slow/").status_code == 429  # their slots are still held
    finish.set()
    deadline = time.monotonic() + 10
    while len(results) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results == [200, 200]
    assert watchdog.in_flight() == 0  # released: no longer renewed
    # the slots were freed by the responses, not by expiry
    assert client.get("/slow/").status_code == 200  # `finish` is set: it returns at once


def test_no_thread_without_a_concurrency_policy(client, make_policy):
    make_policy(name="window", limit=5, path="*")
    assert client.get("/fast/").status_code == 200
    assert watchdog.thread is None


def test_a_renew_failure_is_logged_once_and_never_breaks_the_request(
    make_policy, private_redis, settings, running, caplog
):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    start, results = running
    make_policy(name="two-at-once", algorithm="concurrency", limit=2, period=1, path="/slow/")
    assert Client().get("/fast/").status_code == 200
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        start(1)
        private_redis.stop()  # renewals now fail, several times
        deadline = time.monotonic() + 5
        while "could not renew" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)  # about three more renewal rounds fail
        finish.set()
        deadline = time.monotonic() + 10
        while not results and time.monotonic() < deadline:
            time.sleep(0.01)
    assert results == [200]
    assert caplog.text.count("could not renew concurrency slots") == 1
