"""What the decision flow needs done outside itself, and the two drivers that do it.

The decision is written once, as a generator (`decision.decide_flow`) that yields its
needs: `Blocking` (a call that may block: the database, a user's function), `StoreCall`
(the store's decision), `VersionRead` (the store's policy version) and `UserLoad` (the
user a key reads). `run` does each in the calling thread; `arun` awaits the store on the
event loop and sends the blocking calls to a thread.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.utils.functional import SimpleLazyObject, empty

from ratelimits.engine.flows import Flow, arun_flow, run_flow
from ratelimits.engine.interfaces import Engine
from ratelimits.engine.types import Limit
from ratelimits.pipeline.state import http_request

#: A flow of the request path: it yields the needs below and returns what it decided.
Steps = Flow[Any]


class Blocking:
    """A call that may block: run in the calling thread, or in a thread under ASGI."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args


class StoreCall:
    """The store's decision on `limits` (`engine.evaluate()`, awaited under ASGI)."""

    __slots__ = ("engine", "limits", "now")

    def __init__(self, engine: Engine, limits: list[Limit], now: float | None) -> None:
        self.engine, self.limits, self.now = engine, limits, now


class VersionRead:
    """The store's policy version (`engine.read_version()`, awaited under ASGI)."""

    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine


class UserLoad:
    """Load `request.user` before a `user` key reads it (the async stack's `auser()`)."""

    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request


def run(steps: Steps) -> Any:
    """Run a flow of the request path in this thread."""
    return run_flow(steps, _perform)


async def arun(steps: Steps) -> Any:
    """Run a flow of the request path on the event loop."""
    return await arun_flow(steps, _aperform)


def _perform(need: Any) -> Any:
    if isinstance(need, StoreCall):
        return need.engine.evaluate(need.limits, need.now)
    if isinstance(need, VersionRead):
        return need.engine.read_version()
    if isinstance(need, Blocking):
        return need.fn(*need.args)
    return None  # UserLoad: a blocking stack reads request.user when a key asks


async def _aperform(need: Any) -> Any:
    if isinstance(need, StoreCall):
        return await need.engine.aevaluate(need.limits, need.now)
    if isinstance(need, VersionRead):
        return await need.engine.aread_version()
    if isinstance(need, Blocking):
        return await sync_to_async(need.fn)(*need.args)
    await _load_user(need.request)
    return None


async def _load_user(request: Any) -> None:
    """`request.user` made concrete with `auser()`, so reading it runs no query here."""
    base = http_request(request)
    user = getattr(base, "user", None)
    auser = getattr(base, "auser", None)
    if auser is None or not isinstance(user, SimpleLazyObject):
        return
    if getattr(user, "_wrapped", empty) is empty:  # not evaluated yet
        base.user = await auser()
