"""The respond phase: the responses for refused requests, 429 (limited) and 503 (store
unavailable), and the rate-limit headers of every response.

The headers are the IETF draft's fields and the legacy X-RateLimit-* trio. IETF style
follows draft-ietf-httpapi-ratelimit-headers-11:
``RateLimit-Policy: "name";q=100;w=60`` and ``RateLimit: "name";r=42;t=17``. `q` per `w`
is the policy's limit per period for every algorithm (a concurrency limit has no window);
`r` is the quota this client has available now (for a bucket, up to its burst) and `t`
the end of its effective window: the seconds until its state is fully reset, or, on a
refusal, until a retry can pass, which is also the refusal's `Retry-After` (never
earlier than `t`, as the draft asks). A body in JSON is the draft's problem type
(RFC 9457): `quota-exceeded` for a 429, `temporary-reduced-capacity` for an adaptive
limit's 503, each naming its `violated-policies`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.pipeline.state import RequestState, http_request, state_for
from ratelimits.pipeline.verdict import LIMITED, PolicyOutcome, Verdict

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


#: The problem types of the IETF draft (its IANA registrations), by the status they explain.
PROBLEM_TYPES = "https://iana.org/assignments/http-problem-types#"
QUOTA_EXCEEDED = PROBLEM_TYPES + "quota-exceeded"
REDUCED_CAPACITY = PROBLEM_TYPES + "temporary-reduced-capacity"


def problem(rejection: Rejection, detail: str) -> dict[str, Any]:
    """The refusal as a problem details object (RFC 9457) of the draft's types: a 429 is
    `quota-exceeded`; a 503 an adaptive limit gave (policies refused it) is
    `temporary-reduced-capacity`; a 503 no policy's count gave (the store was out of
    reach, or the client could not be identified) has no type of the draft's."""
    body: dict[str, Any] = {}
    if rejection.status == LIMITED:
        body["type"], title = QUOTA_EXCEEDED, "Too Many Requests"
    else:
        title = "Service Unavailable"
        if rejection.policies:
            body["type"] = REDUCED_CAPACITY
    body.update(title=title, status=rejection.status, detail=detail,
                retry_after=rejection.retry_after)
    if "type" in body:
        body["violated-policies"] = list(rejection.policies)
    return body


def reject(request: Any, rejection: Rejection) -> HttpResponse:
    """The default view for refused requests: a short plain-text body, or a problem
    details object (`problem`) when the client's Accept asks for JSON."""
    if rejection.status == LIMITED:
        detail = f"Too many requests. Retry in {rejection.retry_after} seconds."
    else:
        detail = "Service temporarily unavailable. Retry shortly."
    if _wants_json(request):
        return JsonResponse(problem(rejection, detail), status=rejection.status,
                            content_type="application/problem+json")
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
    else than a response (a decorated helper) gets none. The headers are those of the
    closest enforced limit (`closest`), in the `HEADERS` style; what a view set is never
    overwritten."""
    if not state.outcomes or not isinstance(response, HttpResponseBase):
        return response
    style = get_config()["HEADERS"]
    if style == "none":
        return response
    chosen = closest(state.outcomes if state.refused_by is None else state.refused_by)
    if chosen is not None:
        headers = response.headers
        for name, value in rate_headers(chosen, style).items():
            if name not in headers:
                headers[name] = value
    return response


# -- the rate-limit headers ---------------------------------------------------------


def closest(outcomes: Iterable[PolicyOutcome]) -> PolicyOutcome | None:
    """The enforced outcome a client should watch: the rejection with the longest wait,
    else the fewest remaining (then the longest reset); the first of equals."""
    chosen: PolicyOutcome | None = None
    best: Any = None  # chosen's result
    for outcome in outcomes:
        result = outcome.result
        if result is None or result.limit.shadow:  # undecided, or only watched
            continue
        if best is not None:
            if result.allowed:  # replaces only an admitted one with more left
                if not best.allowed or (result.remaining, -result.reset_after) >= (
                        best.remaining, -best.reset_after):
                    continue
            elif not best.allowed and result.retry_after <= best.retry_after:
                continue
        chosen, best = outcome, result
    return chosen


def _sf_string(value: str) -> str:
    """A structured-field String (RFC 8941): printable ASCII, quotes and backslashes escaped."""
    cleaned = "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in value)
    return '"' + cleaned.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _seconds(value: float) -> int:
    return max(0, math.ceil(value))


@lru_cache(maxsize=1_024)  # a policy's field changes only with its figures
def _policy_field(name: str, quota: int, period: float, holds: bool) -> tuple[str, str]:
    """The policy's name as a structured-field string, and its RateLimit-Policy value."""
    text = _sf_string(name)
    policy = f"{text};q={quota}"
    if not holds:  # slots are held, not spent per window
        policy += f";w={_seconds(period)}"
    return text, policy


def rate_headers(outcome: PolicyOutcome, style: str) -> dict[str, str]:
    """The headers describing one policy's state for this client, in `style`."""
    result = outcome.result
    if result is None:  # no engine decided (the store was out of reach): nothing to say
        return {}
    limit = result.limit
    # The draft's quota: `q` units per `w` seconds. For the buckets and gcra that is the
    # sustained rate (limit per period), not the burst a client may spend at once.
    quota = limit.limit
    remaining = int(result.remaining)
    if remaining < 0:
        remaining = 0
    reset = math.ceil(result.reset_after if result.allowed else result.retry_after)
    if reset < 0:
        reset = 0
    headers: dict[str, str] = {}
    if style in ("ietf", "both"):
        name, policy = _policy_field(outcome.policy.name, quota, limit.period,
                                     outcome.policy.holds_slots)
        headers["RateLimit-Policy"] = policy
        headers["RateLimit"] = f"{name};r={remaining};t={reset}"
    if style in ("legacy", "both"):
        headers["X-RateLimit-Limit"] = str(quota)
        headers["X-RateLimit-Remaining"] = str(remaining)
        headers["X-RateLimit-Reset"] = str(reset)
    return headers
