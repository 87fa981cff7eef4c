"""An adaptive policy under odd requests, on real servers: closed-loop victims on a view
that takes WORK seconds whatever the load, and beside them

- one client asking for a page that does not exist (a 404 in a few milliseconds) every
  half second, under the same policy's pattern (gunicorn gthread and uvicorn): before,
  the learnt baseline was the lowest latency of anything the pattern matched, every
  victim looked like a queue of ten, and the limit fell to its floor (the victims'
  throughput fell about sixfold);
- one client uploading a form slowly from a cold start (gunicorn gthread, which hands
  the body over as the view reads it): before, the upload held the only room of a new
  limiter for as long as it lasted, and the victims were refused meanwhile.

And where the limit can do nothing: gunicorn's sync workers run one request at a time
per process, so a limit of requests in flight per process never refuses; the site says
so in its log, once per process.

This module is also the URLconf of the servers it starts (`urlpatterns` below).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from bench.closed_loop import Load, load
from tests.support.workers import ROOT, Site

pytestmark = pytest.mark.slow

#: The victims' view: this long at any concurrency (a call upstream, not a queue here).
WORK = 0.050
#: How often the cheap client asks for a page that does not exist (seconds).
CHEAP_EVERY = 0.5
VICTIMS = 16
FEWER_VICTIMS = 6
POLICY = {"mode": "enforce", "algorithm": "adaptive", "limit": 8, "floor": 1,
          "period": 60, "key": "global", "path": "/api/**"}


def pid(request):
    return HttpResponse(str(os.getpid()))  # what Site's probe reads


def work(request):
    time.sleep(WORK)
    return HttpResponse("ok")


async def awork(request):
    await asyncio.sleep(WORK)
    return HttpResponse("ok")


@csrf_exempt
def upload(request):
    """The victims' view for a form: the body first."""
    fields = len(request.POST)
    time.sleep(WORK)
    return HttpResponse(str(fields))


urlpatterns = [path("free/", pid), path("api/work/", work), path("api/awork/", awork),
               path("api/upload/", upload)]


@pytest.fixture
def site(tmp_path: Path, private_redis) -> Iterator[Site]:
    """The multi-process tests' site, with this module as its URLconf."""
    site = Site(tmp_path, private_redis.url)
    (tmp_path / "adaptive_site.py").write_text(
        f"from tests.support.workers_settings import *  # noqa: F403\n"
        f"ROOT_URLCONF = {__name__!r}\n")
    site.env["DJANGO_SETTINGS_MODULE"] = "adaptive_site"
    site.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    yield site
    site.stop()


def new_policy(site: Site, victims_path: str, name: str) -> None:
    """The only policy: an adaptive one named `name` (a new limiter, from its floor)."""
    site.run("from ratelimits.models import Policy\nPolicy.objects.all().delete()\n"
             f"p = Policy(**{dict(POLICY, name=name)!r})\np.full_clean()\np.save()\n")
    site.wait_for_policy(victims_path, name)


def cheap_client(site: Site, stop: threading.Event, statuses: list[int]) -> None:
    """A 404 under the policy's pattern every CHEAP_EVERY seconds until `stop`."""
    while not stop.wait(CHEAP_EVERY):
        statuses.append(site.send("GET", "/api/missing/")[0])


def victims_beside_404s(site: Site, victims_path: str, name: str, cheap: bool
                        ) -> tuple[Load, list[int]]:
    """The victims' load under a new policy, with the cheap client beside them or not;
    and the statuses the cheap client got."""
    new_policy(site, victims_path, name)
    stop, statuses = threading.Event(), []
    beside = threading.Thread(target=cheap_client, args=(site, stop, statuses), daemon=True)
    if cheap:
        beside.start()
    try:
        # fewer victims than the limit's maximum: there is room for the 404s, which
        # are admitted and teach the limit
        victims = load(site.port, victims_path, FEWER_VICTIMS, seconds=4.0, warmup=3.0)
    finally:
        stop.set()
        if cheap:
            beside.join(10)
    return victims, statuses


