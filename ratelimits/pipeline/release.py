"""After the response: the concurrency slots a request holds, given back."""

from __future__ import annotations

import logging
from typing import Any

from ratelimits.engine.types import Decision
from ratelimits.pipeline.state import STATE_ATTR, RequestState, http_request
from ratelimits.pipeline.watchdog import watchdog

logger = logging.getLogger("ratelimits")


def release(request: Any, state: RequestState | None = None) -> None:
    """Free the concurrency slots this request holds (idempotent, never raises)."""
    for engine, decision in _holds(request, state):
        try:
            engine.release(decision)
        except Exception as exc:  # the slot expires by itself; do not fail the response
            logger.warning("ratelimits: could not release a concurrency slot (%s)", exc)


async def arelease(request: Any, state: RequestState | None = None) -> None:
    """`release()` for the async stack."""
    for engine, decision in _holds(request, state):
        try:
            await engine.arelease(decision)
        except Exception as exc:
            logger.warning("ratelimits: could not release a concurrency slot (%s)", exc)


def _holds(request: Any, state: RequestState | None) -> list[tuple[Any, Decision]]:
    """The (engine, decision) pairs whose slots this request holds, taken from it."""
    if state is None:
        state = getattr(http_request(request), STATE_ATTR, None)
        if state is None:
            return []
    holds, state.holds = state.holds, []
    for _engine, decision in holds:
        watchdog.drop(decision)
    return holds
