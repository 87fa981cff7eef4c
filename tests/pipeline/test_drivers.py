"""One scenario table, every row decided by both drivers of the one decision: `decide`
(blocking, as WSGI runs it) and `adecide` (on the event loop, as ASGI runs it). Each row
says what a sequence of requests gets; both drivers must give exactly that, so the sync
and the async stack cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import RequestFactory

from ratelimits.middleware import RateLimitMiddleware
from ratelimits.pipeline import evaluation
from ratelimits.pipeline.engines import get_adaptive_engine
from ratelimits.pipeline.state import state_for

DEAD_STORE = "redis://127.0.0.1:1/0"  # nothing listens on port 1: refused at once


@dataclass(frozen=True)
class Row:
    policies: list[dict[str, Any]]
    #: (path, client address, extra headers) per request
    requests: list[tuple[str, str, dict[str, str]]]
    #: per request: (status, Retry-After, the policies that refused) — None: no policy applied
    expect: list[tuple[int, int, tuple[str, ...]] | None]
    settings: dict[str, Any] = field(default_factory=dict)


def get(path: str = "/hello/", ip: str = "10.0.0.1", **headers: str):
    return (path, ip, headers)


ADMIT = (200, 0, ())

SCENARIOS = {
    "one policy in the store: the third request refused": Row(
        [{"name": "a", "limit": 2}],
        [get(), get(), get(), get(ip="10.0.0.2")],
        [ADMIT, ADMIT, (429, 3600, ("a",)), ADMIT],
    ),
    "three policies in one call: the tightest refuses, the others are not charged": Row(
        [{"name": "wide", "limit": 5, "priority": 1}, {"name": "tight", "limit": 1},
         {"name": "global", "limit": 3, "key": "global"}],
        [get(), get(), get(ip="10.0.0.2"), get(ip="10.0.0.3"), get(ip="10.0.0.4")],
        [ADMIT, (429, 3600, ("tight",)), ADMIT, ADMIT, (429, 3600, ("global",))],
    ),
    "a per-process policy: decided in this process": Row(
        [{"name": "node", "limit": 1, "counting": "per_process"}],
        [get(), get()],
        [ADMIT, (429, 3600, ("node",))],
    ),
    "the store refuses: what the per-process layer took is given back": Row(
        [{"name": "node", "limit": 2, "counting": "per_process"},
         {"name": "shared", "limit": 1}],
        [get(), get(), get(ip="10.0.0.2"), get(ip="10.0.0.2")],
        # the refused second request took no unit of `node`: a second client still passes
        [ADMIT, (429, 3600, ("shared",)), ADMIT, (429, 3600, ("shared",))],
    ),
    "a local layer refuses: the store is not asked, and charges nothing": Row(
        [{"name": "node", "limit": 1, "counting": "per_process"},
         {"name": "shared", "limit": 2}],
        [get(), get(), get(ip="10.0.0.2"), get(ip="10.0.0.2")],
        [ADMIT, (429, 3600, ("node",)), ADMIT, (429, 3600, ("node",))],
    ),
    "adaptive, per-process and the store: all or nothing": Row(
        [{"name": "busy", "algorithm": "adaptive", "limit": 8, "floor": 1, "period": 60,
          "key": "global"},
         {"name": "node", "limit": 3, "counting": "per_process"},
         {"name": "shared", "limit": 1}],
        [get(), get(), get()],
        [ADMIT, (429, 3600, ("shared",)), (429, 3600, ("shared",))],
    ),
    "shadow: counted, never refused": Row(
        [{"name": "watch", "limit": 1, "mode": "shadow"}],
        [get(), get(), get()],
        [ADMIT, ADMIT, ADMIT],
    ),
    "a key that cannot name the client, on_error deny: 503 before any engine": Row(
        [{"name": "by-key", "limit": 5, "key": "call:tests.support.hooks.failing_key",
          "on_error": "deny", "path": "/login/"},
         {"name": "plain", "limit": 1}],
        [get("/login/"), get(), get()],
        # the 503 charged `plain` nothing: its one unit is still there for the next
        [(503, 1, ()), ADMIT, (429, 3600, ("plain",))],
    ),
    "the store out of reach: each policy's on_error decides": Row(
        [{"name": "strict", "limit": 5, "on_error": "deny", "path": "/login/"},
         {"name": "lenient", "limit": 5, "on_error": "allow", "path": "/hello/"},
         {"name": "fallback", "limit": 1, "on_error": "local", "path": "/page/"}],
        [get("/login/"), get("/hello/"), get("/page/"), get("/page/")],
        [(503, 1, ()), ADMIT, ADMIT, (429, 3600, ("fallback",))],
        settings={"CACHE": "local", "REDIS_URL": DEAD_STORE},
    ),
    "EXEMPT: left alone": Row(
        [{"name": "a", "limit": 1}],
        [get(HTTP_X_HEALTH="1"), get(HTTP_X_HEALTH="1"), get(), get()],
        [None, None, ADMIT, (429, 3600, ("a",))],
        settings={"EXEMPT": "tests.support.hooks.exempt_health"},
    ),
    "a path CommonMiddleware redirects: left alone, the redirected request counts": Row(
        [{"name": "a", "limit": 1}],
        [get("/hello"), get("/hello"), get("/hello/"), get("/hello/")],
        [None, None, ADMIT, (429, 3600, ("a",))],
    ),
    "no policy matches the path": Row(
        [{"name": "a", "limit": 1, "path": "/api/*"}],
        [get(), get()],
        [None, None],
    ),
    "a policy on GET counts the methods a function view answers as GET": Row(
        [{"name": "a", "limit": 1, "methods": "GET"}],
        [("/hello/", "10.0.0.1", {"method": "OPTIONS"}), get()],
        [ADMIT, (429, 3600, ("a",))],
    ),
}


def decide(driver: str, path: str, ip: str, headers: dict[str, str]):
    method = headers.pop("method", "GET")
    request = RequestFactory().generic(method, path, REMOTE_ADDR=ip, **headers)
    kwargs = {"scopes": evaluation.UNSCOPED, "sender": RateLimitMiddleware,
              "state": state_for(request), "middleware": True}
    if driver == "sync":
        verdict = evaluation.evaluate(request, **kwargs)
    else:
        verdict = async_to_sync(evaluation.aevaluate)(request, **kwargs)
    evaluation.release(request, kwargs["state"])  # the slots it holds, as after a response
    return verdict


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_both_drivers_decide_every_scenario_alike(name, driver, make_policy, settings, clock):
    row = SCENARIOS[name]
    clock.advance(3600 - clock.time() % 3600)  # at an hour's start: Retry-After is 3600
    settings.RATELIMITS = {**settings.RATELIMITS, **row.settings}
    for fields in row.policies:
        make_policy(**fields)
    got = []
    for path, ip, headers in row.requests:
        verdict = decide(driver, path, ip, dict(headers))
        got.append(None if verdict is None else (
            verdict.status, verdict.retry_after,
            tuple(o.policy.name for o in verdict.rejected_by)))
    assert got == row.expect
    # every slot taken was recorded in the request's state, so its release gave it back
    assert get_adaptive_engine().in_flight() == 0