@pytest.mark.parametrize("server", ["gunicorn-gthread", "uvicorn"])
def test_a_cheap_404_beside_the_victims_does_not_collapse_the_learnt_limit(site, server):
    if server == "uvicorn":
        site.start_asgi()
        victims_path = "/api/awork/"
    else:
        site.start(1, threads=32)
        victims_path = "/api/work/"
    alone, _ = victims_beside_404s(site, victims_path, "alone", cheap=False)
    beside, statuses = victims_beside_404s(site, victims_path, "beside", cheap=True)
    if beside.throughput < 0.5 * alone.throughput:
        # A new limiter starts at its floor: a stall of the machine while it learns keeps
        # it low through one measurement (seen once, beside another suite on two cores).
        # The fault this guards against collapses every measurement, so the better of
        # two fresh limiters still shows it.
        again = victims_beside_404s(site, victims_path, "beside-again", cheap=True)
        if again[0].throughput > beside.throughput:
            beside, statuses = again
    figures = (f"{server}: victims admitted/s alone {alone.throughput:.1f}, beside the "
               f"404s {beside.throughput:.1f} ({statuses.count(404)} 404s); p50 "
               f"{1000 * alone.p50:.0f} / {1000 * beside.p50:.0f} ms")
    print("\n" + figures)
    # the limit grew well past its floor of 1 (one at a time: 1 / WORK = 20/s), or the
    # comparison would show nothing
    assert alone.throughput >= 2.5 / WORK, figures
    assert beside.throughput >= 0.5 * alone.throughput, figures
    # the 404s were admitted, and taught: most of them (a loaded machine's first ones may
    # meet the new limiter still at its floor, and be refused while it learns)
    assert len(statuses) >= 8 and statuses.count(404) >= len(statuses) // 2, (figures,
                                                                             statuses)


def slow_upload(port: int, seconds: float, answered: list[tuple[bytes, float]]) -> None:
    """POST a 60-byte form to /api/upload/, a byte every `seconds` / 60; its status line
    and when it came."""
    size = 60
    with socket.create_connection(("127.0.0.1", port), timeout=seconds + 30) as sock:
        sock.sendall(b"POST /api/upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
                     b"\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: %d\r\n\r\n" % size)
        for _ in range(size):
            sock.sendall(b"a")
            time.sleep(seconds / size)
        status = sock.makefile("rb").readline().strip()
    answered.append((status, time.monotonic()))


def test_a_slow_upload_from_a_cold_start_holds_no_room_of_the_service(site):
    """The upload is admitted first, while the new limiter allows one request in flight;
    the victims come while it uploads, and are served."""
    site.start(1, threads=32)
    new_policy(site, "/api/work/", "cold")
    answered: list[tuple[bytes, float]] = []
    uploader = threading.Thread(target=slow_upload, args=(site.port, 6.0, answered))
    uploader.start()
    time.sleep(0.3)  # the upload is in the view, reading its body
    victims = load(site.port, "/api/work/", VICTIMS, seconds=3.0, warmup=0.5)
    ended = time.monotonic()
    uploader.join(30)
    figures = (f"gunicorn-gthread: victims admitted/s while a form uploads for 6 s from "
               f"a cold start: {victims.throughput:.1f} (refused {victims.refused}); "
               f"the upload got {answered}")
    print("\n" + figures)
    assert answered and answered[0][0].startswith(b"HTTP/1.1 200"), figures
    assert answered[0][1] > ended, figures  # the victims ran while it uploaded
    # one at a time gives 1 / WORK = 20/s; held by the upload, none
    assert victims.throughput >= 2.5 / WORK, figures


SERIAL = "this server runs one request at a time per process"


@pytest.mark.parametrize(("threads", "warned"), [(1, True), (4, False)])
def test_a_server_that_runs_one_request_at_a_time_says_the_limit_cannot_refuse(
    site, threads, warned
):
    site.start(1, threads=threads)  # 1: gunicorn's sync worker; 4: gthread
    new_policy(site, "/api/work/", "serial")
    for _ in range(3):
        assert site.send("GET", "/api/work/")[0] == 200
    site.stop()
    lines = [line for line in site.errors().splitlines() if SERIAL in line]
    assert len(lines) == (1 if warned else 0), lines
    if warned:
        assert "adaptive policy 'serial'" in lines[0] and "never refuses" in lines[0]
