"""Charging in process, as the batch script charges in Redis: check every limit, charge
all or none (`charge()`), and take a charge back (`refund()`, each algorithm's as its Lua
`--[[refund]]` body does). `MemoryEngine` and the replay run them.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ratelimits.engine.algorithms import (
    ALLOWED,
    STATE,
    Check,
    CheckFn,
    CommitFn,
    member,
    warm_check,
    warm_commit,
)
from ratelimits.engine.expiring import ExpiringStore
from ratelimits.engine.keynames import new_token, to_us
from ratelimits.engine.registry import ALGORITHMS
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


def _entry(store: ExpiringStore, key: str, now: float) -> list[Any] | None:
    """A key's live entry ([value, expiry, slot]), to change its value and keep its TTL."""
    entry = store.data.get(key)
    return entry if entry is not None and now < entry[1] else None


def _refund_count(store: ExpiringStore, p: Prepared, now: float, r: Check, token: str) -> None:
    # the window key the charge counted in: a plain sum, exact whatever came since
    entry = _entry(store, r[STATE][0], now)
    if entry is not None:
        entry[0] -= p.cost


def _refund_log(store: ExpiringStore, p: Prepared, now: float, r: Check, token: str) -> None:
    entry = _entry(store, p.key, now)
    if entry is not None:  # the charge wrote `cost` entries at `now`
        log: list[float] = entry[0]
        at = bisect.bisect_left(log, now)
        end = min(bisect.bisect_right(log, now), at + int(p.cost))
        del log[at:end]


def _refund_tokens(store: ExpiringStore, p: Prepared, now: float, r: Check, token: str) -> None:
    entry = _entry(store, p.key, now)
    if entry is not None and entry[0] is r[STATE]:  # still what the charge wrote
        tokens, ts = r[STATE]
        entry[0] = (min(p.burst, tokens + p.cost), ts)


def _refund_tat(store: ExpiringStore, p: Prepared, now: float, r: Check, token: str) -> None:
    entry = _entry(store, p.key, now)
    if entry is not None and entry[0] is r[STATE]:  # still what the charge wrote
        tat = r[STATE] - p.cost * p.period_us / p.limit
        if tat <= now:
            store.delete(p.key)
        else:
            entry[0] = tat


def _refund_slots(store: ExpiringStore, p: Prepared, now: float, r: Check, token: str) -> None:
    entry = _entry(store, p.key, now)
    if entry is not None:
        for unit in range(1, int(p.cost) + 1):
            entry[0].pop(member(token, unit), None)


_REFUNDS: dict[str, Callable[[ExpiringStore, Prepared, float, Check, str], None]] = {
    "fixed_window": _refund_count,
    "sliding_window": _refund_count,
    "sliding_log": _refund_log,
    "token_bucket": _refund_tokens,
    "leaky_bucket": _refund_tat,
    "gcra": _refund_tat,
    "concurrency": _refund_slots,
}
if set(_REFUNDS) != set(ALGORITHMS):  # a new algorithm needs its refund here too
    raise RuntimeError(f"no in-process refund for {sorted(set(ALGORITHMS) - set(_REFUNDS))}")


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
    _REFUNDS[algorithm](store, p, now, r, token)
