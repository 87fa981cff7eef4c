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
    DELAY,
    REMAINING,
    RESET_AFTER,
    RETRY_AFTER,
    STATE,
    Check,
    CheckFn,
    CommitFn,
    Store,
    warm_check,
    warm_commit,
)
from ratelimits.engine.calendar import window
from ratelimits.engine.constants import US
from ratelimits.engine.expiring import ExpiringStore
from ratelimits.engine.keynames import lock_key, new_token, to_us
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import CHARGE, REFUND, Decision, Limit

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
    #: `Limit.stage` and `Limit.lockout` (µs; 0: none).
    stage: int = CHARGE
    lockout: float = 0.0
    algorithm: str = ""


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
    one refused (a limit being refunded is not checked: its reservation is taken back,
    whatever the call's other limits say). Returns whether the request was admitted,
    the checks, each check's `allowed` (1 or 0), and the token drawn ('' when none was
    needed). The caller holds the engine's lock."""
    if len(prepared) == 1:  # the usual call: all or nothing is the one limit's answer
        p = prepared[0]
        if p.stage != REFUND and not p.lockout:
            r = p.check(store, p.key, now, p.limit, p.period_us, p.burst, p.cost)
            ok = r[ALLOWED]
            if not ok:
                return p.shadow, [r], [ok], ""
            token = new_token() if p.needs_token else ""
            p.commit(store, p.key, now, p.period_us, p.cost, r, token)
            return True, [r], [ok], token
    return _charge_all(store, prepared, now)


def _charge_all(
    store: ExpiringStore, prepared: Sequence[Prepared], now: float
) -> tuple[bool, list[Check], list[int], str]:
    """`charge()` of several limits (or of one with a lockout, or being refunded)."""
    # Unpacked rather than read by name: this loop runs millions of times in a replay.
    checks = [NOT_CHECKED if stage == REFUND else check(store, key, now, L, P, B, c)
              for key, check, _, L, P, B, c, _, _, stage, *_ in prepared]
    for i, p in enumerate(prepared):
        if p.lockout and p.stage != REFUND:
            checks[i] = locked(store, p.key, now, checks[i])
    allowed = [r[ALLOWED] for r in checks]
    if 0 in allowed:
        refused = [i for i, (p, ok) in enumerate(zip(prepared, allowed, strict=True))
                   if not ok and not p.shadow]
        if refused:
            for i in refused:
                if prepared[i].lockout:
                    checks[i] = lock(store, prepared[i], now, checks[i])
            return False, checks, allowed, ""
    token = ""
    for p, r in zip(prepared, checks):  # noqa: B905
        if p.stage == REFUND:
            unreserve(store, p, now)
        elif r[ALLOWED]:
            if p.needs_token and not token:
                token = new_token()
            p.commit(store, p.key, now, p.period_us, p.cost, r, token)
    return True, checks, allowed, token


#: A limit being refunded is not checked: it admits, and refuses nothing.
NOT_CHECKED: Check = (1, 0.0, 0.0, 0.0, 0, None)


def unreserve(store: ExpiringStore, p: Prepared, now: float) -> None:
    """Take back the units a reservation of `p` charged at `now` (the reservation's own
    time), as lua/check_all.lua's `unreserve`: from the window it counted in, from the
    log, from a bucket not refilled since, from a GCRA arrival time."""
    c = p.cost
    if p.algorithm in ("fixed_window", "sliding_window"):
        # a check of nothing names the window of `now` (a calendar's too)
        r = p.check(store, p.key, now, p.limit, p.period_us, p.burst, 0.0)
        entry = store.entry(r[STATE][0], now) if r[ALLOWED] else None
        if entry is not None and entry[0] >= c:
            entry[0] -= c
    elif p.algorithm == "sliding_log":
        REGISTRY["sliding_log"].refund(store, p.key, now, p.limit, p.period_us, p.burst, c,
                                       NOT_CHECKED, "")
    elif p.algorithm == "token_bucket":
        entry = store.entry(p.key, now)
        if entry is not None and entry[0][1] <= now:  # not refilled since
            tokens, ts = entry[0]
            entry[0] = (min(p.burst, tokens + c), ts)
    elif p.algorithm == "gcra":
        entry = store.entry(p.key, now)
        if entry is not None:
            tat = entry[0] - c * p.period_us / p.limit
            if tat <= now:
                store.delete(p.key)
            else:
                entry[0] = tat


#: A check's state when a lockout refused it (no lockout starts again).
LOCKED = "locked"


def locked(store: ExpiringStore, key: str, now: float, r: Check) -> Check:
    """`r`, or a refusal while a lockout holds the client of `key` (as lua/check_all.lua's
    `locked`)."""
    until = store.get(lock_key(key), now)
    if until is not None and until > now:
        left = until - now
        return (0, 0.0, max(r[RESET_AFTER], left), left, 0, LOCKED)
    return r


def lock(store: ExpiringStore, p: Prepared, now: float, r: Check) -> Check:
    """`p` refused the call (`r`): its lockout starts, unless one already holds it."""
    if r[STATE] == LOCKED:
        return r
    store.set(lock_key(p.key), now + p.lockout, now, p.lockout)
    return (r[ALLOWED], r[REMAINING], max(r[RESET_AFTER], p.lockout),
            max(r[RETRY_AFTER], p.lockout), r[DELAY], r[STATE])


def waiting_and_warm(check: CheckFn, commit: CommitFn, limit: Limit
                     ) -> tuple[CheckFn, CommitFn]:
    """An algorithm's functions with the limit's `max_wait`, `warmup` and `calendar`
    bound in."""
    if limit.calendar:
        check = functools.partial(calendar_check, base=check, kind=limit.calendar,
                                  zone=limit.zone)
    mw = float(to_us(limit.max_wait))
    if mw:
        check = functools.partial(check, mw=mw)  # type: ignore[call-arg]
    if limit.warmup:
        check = functools.partial(warm_check, base=check, W=float(to_us(limit.warmup)),
                                  mw=mw)
        commit = functools.partial(warm_commit, base=commit)
    return check, commit


def calendar_check(s: Store, key: str, now: float, L: float, P: float, B: float, c: float,
                   base: CheckFn, kind: str, zone: str) -> Check:
    """A fixed window's check in the calendar window holding `now` (µs)."""
    start, end = window(kind, zone, now / US)
    return base(s, key, now, L, P, B, c, cal=(start * US, end * US))  # type: ignore[call-arg]


def refund(store: ExpiringStore, algorithm: str, p: Prepared, now: float, r: Check,
           token: str) -> None:
    """Take back what `charge()` charged `p` (of `algorithm`) at `now` (µs), with its
    check `r` and `token`."""
    REGISTRY[algorithm].refund(store, p.key, now, p.limit, p.period_us, p.burst, p.cost, r,
                               token)
