"""After the response: the reservations it does not call for taken back, and the counts
it clears.

A policy with `charge_on` charges an admitted request before the view, in the request's
one store call, as any policy does (`Limit.stage` RESERVE): a request in flight counts
against the limit. Here, when the response is one it names (a status, a class of
statuses, or `login_failed`: Django's `user_login_failed` sent during the request), the
charge stays, and nothing is sent; when it is not, the charge is taken back (`REFUND`, at
the reservation's own time), in one store call for all such policies of the request. A
response that `reset_on` names (or `login`: `user_logged_in`) clears the client's count
and lockout under that policy.

How exact: a client never has more than its limit charged and in flight together, so at
most `limit` of its requests run the view before the responses are known, on any server;
a request whose response never comes (the client went away, the task was cancelled)
stays charged. A token bucket gets its units back only while no later request of the
client refilled it, and a GCRA limit only while the units could not have been released
meanwhile (the response came within cost × period / limit): else the charge stays
(fewer admitted, never more).

`finish()` (and `afinish()`, `abandoned()`) is how a glue layer ends a request: the
headers, this settling and the release of concurrency slots, in that order.

Nothing here ever fails a response: a store that cannot be reached is logged, and that
refund is lost (the charge stays).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async

from ratelimits import runtime
from ratelimits.engine.keynames import to_us
from ratelimits.engine.types import REFUND, Limit, Outcome
from ratelimits.pipeline.compiled import PER_PROCESS
from ratelimits.pipeline.engines import get_engine, get_local_engine
from ratelimits.pipeline.plan import Planned
from ratelimits.pipeline.release import arelease, release
from ratelimits.pipeline.responses import decorate
from ratelimits.pipeline.state import STATE_ATTR, RequestState, http_request
from ratelimits.pipeline.verdict import Verdict

logger = logging.getLogger("ratelimits")

__all__ = ["Pending", "asettle", "mark_signal", "pending_of", "settle", "settle_raised"]


class Pending(NamedTuple):
    """A policy whose response may keep or take back its charge, or clear the count."""

    planned: Planned
    #: The limit that charged, and when (the store's time, s) and by this process's
    #: monotonic clock: None when nothing was charged (a shadow policy's would-be refusal,
    #: a store out of reach).
    limit: Limit | None = None
    at: float | None = None
    mono: float = 0.0


def pending_of(planned: list[Planned], verdict: Verdict) -> list[Pending]:
    """What the responses of an admitted request's `planned` policies may act on: each
    policy with `charge_on` or `reset_on`, with the reservation its decision made."""
    results = {o.policy.id: o.result for o in verdict.outcomes if o.result is not None}
    mono = runtime.clock().monotonic()
    out = []
    for p in planned:
        if not p.policy.settles:
            continue
        result = results.get(p.policy.id)
        if result is None or result.outcome is not Outcome.ADMITTED:
            out.append(Pending(p))  # nothing charged: only a reset may apply
            continue
        at = next((d.reserved_at for d in verdict.decisions
                   if any(r is result for r in d.results)), None)
        out.append(Pending(p, None if at is None else result.limit, at, mono))
    return out


def _taken(state: RequestState, response: Any
           ) -> tuple[list[tuple[Planned, float]], list[Planned], list[Pending]]:
    """The reservations to take back (their limits set to refund, with the time to do
    it at), the policies to reset and the charges kept, for this response, taken from the
    request's state (so a second look finds nothing)."""
    pending, state.pending = state.pending, ()
    status = getattr(response, "status_code", None)
    refunds: list[tuple[Planned, float]] = []
    resets: list[Planned] = []
    kept: list[Pending] = []
    seen: set[int] = set()
    for item in pending:
        planned = item.planned
        policy = planned.policy
        if policy.id in seen:
            continue
        seen.add(policy.id)
        if policy.reset_on is not None and policy.reset_on.matches(status, state.logged_in):
            resets.append(planned)
        elif policy.charge_on is None or item.limit is None or item.at is None:
            continue
        elif policy.charge_on.matches(status, state.login_failed):
            kept.append(item)
        elif _returnable(item):
            refunds.append((dataclasses.replace(
                planned, limit=dataclasses.replace(item.limit, stage=REFUND)), item.at))
    return refunds, resets, kept


def _returnable(item: Pending) -> bool:
    """Whether the units of `item` can still be taken back exactly: for an algorithm
    whose state a later request may restart (GCRA), only while they could not have been
    released meanwhile (`Algorithm.refund_within`)."""
    limit = item.limit
    if limit is None:
        return True
    within = limit.spec.refund_within(limit)
    return within is None or runtime.clock().monotonic() - item.mono < within


def _engine(planned: Planned) -> Any:
    """The engine that decides `planned`'s policy: this process's, or the store's."""
    return get_local_engine() if planned.policy.counting == PER_PROCESS else get_engine()


