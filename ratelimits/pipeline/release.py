"""After the response: the concurrency slots a request holds, given back; an adaptive
policy's tickets also teach its limit the request's latency (`engine.adaptive`).

What the latency is: from the decision to the release, less the time the view spent
waiting for the request's body (`time_body`), and not at all for a client error.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.core.signals import request_finished, request_started

from ratelimits import runtime
from ratelimits.engine.adaptive import AdaptiveEngine
from ratelimits.engine.types import Decision
from ratelimits.pipeline.state import STATE_ATTR, RequestState, http_request
from ratelimits.pipeline.watchdog import watchdog

logger = logging.getLogger("ratelimits")

#: Where a request's `TimedBody` rides on its HttpRequest (see `time_body`).
BODY_ATTR = "_ratelimits_body"


def release(request: Any, state: RequestState | None = None, response: Any = None) -> None:
    """Free the concurrency slots this request holds (idempotent, never raises); with
    the `response`, an adaptive limit learns nothing from a client error."""
    learn, waited = _sample(request, response)
    for engine, decision in _holds(request, state):
        try:
            if isinstance(engine, AdaptiveEngine):
                engine.release(decision, learn=learn, waited=waited)
            else:
                engine.release(decision)
        except Exception as exc:  # never fails the response: tried again (watchdog)
            watchdog.release_later(engine, decision, exc)


async def arelease(request: Any, state: RequestState | None = None,
                   response: Any = None) -> None:
    """`release()` for the async stack."""
    learn, waited = _sample(request, response)
    for engine, decision in _holds(request, state):
        try:
            if isinstance(engine, AdaptiveEngine):  # in process: nothing to await
                engine.release(decision, learn=learn, waited=waited)
            else:
                await engine.arelease(decision)
        except Exception as exc:
            watchdog.release_later(engine, decision, exc)


# -- the end of a response no glue layer of ours sees ------------------------------------

#: The requests whose slots wait for the end of their response: those a DRF throttle
#: decided without the middleware, which nothing of ours sees end. Django sends
#: `request_finished` from the response's close(), in the request's context, and
#: `request_started` begins each request with none waiting. Both receivers are connected
#: on first use: a site that never needs them pays for neither on every request.
_finishing: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "ratelimits_finishing", default=None)
_FINISH_UID = "ratelimits.release_when_finished"


def release_when_finished(request: Any) -> None:
    """Release `request`'s slots once its response is finished (or the client went away)."""
    if not _hooked.on:
        _hooked.connect()
    pending = _finishing.get()
    if pending is None:  # the first such request: it started before the receivers
        pending = []
        _finishing.set(pending)
    pending.append(request)


def _request_started(**kwargs: Any) -> None:
    _finishing.set([])


def _request_finished(**kwargs: Any) -> None:
    pending = _finishing.get()
    if pending:
        for request in pending:
            release(request)
        pending.clear()


class _Hooked:
    """Whether the two request receivers are connected (`release_when_finished`)."""

    def __init__(self) -> None:
        self.on = False

    def connect(self) -> None:
        request_started.connect(_request_started, dispatch_uid=_FINISH_UID)
        request_finished.connect(_request_finished, dispatch_uid=_FINISH_UID)
        self.on = True

    def reset(self) -> None:
        request_started.disconnect(dispatch_uid=_FINISH_UID)
        request_finished.disconnect(dispatch_uid=_FINISH_UID)
        self.on = False


_hooked = _Hooked()
runtime.on_reset(_hooked.reset)


def _holds(request: Any, state: RequestState | None) -> Sequence[tuple[Any, Decision]]:
    """The (engine, decision) pairs whose slots this request holds, taken from it."""
    if state is None:
        state = getattr(http_request(request), STATE_ATTR, None)
        if state is None:
            return ()
    holds, state.holds = state.holds, ()
    for _engine, decision in holds:
        watchdog.drop(decision)
    return holds


