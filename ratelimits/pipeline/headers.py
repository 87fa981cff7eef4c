"""Rate-limit response headers: the IETF draft fields and the legacy X-RateLimit-* trio.

IETF style follows draft-ietf-httpapi-ratelimit-headers-10:
``RateLimit-Policy: "name";q=100;w=60`` and ``RateLimit: "name";r=42;t=17``. `q` per `w`
is the policy's limit per period for every algorithm (a concurrency limit has no window);
`r` is what this client may spend now (for a bucket, up to its burst) and `t` the seconds
until its state is fully reset, or until a refused request could pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from ratelimits.pipeline.verdict import PolicyOutcome


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
    remaining = max(0, int(result.remaining))
    reset = _seconds(result.reset_after if result.allowed else result.retry_after)
    headers: dict[str, str] = {}
    if style in ("ietf", "both"):
        name, policy = _policy_field(outcome.policy.name, quota, limit.period,
                                     limit.spec.holds_slots)
        headers["RateLimit-Policy"] = policy
        headers["RateLimit"] = f"{name};r={remaining};t={reset}"
    if style in ("legacy", "both"):
        headers["X-RateLimit-Limit"] = str(quota)
        headers["X-RateLimit-Remaining"] = str(remaining)
        headers["X-RateLimit-Reset"] = str(reset)
    return headers


def apply(response: Any, outcomes: Iterable[PolicyOutcome], style: str) -> None:
    """Add the headers of the closest enforced limit; never overwrite what a view set."""
    if style == "none":
        return
    chosen = closest(outcomes)
    if chosen is None:
        return
    headers = response.headers
    for name, value in rate_headers(chosen, style).items():
        if name not in headers:
            headers[name] = value