def _by_engine(refunds: list[tuple[Planned, float]]
               ) -> list[tuple[Any, float, list[Limit]]]:
    """The limits to refund, grouped by engine and reservation time (one call each)."""
    groups: dict[tuple[int, float], tuple[Any, float, list[Limit]]] = {}
    for planned, at in refunds:
        engine = _engine(planned)
        groups.setdefault((id(engine), at), (engine, at, []))[2].append(planned.limit)
    return list(groups.values())


def _due(request: Any, state: RequestState | None, response: Any
         ) -> tuple[list[tuple[Planned, float]], list[Planned], list[Pending]]:
    """What `response` calls for: the refunds, the resets and the charges kept (empty
    when nothing waits)."""
    state = state or getattr(http_request(request), STATE_ATTR, None)
    if state is None or not state.pending:
        return [], [], []
    return _taken(state, response)


def _count_kept(kept: list[Pending]) -> None:
    """Count the charges the responses kept, in process (no store call: the counts ride
    with a later one)."""
    for item in kept:
        assert item.limit is not None and item.at is not None
        if item.limit.name:
            _engine(item.planned).count_fields(item.limit.name, to_us(item.at), {"c": 1})


def settle(request: Any, state: RequestState | None, response: Any) -> None:
    """Take back and clear what `response` calls for (never raises)."""
    refunds, resets, kept = _due(request, state, response)
    try:
        _count_kept(kept)
        for engine, at, limits in _by_engine(refunds):
            engine.evaluate(limits, at)
        if resets:
            now = runtime.decision_time()
            for planned in resets:
                _engine(planned).reset(planned.limit, now)
    except Exception as exc:
        _lost(exc)


async def asettle(request: Any, state: RequestState | None, response: Any) -> None:
    """`settle()` for the async stack: the store's refund awaited on the event loop."""
    refunds, resets, kept = _due(request, state, response)
    try:
        _count_kept(kept)
        for engine, at, limits in _by_engine(refunds):
            await engine.aevaluate(limits, at)
        if resets:
            now = runtime.decision_time()
            for planned in resets:
                await sync_to_async(_engine(planned).reset)(planned.limit, now)
    except Exception as exc:
        _lost(exc)


class _Raised(NamedTuple):
    """The response Django makes of an exception a view raised, as far as `charge_on`
    and `reset_on` read it: its status."""

    status_code: int


# -- the glue's end of a request: headers, settling, slots -------------------------


def finish(request: Any, state: RequestState, response: Any) -> Any:
    """The end of a decided request, for every glue layer that answers one (the
    middleware, `@ratelimit` without it): headers now; the refunds and resets the
    response calls for (`settle`); concurrency slots when the response is finished.

    A streaming response is still running when it leaves the middleware, so its slots are
    released from the response's close(), which the server calls once the body is sent
    (or the client went away).
    """
    decorate(state, response)
    if state.pending:
        settle(request, state, response)
    if state.holds:
        if getattr(response, "streaming", False):
            # Django calls every entry of _resource_closers from HttpResponseBase.close().
            # It offers no public hook on one response's end: `request_finished` names no
            # response (a test client's second request would orphan the first's slots),
            # and wrapping streaming_content would cost a FileResponse its file_wrapper.
            response._resource_closers.append(
                lambda: release(request, state, response))
        else:
            release(request, state, response)
    return response


async def afinish(request: Any, state: RequestState, response: Any) -> Any:
    """`finish()` for the async stack: the slots are released on the event loop."""
    if state.pending:
        await asettle(request, state, response)
    if not state.holds or getattr(response, "streaming", False):
        return finish(request, state, response)
    decorate(state, response)
    await arelease(request, state, response)
    return response


async def abandoned(request: Any, state: RequestState) -> None:
    """A request that will have no response (its task cancelled, or failed): its slots
    back; what it reserved back too, unless its view was called: a view that ran is
    charged (a sync view runs on in its thread after the task is cancelled)."""
    if state.pending and not state.view_started:
        await asettle(request, state, None)  # no response: nothing it names
    await arelease(request, state)


def status_of(exc: BaseException) -> int:
    """The status of the response Django makes of `exc` (see
    django.core.handlers.exception.response_for_exception)."""
    from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
    from django.http import Http404
    from django.http.multipartparser import MultiPartParserError

    if isinstance(exc, Http404):
        return 404
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, MultiPartParserError | BadRequest | SuspiciousOperation):
        return 400
    return 500


def settle_raised(request: Any, state: RequestState, exc: BaseException) -> None:
    """`settle()` for a view that raised `exc` where no middleware sees the response
    Django makes of it: as that response would be (a 404 for Http404, and so on)."""
    settle(request, state, _Raised(status_of(exc)))


def _lost(exc: Exception) -> None:
    logger.warning("ratelimits: a refund or reset after the response could not be made "
                   "(%s); it is lost", exc)


def mark_signal(request: Any, *, failed: bool) -> None:
    """Django said, during `request`, that a login failed (`failed`) or succeeded: a
    policy charging on `login_failed` or resetting on `login` acts on its response."""
    if request is None:
        return
    state = getattr(http_request(request), STATE_ATTR, None)
    if state is None:
        return
    if failed:
        state.login_failed = True
    else:
        state.logged_in = True
