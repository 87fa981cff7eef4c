"""The one evaluation path that the middleware, the DRF throttle and `@ratelimit` share.

`evaluate()` (and `aevaluate()` on the async stack) runs the decision (`decision.decide`,
`decision.adecide`) on a request for the DRF scopes in play and returns a `Verdict`, or
None when no policy applies; a bug of ours admits the request and is logged. The glue
also finds here what it does around the decision: which layer decides a request
(`throttle_decides`), the wait for a delayed turn (`wait_turn`, from `waiting`) and the
release of held concurrency slots (`release`, from `release`).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ratelimits.pipeline.decision import adecide, decide
from ratelimits.pipeline.release import arelease, release
from ratelimits.pipeline.report import asend_all, log_unexpected, signals_deferred
from ratelimits.pipeline.routing import throttle_decides
from ratelimits.pipeline.state import RequestState, http_request, state_for
from ratelimits.pipeline.verdict import (
    ADMITTED,
    LIMITED,
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    PolicyOutcome,
    Verdict,
)
from ratelimits.pipeline.waiting import asleep, await_turn, sleep, wait_turn

__all__ = [
    "ADMITTED",
    "LIMITED",
    "UNAVAILABLE",
    "UNAVAILABLE_RETRY_AFTER",
    "UNSCOPED",
    "PolicyOutcome",
    "Verdict",
    "aevaluate",
    "arelease",
    "asleep",
    "await_turn",
    "evaluate",
    "http_request",
    "release",
    "sleep",
    "state_for",
    "throttle_decides",
    "wait_turn",
]

#: The scopes of a request outside DRF: only policies without a scope apply.
UNSCOPED: frozenset[str] = frozenset({""})


def evaluate(
    request: Any, *, scopes: frozenset[str], sender: type, state: RequestState | None = None,
    middleware: bool = False,
) -> Verdict | None:
    """Decide a request against the policies for `scopes`; None when nothing applies (or,
    asked by the `middleware`, when the view decides the request itself).

    Raises only ImproperlyConfigured (a settings mistake must stop the request, never
    admit it unlimited); any other failure is logged and the request admitted, because
    a rate limiter must not turn its own bug into an outage.
    """
    try:
        return decide(request, scopes, sender, state, middleware=middleware)
    except ImproperlyConfigured:
        raise  # a settings mistake must not switch enforcement off unnoticed
    except Exception:
        log_unexpected(request)
        return None


async def aevaluate(
    request: Any, *, scopes: frozenset[str], sender: type, state: RequestState | None = None,
    middleware: bool = False,
) -> Verdict | None:
    """`evaluate()` for the async stack: the store awaited on the event loop (see
    `engine.aio`). Only what may block goes to a thread, as Django's `sync_to_async`
    would run it: reading the policies from the database (at most once a
    `DB_CHECK_EVERY`, and when another process changed them), the version when no
    reply carried it (at most once a second), and your own functions (`EXEMPT`,
    `TIER`, `call:` keys). A `user` key reads the user with `request.auser()`."""
    with signals_deferred() as pending:
        try:
            verdict = await adecide(request, scopes, sender, state, middleware=middleware)
        except ImproperlyConfigured:
            raise
        except Exception:
            log_unexpected(request)
            return None
    await asend_all(pending)
    return verdict
