"""A request stopped while it waits for its turn gives back what it holds.

Requests go through Django's own ASGI handler as a server hands them over, on the suite's
Redis: when the client goes away (`http.disconnect`), Django cancels the request's task,
here while it waits for its turn. The app's clock says when a request begins to wait and
holds it there until cancelled, so no time passes and nothing is timed.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from django.test import Client

from ratelimits.pipeline.waiting import room
from ratelimits.pipeline.watchdog import watchdog
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock

pytestmark = pytest.mark.django_db


class Held(Clock):
    """A clock that stands still; a wait says it began and lasts until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.began: asyncio.Event | None = None

    async def asleep(self, seconds: float) -> None:
        assert self.began is not None
        self.began.set()
        await asyncio.Event().wait()  # until the task is cancelled

    def sleep(self, seconds: float) -> None:
        raise SystemExit("the worker is told to stop while the request waits")


async def request(app: ASGIHandler, ip: str, gone: asyncio.Event | None = None) -> int | None:
    """One GET /async/ from `ip`; the client goes away once `gone` is set. Its status,
    None when it got no answer."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/async/", "raw_path": b"/async/",
             "query_string": b"", "root_path": "", "headers": [(b"host", b"example.com")],
             "client": (ip, 40000), "server": ("example.com", 80)}
    asked = False
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    return int(starts[0]["status"]) if starts else None  # type: ignore[call-overload]


def abandon_a_wait(ip: str) -> None:
    """`ip` asks twice: the first request is served, the second waits for its turn and
    its client goes away meanwhile."""
    clock = Held()

    async def scenario() -> None:
        app = ASGIHandler()
        assert await request(app, ip) == 200  # its turn is now
        clock.began, gone = asyncio.Event(), asyncio.Event()
        waiting = asyncio.ensure_future(request(app, ip, gone))
        await asyncio.wait_for(clock.began.wait(), 10)  # it waits for its turn at 1 s
        gone.set()  # the client goes away: Django cancels the request
        assert await asyncio.wait_for(waiting, 10) is None

    with using_clock(clock):
        async_to_sync(scenario)()


def fresh_request(ip: str) -> int | None:
    async def one() -> int | None:
        return await request(ASGIHandler(), ip)

    return async_to_sync(one)()


PACED = {"name": "paced", "algorithm": "gcra", "limit": 1, "period": 1, "burst": 1,
         "max_wait": 4, "key": "ip", "path": "/async/"}


def test_abandoned_waits_give_their_concurrency_slots_back(make_policy):
    make_policy(name="two-at-once", algorithm="concurrency", limit=2, period=30,
                key="global", path="/async/")
    make_policy(**PACED)
    abandon_a_wait("10.0.0.1")
    abandon_a_wait("10.0.0.2")
    # both slots are free: neither is renewed for a request that is gone
    assert watchdog.in_flight() == 0
    assert fresh_request("10.0.0.3") == 200
    assert fresh_request("10.0.0.4") == 200
    assert room.waiting() == 0


def test_an_abandoned_wait_gives_its_adaptive_place_back(make_policy):
    make_policy(name="capacity", algorithm="adaptive", limit=1, floor=1, period=60,
                key="global", path="/async/")
    make_policy(**PACED)
    abandon_a_wait("10.0.0.1")
    # the learnt limit of one request in flight is free again: not a 503 for good
    assert fresh_request("10.0.0.2") == 200


def test_a_sync_wait_stopped_by_the_worker_gives_its_slots_back(make_policy):
    """A sync worker told to stop (gunicorn's worker timeout) while a request waits."""
    make_policy(name="one-at-once", algorithm="concurrency", limit=1, period=30,
                key="global", path="/hello/")
    make_policy(**{**PACED, "path": "/hello/"})
    client = Client(raise_request_exception=True)
    assert client.get("/hello/").status_code == 200
    stopped: list[BaseException] = []

    def run() -> None:  # in a thread: SystemExit is the thread's own end
        try:
            with using_clock(Held()):
                client.get("/hello/")
        except BaseException as exc:
            stopped.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert [type(e) for e in stopped] == [SystemExit]
    assert watchdog.in_flight() == 0 and room.waiting() == 0
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.9").status_code == 200
