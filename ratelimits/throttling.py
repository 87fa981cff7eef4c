"""`PolicyThrottle`: the policies seen from a DRF view (the only module importing DRF).

It applies the policies whose `scope` equals the view's `throttle_scope`, and the
unscoped ones that `RateLimitMiddleware` has not already applied to this request (all of
them when the middleware is not installed, or when it left a scoped view's request to
the throttle: then both kinds are decided in one call). A policy charges a request once
either way.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.throttling import BaseThrottle

from ratelimits.pipeline import evaluation, settling
from ratelimits.pipeline.release import release_when_finished
from ratelimits.pipeline.state import state_for
from ratelimits.pipeline.verdict import UNAVAILABLE


class RateLimitStoreUnavailable(APIException):
    """A policy with on_error="deny" could not be decided: the store is unreachable."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Service temporarily unavailable. Retry shortly."
    default_code = "ratelimit_store_unavailable"

    def __init__(self, wait: int) -> None:
        super().__init__()
        self.wait = wait


class PolicyThrottle(BaseThrottle):
    """A DRF throttle driven by the admin-managed policies."""

    #: Tells RateLimitMiddleware that this throttle decides a request's policies (see
    #: `evaluation.throttle_decides`), without the middleware importing DRF.
    decides_policies = True

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        scope = getattr(view, "throttle_scope", None) or ""
        scopes = frozenset({"", scope})
        state = state_for(request)
        state.throttled = True
        verdict = evaluation.evaluate(request, scopes=scopes, sender=type(self), state=state)
        if verdict is None:
            return True
        if state.holds and not state.middleware:
            release_when_finished(request)
        if state.pending and not state.middleware:
            _settle_when_finalized(view, state)
        if verdict.allowed and verdict.delay > 0:
            verdict = evaluation.wait_turn(verdict)
        if verdict.allowed:
            return True
        state.refuse(verdict)  # DRF answers it: the headers are the refusing policies'
        if verdict.status == UNAVAILABLE:
            raise RateLimitStoreUnavailable(verdict.retry_after)
        self._wait = verdict.retry_after
        return False

    def wait(self) -> int | None:
        """Seconds until the refused request could pass (DRF's Retry-After), at least 1."""
        return self._wait


def _settle_when_finalized(view: Any, state: Any) -> None:
    """Without the middleware, the view's `finalize_response` is where a DRF response
    is last seen whole: a policy charging only some responses (`charge_on`) charges it
    there (`settling`). The view instance serves this one request."""
    original = view.finalize_response
    if getattr(original, "ratelimits_settles", False):
        return

    def finalize_response(request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = original(request, response, *args, **kwargs)
        settling.settle(request, state, response)
        return response

    finalize_response.ratelimits_settles = True  # type: ignore[attr-defined]
    view.finalize_response = finalize_response
