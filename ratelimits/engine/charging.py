"""Charging in process, as the batch script charges in Redis: check every limit, charge
all or none (`charge()`), and take a charge back (`refund()`, each algorithm's as its Lua
`--[[refund]]` body does). `MemoryEngine` and the replay run them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from ratelimits.engine.algorithms import (
    ALLOWED,
    Check,
    CheckFn,
    CommitFn,
    warm_check,
    warm_commit,
)
from ratelimits.engine.expiring import ExpiringStore
from ratelimits.engine.keynames import new_token, to_us
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Decision, Limit

__all__ = ["Prepared", "Receipt", "charge", "refund", "waiting_and_warm"]


class Prepared(NamedTuple):
    """One limit's key and figures, computed once by `MemoryEngine.prepare()`."""

    key: str
    check: CheckFn
    commit: CommitFn
    limit: float
    period_us: float
    burst: float
    cost: float
    shadow: bool
    #: Its commit names what it holds after the request's token (the in-process sliding
    #: log stores times, not named members: only held slots need a name here).
    needs_token: bool


class Receipt(NamedTuple):
    """What one `MemoryEngine.take()` charged, for `MemoryEngine.refund()`."""

    decision: Decision
    prepared: tuple[Prepared, ...]
    checks: tuple[Check, ...]
    now: float  # µs
    token: str


def charge(
    store: ExpiringStore, prepared: Sequence[Prepared], now: float
) -> tuple[bool, list[Check], list[int], str]:
    """Check every limit, then charge every limit that admitted, or none if an enforced
    one refused. Returns whether the request was admitted, the checks, each check's
    `allowed` (1 or 0), and the token drawn ('' when none was needed). The caller holds
    the engine's lock."""
    # Unpacked rather than read by name: this loop runs millions of times in a replay.
    checks = [check(store, key, now, L, P, B, c) for key, check, _, L, P, B, c, _, _ in prepared]
    allowed = [r[ALLOWED] for r in checks]
    if 0 in allowed:
        for p, ok in zip(prepared, allowed, strict=True):
            if not ok and not p.shadow:
                return False, checks, allowed, ""
    token = ""
    for (key, _, commit, _, P, _, c, _, needs_token), r in zip(prepared, checks):  # noqa: B905
        if r[ALLOWED]:
            if needs_token and not token:
                token = new_token()
            commit(store, key, now, P, c, r, token)
    return True, checks, allowed, token


def waiting_and_warm(check: CheckFn, commit: CommitFn, limit: Limit
                     ) -> tuple[CheckFn, CommitFn]:
    """An algorithm's functions with the limit's `max_wait` and `warmup` bound in."""
    mw = float(to_us(limit.max_wait))
    if mw:
        check = functools.partial(check, mw=mw)  # type: ignore[call-arg]
    if limit.warmup:
        check = functools.partial(warm_check, base=check, W=float(to_us(limit.warmup)),
                                  mw=mw)
        commit = functools.partial(warm_commit, base=commit)
    return check, commit


def refund(store: ExpiringStore, algorithm: str, p: Prepared, now: float, r: Check,
           token: str) -> None:
    """Take back what `charge()` charged `p` (of `algorithm`) at `now` (µs), with its
    check `r` and `token`."""
    REGISTRY[algorithm].refund(store, p.key, now, p.limit, p.period_us, p.burst, p.cost, r,
                               token)
