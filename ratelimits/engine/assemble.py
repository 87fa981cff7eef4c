"""Turn the flat per-limit figures both backends produce into a `Decision`."""

from __future__ import annotations

from collections.abc import Sequence

from ratelimits.engine.keys import US
from ratelimits.engine.types import Decision, Limit, Result

#: Figures per limit in a backend's raw answer.
FIELDS = 6


def assemble(
    limits: Sequence[Limit],
    raw: Sequence[int | float],
    *,
    admitted: bool,
    version: int | None,
    token: str | None,
) -> Decision:
    """`raw` holds, per limit: allowed, remaining, reset_after, retry_after, delay (µs), charged."""
    results = []
    retry_after = 0.0
    delay = 0.0
    holds = False
    for i, limit in enumerate(limits):
        o = i * FIELDS
        allowed = raw[o] == 1
        result = Result(
            limit=limit,
            allowed=allowed,
            remaining=max(0, int(raw[o + 1])),
            reset_after=raw[o + 2] / US,
            retry_after=raw[o + 3] / US,
            delay=raw[o + 4] / US,
        )
        results.append(result)
        if not limit.shadow:
            if not allowed:
                retry_after = max(retry_after, result.retry_after)
            elif admitted:
                delay = max(delay, result.delay)
        if raw[o + 5] == 1 and limit.algorithm == "concurrency":
            holds = True
    return Decision(
        allowed=admitted,
        results=tuple(results),
        retry_after=retry_after if not admitted else 0.0,
        delay=delay,
        version=version,
        token=token if holds else None,
    )
