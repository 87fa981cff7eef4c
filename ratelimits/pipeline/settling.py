"""After the response: the charges that waited for it, and the counts it clears.

A policy with `charge_on` checks an admitted request before the view without charging
it (`Limit.stage` CHECK); here, when the response is one it names (a status, a class of
statuses, or `login_failed`: Django's `user_login_failed` sent during the request), the
request is charged (`SETTLE`), in one store call for all such policies of the request.
A response that `reset_on` names (or `login`: `user_logged_in`) clears the client's
count and lockout under that policy.

How exact: a client at its limit is refused before the view, but requests already in
the view when its last unit went are charged only if there is room when they end. So a
client gets at most its limit plus the requests it had in flight at once (per process,
its server's threads) through in one window; a lockout then holds it.

Nothing here ever fails a response: a store that cannot be reached is logged, and that
charge is lost.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from asgiref.sync import sync_to_async

from ratelimits import runtime
from ratelimits.engine.types import SETTLE, Limit
from ratelimits.pipeline.engines import get_engine, get_local_engine
from ratelimits.pipeline.plan import Planned
from ratelimits.pipeline.resolver import PER_PROCESS
from ratelimits.pipeline.state import STATE_ATTR, RequestState, http_request

logger = logging.getLogger("ratelimits")

__all__ = ["asettle", "mark_signal", "settle"]

def _taken(state: RequestState, response: Any) -> tuple[list[Planned], list[Planned]]:
    """The policies to charge (their limits set to settle) and those to reset for this
    response, taken from the request's state (so a second look finds nothing)."""
    pending, state.pending = state.pending, ()
    status = getattr(response, "status_code", None)
    charges: list[Planned] = []
    resets: list[Planned] = []
    seen: set[int] = set()
    for planned in pending:
        policy = planned.policy
        if policy.id in seen:
            continue
        seen.add(policy.id)
        if policy.reset_on is not None and policy.reset_on.matches(status, state.logged_in):
            resets.append(planned)
        elif policy.charge_on is not None and policy.charge_on.matches(
            status, state.login_failed
        ):
            charges.append(dataclasses.replace(
                planned, limit=dataclasses.replace(planned.limit, stage=SETTLE)))
    return charges, resets


def _engine(planned: Planned) -> Any:
    """The engine that decides `planned`'s policy: this process's, or the store's."""
    return get_local_engine() if planned.policy.counting == PER_PROCESS else get_engine()


def _by_engine(charges: list[Planned]) -> list[tuple[Any, list[Limit]]]:
    """The limits to charge, grouped by the engine that charges them (one call each)."""
    groups: dict[int, tuple[Any, list[Limit]]] = {}
    for planned in charges:
        engine = _engine(planned)
        groups.setdefault(id(engine), (engine, []))[1].append(planned.limit)
    return list(groups.values())


def _due(request: Any, state: RequestState | None, response: Any
         ) -> tuple[list[Planned], list[Planned]]:
    """What `response` calls for: the charges and the resets (empty when nothing waits)."""
    state = state or getattr(http_request(request), STATE_ATTR, None)
    if state is None or not state.pending:
        return [], []
    return _taken(state, response)


def settle(request: Any, state: RequestState | None, response: Any) -> None:
    """Charge and clear what `response` calls for (never raises)."""
    charges, resets = _due(request, state, response)
    try:
        now = _now(charges or resets)
        for engine, limits in _by_engine(charges):
            engine.evaluate(limits, now)
        for planned in resets:
            _engine(planned).reset(planned.limit, now)
    except Exception as exc:
        _lost(exc)


async def asettle(request: Any, state: RequestState | None, response: Any) -> None:
    """`settle()` for the async stack: the store's charge awaited on the event loop."""
    charges, resets = _due(request, state, response)
    try:
        now = _now(charges or resets)
        for engine, limits in _by_engine(charges):
            await engine.aevaluate(limits, now)
        for planned in resets:
            await sync_to_async(_engine(planned).reset)(planned.limit, now)
    except Exception as exc:
        _lost(exc)


def _now(due: list[Planned]) -> float | None:
    """The time to charge at: the installed clock's (see `Context.now`); nothing to do
    without `due`."""
    return runtime.decision_time() if due else None


def _lost(exc: Exception) -> None:
    logger.warning("ratelimits: a charge or reset after the response could not be made "
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
