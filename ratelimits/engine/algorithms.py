"""The algorithms in Python: each one's `check` and `commit`, step for step as its Lua twin
in `lua/<name>.lua`, in IEEE doubles, so both backends reach identical decisions for the
same requests at the same explicit times (the conformance and property tests hold them
to it).

`check(store, key, now, L, P, B, c)` reads and returns a `Check`; it never writes
(pruning expired entries aside). `commit(store, key, now, P, c, check, token)` writes,
only when the whole request is admitted and this limit admitted it; `refund(...)` takes
that charge back when something outside the engine refused the request. Times are
microseconds; L, B and c are units.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any, Final, Protocol

from ratelimits.engine.constants import CONCURRENCY_RETRY_US, EPS, FLOOR_EPS, TOKEN_EPS

#: What one algorithm found for one limit, before anything is charged: a plain tuple,
#: read by the slot names below (`r[STATE]`). `allowed` is 1 or 0 (as the Lua reply has
#: it); times are µs; `state` is the algorithm's own, handed to its `commit`. (A
#: NamedTuple reads the same but costs ~0.1 µs more to build per check, some 5% of a
#: log replay, measured with bench/replay.py.)
Check = tuple[int, float, float, float, float, Any]
ALLOWED: Final = 0
REMAINING: Final = 1
RESET_AFTER: Final = 2
RETRY_AFTER: Final = 3
DELAY: Final = 4
STATE: Final = 5


class Store(Protocol):
    """The store the algorithms read and write (see `expiring.ExpiringStore`)."""

    def get(self, key: str, now: float) -> Any: ...
    def set(self, key: str, value: Any, now: float, ttl_us: float) -> None: ...
    def entry(self, key: str, now: float) -> list[Any] | None: ...
    def delete(self, key: str) -> None: ...


CheckFn = Callable[[Store, str, float, float, float, float, float], Check]
CommitFn = Callable[[Store, str, float, float, float, Check, str], None]
#: `refund(store, key, now, L, P, B, c, check, token)`: take back what `commit` charged
#: at `now` with `check` and `token`, as the Lua `--[[refund]]` body does.
RefundFn = Callable[[Store, str, float, float, float, float, float, Check, str], None]


def _floor0(x: float, _eps: float = FLOOR_EPS, _floor: Callable[[float], int] = math.floor
            ) -> float:
    # counts derived from float time (T = P/L) land a hair below whole numbers (the
    # defaults bind the constant and the function: this runs on every check)
    return float(max(0, _floor(x + _eps)))


# -- fixed_window ------------------------------------------------------------------------


def fixed_window_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                       c: float, cal: tuple[int, int] | None = None) -> Check:
    # cal: a calendar window's start and end (µs), keyed by its start in seconds
    if cal is None:
        win = math.floor(now / P)
        reset = (win + 1) * P - now
    else:
        win = cal[0] // 1_000_000
        reset = cal[1] - now
    k = f"{key}:{win}"
    n = float(s.get(k, now) or 0)
    if n + c <= L:
        return (1, L - n - c, reset, 0, 0, (k, n))
    return (0, _floor0(L - n), reset, reset, 0, None)


def fixed_window_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                        token: str) -> None:
    # the count the check read is still current: the engine's lock is held throughout
    k, n = r[STATE]
    s.set(k, n + c, now, r[RESET_AFTER])


# -- sliding_window ----------------------------------------------------------------------


def sliding_window_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                         c: float) -> Check:
    win = math.floor(now / P)
    elapsed = now - win * P
    k = f"{key}:{win}"
    cur = float(s.get(k, now) or 0)
    prev = float(s.get(f"{key}:{win - 1}", now) or 0)
    est = prev * (P - elapsed) / P + cur
    if est + c <= L + TOKEN_EPS:
        return (1, _floor0(L - est - c), 2 * P - elapsed, 0, 0, (k, cur, elapsed))
    if cur + c <= L:
        retry = math.ceil(P - (L - cur - c) * P / prev - elapsed)
    else:
        retry = math.ceil(P - elapsed + P - (L - c) * P / cur)
    retry = max(retry, 1)
    reset = 2 * P - elapsed if cur > 0 else P - elapsed
    return (0, _floor0(L - est), reset, retry, 0, None)


def sliding_window_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                          token: str) -> None:
    k, cur, elapsed = r[STATE]
    s.set(k, cur + c, now, 2 * P - elapsed)


# -- sliding_log -------------------------------------------------------------------------


def sliding_log_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                      c: float) -> Check:
    log: list[float] | None = s.get(key, now)
    if log:
        del log[: bisect.bisect_right(log, now - P)]
    n = len(log) if log else 0
    if n + c <= L:
        return (1, L - n - c, P, 0, 0, None)
    assert log  # n + c > L >= c, so n > 0
    oldest = log[int(n + c - L - 1)]
    return (0, _floor0(L - n), log[-1] + P - now, oldest + P - now, 0, None)


def sliding_log_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                       token: str) -> None:
    log: list[float] = s.get(key, now) or []
    at = bisect.bisect_right(log, now)
    log[at:at] = [now] * int(c)
    s.set(key, log, now, P)


# -- token_bucket ------------------------------------------------------------------------


def token_bucket_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                       c: float, mw: float = 0.0) -> Check:
    state = s.get(key, now)
    tokens, ts = B, now
    if state is not None:
        tokens, ts = state
        if now > ts:
            tokens = min(B, tokens + (now - ts) * L / P)
            ts = now
    if tokens + TOKEN_EPS + mw * L / P >= c:
        # with a max_wait (mw, µs) the tokens may go below zero: a turn reserved ahead
        after = tokens - c
        delay = 0 if tokens + TOKEN_EPS >= c else math.ceil((c - tokens) * P / L)
        return (1, _floor0(after), math.ceil((B - after) * P / L), 0, delay,
                            (after, ts))
    return (0, _floor0(tokens), math.ceil((B - tokens) * P / L),
                        math.ceil((c - tokens) * P / L - mw), 0, None)


def state_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                 token: str) -> None:
    """token_bucket, leaky_bucket, gcra: store the state, kept until the limit resets."""
    s.set(key, r[STATE], now, r[RESET_AFTER])


# -- leaky_bucket ------------------------------------------------------------------------


def leaky_bucket_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                       c: float, mw: float = 0.0) -> Check:
    T = P / L
    tat = s.get(key, now)
    tat = now if tat is None or tat < now else tat
    wait = tat - now
    if wait <= B * T + mw + EPS:  # a max_wait (mw, µs) lengthens the queue by that time
        after = tat + c * T
        return (1, _floor0((B * T - (after - now)) / T + 1),
                            math.ceil(after - now), 0, math.ceil(wait), after)
    return (0, 0, math.ceil(wait), math.ceil(wait - B * T - mw), 0, None)


# -- gcra --------------------------------------------------------------------------------


def gcra_check(s: Store, key: str, now: float, L: float, P: float, B: float,
               c: float, mw: float = 0.0) -> Check:
    T = P / L
    tat = s.get(key, now)
    tat = now if tat is None or tat < now else tat
    new = tat + c * T
    allow_at = new - B * T
    if now + EPS + mw >= allow_at:  # a max_wait (mw, µs): a turn reserved ahead
        delay = 0 if now + EPS >= allow_at else math.ceil(allow_at - now)
        return (1, _floor0((now - allow_at) / T), math.ceil(new - now), 0, delay, new)
    return (0, _floor0((B * T - (tat - now)) / T), math.ceil(tat - now),
                        math.ceil(allow_at - now - mw), 0, None)


# -- warm-up (token_bucket, gcra) ----------------------------------------------------------


def warm_check(s: Store, key: str, now: float, L: float, P: float, B: float, c: float,
               base: CheckFn, W: float, mw: float) -> Check:
    """`base`'s check behind the warm-up gate (see `lua/prelude.lua` `warm_check`, its
    twin): a cold client is paced, without burst, at an interval that falls from 3T to T
    as it is used for W µs; idleness cools it again, fully after C = max(B, 1)T."""
    r = base(s, key, now, L, P, B, c)
    T = P / L
    C = max(B, 1.0) * T
    state = s.get(f"{key}:w", now)
    n, w = (now, W) if state is None else state
    if n < now:
        w = min(W, w + (now - n) * W / C)
        n = now
    if w > 0:
        gap = T * (1 + 2 * w / W)
        if now + EPS + mw < n:  # paced: the gate refuses
            horizon = math.ceil(n - now + (W - w) * C / W)
            retry = math.ceil(n - now - mw)
            return (0, 0, max(r[RESET_AFTER], horizon), max(r[RETRY_AFTER], retry), 0, None)
        delay = math.ceil(n - now)
        n2 = n + c * gap
        w2 = max(0.0, w - c * gap)
    else:
        delay = 0
        n2 = n + c * T
        w2 = 0.0
    horizon = math.ceil(n2 - now + (W - w2) * C / W)
    if not r[ALLOWED]:
        return (0, r[REMAINING], max(r[RESET_AFTER], horizon), r[RETRY_AFTER], 0, None)
    return (1, 0 if w2 > 0 else r[REMAINING], max(r[RESET_AFTER], horizon), 0,
            max(r[DELAY], delay), (r[STATE], n2, w2))


def warm_commit(s: Store, key: str, now: float, P: float, c: float, r: Check, token: str,
                base: CommitFn) -> None:
    base_state, n2, w2 = r[STATE]
    base(s, key, now, P, c, (r[0], r[1], r[2], r[3], r[4], base_state), token)
    s.set(f"{key}:w", (n2, w2), now, r[RESET_AFTER])


# -- concurrency -------------------------------------------------------------------------


def concurrency_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                      c: float) -> Check:
    held: dict[str, float] | None = s.get(key, now)
    if held:
        for member in [m for m, expiry in held.items() if expiry <= now]:
            del held[member]
    n = len(held) if held else 0
    if n + c <= L:
        return (1, L - n - c, P, 0, 0, None)
    return (0, _floor0(L - n), P, min(P, float(CONCURRENCY_RETRY_US)), 0, None)


def concurrency_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                       token: str) -> None:
    held: dict[str, float] = s.get(key, now) or {}
    for i in range(1, int(c) + 1):
        held[member(token, i)] = now + P
    s.set(key, held, now, P)


# -- adaptive ----------------------------------------------------------------------------
#
# Learnt in each process (`adaptive.AdaptiveEngine`), never checked against stored state:
# an engine that is handed one says so instead of deciding it.


def learned_check(s: Store, key: str, now: float, L: float, P: float, B: float,
                  c: float) -> Check:
    raise ValueError(LEARNED_ONLY)


def learned_commit(s: Store, key: str, now: float, P: float, c: float, r: Check,
                   token: str) -> None:
    raise ValueError(LEARNED_ONLY)


def learned_refund(s: Store, key: str, now: float, L: float, P: float, B: float, c: float,
                   r: Check, token: str) -> None:
    raise ValueError(LEARNED_ONLY)


LEARNED_ONLY = ("an adaptive limit is learnt in each process and decided by "
                "ratelimits.engine.adaptive.AdaptiveEngine, not by a store engine")


def member(token: str, unit: int) -> str:
    """The name of one unit a request holds (as the Lua `add_members` writes it)."""
    return f"{token}:{unit}"


# -- refunds: each charge taken back, as the Lua `--[[refund]]` bodies do ------------------


def count_refund(s: Store, key: str, now: float, L: float, P: float, B: float, c: float,
                 r: Check, token: str) -> None:
    # the window key the charge counted in: a plain sum, exact whatever came since
    entry = s.entry(r[STATE][0], now)
    if entry is not None:
        entry[0] -= c


def sliding_log_refund(s: Store, key: str, now: float, L: float, P: float, B: float,
                       c: float, r: Check, token: str) -> None:
    entry = s.entry(key, now)
    if entry is not None:  # the charge wrote `c` entries at `now`
        log: list[float] = entry[0]
        at = bisect.bisect_left(log, now)
        end = min(bisect.bisect_right(log, now), at + int(c))
        del log[at:end]


def token_bucket_refund(s: Store, key: str, now: float, L: float, P: float, B: float,
                        c: float, r: Check, token: str) -> None:
    entry = s.entry(key, now)
    if entry is not None and entry[0] is r[STATE]:  # still what the charge wrote
        tokens, ts = r[STATE]
        entry[0] = (min(B, tokens + c), ts)


def tat_refund(s: Store, key: str, now: float, L: float, P: float, B: float, c: float,
               r: Check, token: str) -> None:
    entry = s.entry(key, now)
    if entry is not None and entry[0] is r[STATE]:  # still what the charge wrote
        tat = r[STATE] - c * P / L
        if tat <= now:
            s.delete(key)
        else:
            entry[0] = tat


def concurrency_refund(s: Store, key: str, now: float, L: float, P: float, B: float,
                       c: float, r: Check, token: str) -> None:
    entry = s.entry(key, now)
    if entry is not None:
        for unit in range(1, int(c) + 1):
            entry[0].pop(member(token, unit), None)