def _sample(request: Any, response: Any) -> tuple[bool, float]:
    """Whether the request's latency teaches an adaptive limit, and the seconds to leave
    out of it. A 4xx is the client's mistake, often answered before any work (a 404, a
    failed login): it says nothing of the service's load. A 5xx does: a slow one is the
    overload the limit is for."""
    status = getattr(response, "status_code", None)
    learn = not (isinstance(status, int) and 400 <= status < 500)
    body = getattr(http_request(request), BODY_ATTR, None)
    return learn, body.seconds if isinstance(body, TimedBody) else 0.0


class TimedBody:
    """A WSGI request's body stream that counts the seconds spent waiting for it, and
    meanwhile does not count the request in flight under its adaptive limits (`holds`):
    a client that uploads slowly holds no room of the service's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.seconds = 0.0
        self.holds: list[tuple[AdaptiveEngine, Decision]] = []

    def read(self, size: int = -1, /) -> bytes:
        with self._waiting():
            data: bytes = self.stream.read(size)
        return data

    def readline(self, size: int = -1, /) -> bytes:
        with self._waiting():
            line: bytes = self.stream.readline(size)
        return line

    def seekable(self) -> bool:
        return bool(self.stream.seekable())

    def close(self) -> None:
        self.stream.close()

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        for engine, decision in self.holds:
            engine.pause(decision)
        started = runtime.clock().monotonic()
        try:
            yield
        finally:
            self.seconds += runtime.clock().monotonic() - started
            for engine, decision in self.holds:
                engine.resume(decision)


def time_body(request: Any, engine: AdaptiveEngine, decision: Decision) -> None:
    """From now on, while the view waits for this request's body, leave that time out of
    its latency (`release`) and the request out of `decision`'s count in flight: a WSGI
    server (gunicorn's workers, uWSGI) hands the body over as the view reads it, so a
    slow upload would look like a slow service, and hold its room. Under ASGI, Django
    reads the whole body before the middleware runs."""
    base = http_request(request)
    timed = getattr(base, BODY_ATTR, None)
    if not isinstance(timed, TimedBody):
        if "wsgi.input" not in base.META or not _has_body(base.META):
            return
        # Every read of the body (request.body, .POST, .FILES, .read(), DRF's parsers)
        # goes through HttpRequest._stream; Django offers no public hook in front of it.
        timed = TimedBody(base._stream)
        base._stream = timed
        setattr(base, BODY_ATTR, timed)
    timed.holds.append((engine, decision))


def _has_body(meta: Mapping[str, Any]) -> bool:
    """Whether Django will read a body (under WSGI, no more than CONTENT_LENGTH)."""
    try:
        return int(meta.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return False


class _Told:
    """Whether this process said that its adaptive limits cannot refuse (once)."""

    def __init__(self) -> None:
        self.serial = False
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.serial = False


_told = _Told()
runtime.on_reset(_told.reset)


def adaptive_taken(request: Any, engine: AdaptiveEngine, decision: Decision,
                   names: Sequence[str]) -> None:
    """The request holds `engine`'s tickets of the adaptive policies `names`: time its
    body (`time_body`), and say once per process if the server runs one request at a
    time in it (PEP 3333's `wsgi.multithread` False: gunicorn's sync workers, uWSGI
    without threads), where a limit of requests in flight per process never refuses."""
    time_body(request, engine, decision)
    if http_request(request).META.get("wsgi.multithread") is not False:
        return
    with _told.lock:
        if _told.serial:
            return
        _told.serial = True
    logger.warning(
        "ratelimits: adaptive policy %s: this server runs one request at a time per "
        "process (wsgi.multithread is False: gunicorn's sync workers, uWSGI without "
        "threads), so a limit learnt per process never refuses anything. Serve with "
        "threads (gunicorn -k gthread --threads N) or ASGI (uvicorn) for it to apply.",
        ", ".join(repr(name) for name in names))
