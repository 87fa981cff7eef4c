"""Turn the flat per-limit figures both backends produce into a `Decision`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimits.engine.keys import US
from ratelimits.engine.types import Decision, Limit, Outcome, Result

#: Figures per limit in a backend's raw answer.
FIELDS = 6

OUTCOMES: dict[str, Outcome] = {o.value: o for o in Outcome}


def assemble(
    limits: Sequence[Limit],
    raw: Sequence[Any],
    *,
    admitted: bool,
    version: int | None,
    token: str | None,
) -> Decision:
    """`raw` holds, per limit: allowed, remaining, reset_after, retry_after, delay (µs), and
    the outcome's counter field (a, r, w or o)."""
    results = []
    retry_us = 0
    delay = 0.0
    holds = False
    for i, limit in enumerate(limits):
        o = i * FIELDS
        allowed = raw[o] == 1
        field = raw[o + 5]
        outcome = OUTCOMES[field.decode() if isinstance(field, bytes) else field]
        result = Result(
            limit=limit,
            allowed=allowed,
            remaining=max(0, int(raw[o + 1])),
            reset_after=raw[o + 2] / US,
            retry_after=raw[o + 3] / US,
            delay=raw[o + 4] / US,
            outcome=outcome,
        )
        results.append(result)
        if not limit.shadow:
            if not allowed:
                retry_us = max(retry_us, int(raw[o + 3]))
            elif admitted:
                delay = max(delay, result.delay)
        if outcome is Outcome.ADMITTED and limit.algorithm == "concurrency":
            holds = True
    return Decision(
        allowed=admitted,
        results=tuple(results),
        retry_after=0 if admitted else max(1, -(-retry_us // US)),
        delay=delay,
        version=version,
        token=token if holds else None,
    )
