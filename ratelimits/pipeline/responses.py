"""The responses for refused requests: 429 (limited) and 503 (store unavailable)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.pipeline import headers
from ratelimits.pipeline.state import RequestState, http_request, state_for
from ratelimits.pipeline.verdict import LIMITED, Verdict

logger = logging.getLogger("ratelimits")


@dataclass(frozen=True)
class Rejection:
    """What a REJECT_VIEW receives besides the request."""

    status: int  # 429 or 503
    retry_after: int  # whole seconds, as in the Retry-After header
    policies: tuple[str, ...]  # names of the enforced policies that refused
    verdict: Verdict


def _wants_json(request: Any) -> bool:
    # META, not request.headers: that would build a mapping of every header per refusal
    accept = request.META.get("HTTP_ACCEPT", "")
    return isinstance(accept, str) and "json" in accept


def reject(request: Any, rejection: Rejection) -> HttpResponse:
    """The default view for refused requests: a short JSON or plain-text body."""
    if rejection.status == LIMITED:
        detail = f"Too many requests. Retry in {rejection.retry_after} seconds."
    else:
        detail = "Service temporarily unavailable. Retry shortly."
    if _wants_json(request):
        return JsonResponse(
            {"detail": detail, "retry_after": rejection.retry_after}, status=rejection.status
        )
    return HttpResponse(detail + "\n", status=rejection.status, content_type="text/plain")


def rejection_response(request: Any, verdict: Verdict) -> HttpResponse:
    """Render the configured REJECT_VIEW (falling back to `reject` if it fails)."""
    refused = verdict.rejected_by
    rejection = Rejection(
        status=verdict.status,
        retry_after=verdict.retry_after,
        policies=tuple([o.policy.name for o in refused]),
        verdict=verdict,
    )
    base = http_request(request)
    state_for(base).refused_by = refused  # the response's headers are theirs alone
    view_path = get_config()["REJECT_VIEW"]
    response = None
    if view_path:
        try:
            response = import_string(view_path)(base, rejection)
        except runtime.FUNCTION_FAILED:
            logger.exception("ratelimits: REJECT_VIEW %s failed; using the default", view_path)
    if response is None:
        response = reject(base, rejection)
    response["Retry-After"] = str(rejection.retry_after)
    return response


def decorate(state: RequestState, response: Any) -> Any:
    """Add the rate-limit headers of every decision taken for this request, or of the
    policies that refused it (`RequestState.refused_by`); a view that returns something
    else than a response (a decorated helper) gets none."""
    if state.outcomes and isinstance(response, HttpResponseBase):
        outcomes = state.outcomes if state.refused_by is None else state.refused_by
        headers.apply(response, outcomes, get_config()["HEADERS"])
    return response
