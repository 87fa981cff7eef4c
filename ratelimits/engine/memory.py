"""The in-process engine: the Lua algorithms transcribed to Python, for development,
the demo, traffic replay and the local fallback when Redis is out of reach.

Every operation mirrors its Lua twin step for step, in IEEE doubles, so both backends
reach identical decisions for the same requests at the same explicit times (the
conformance and property tests hold them to it).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ratelimits.engine.assemble import assemble
from ratelimits.engine.keys import (
    OFFENDER_CHARS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    US,
    base_key,
    burst_of,
    new_token,
    offenders_key,
    period_us,
    stats_key,
    to_us,
)
from ratelimits.engine.types import Decision, Limit

#: Float time (T = P/L) drifts by fractions of a microsecond at epoch magnitudes; a
#: request this close to its turn is on time (EPS: µs, TOKEN_EPS: units).
EPS, TOKEN_EPS = 1.0, 1e-9

Check = list[Any]  # allowed, remaining, reset_after, retry_after, delay, state...


def _floor0(x: float) -> float:
    # counts derived from float time (T = P/L) land a hair below whole numbers
    return float(max(0, math.floor(x + 1e-3)))


def _ttl_us(us: float) -> float:
    """The expiry Redis would set: whole milliseconds, rounded up, at least one."""
    return float(max(1, math.ceil(us / 1000)) * 1000)


class _Store:
    """Keys with expiry on the engine's own clock (explicit `now` or wall time)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[Any, float]] = {}
        self.calls = 0

    def get(self, key: str, now: float) -> Any:
        entry = self.data.get(key)
        if entry is None:
            return None
        if now >= entry[1]:
            del self.data[key]
            return None
        return entry[0]

    def set(self, key: str, value: Any, now: float, ttl_us: float) -> None:
        self.data[key] = (value, now + _ttl_us(ttl_us))

    def sweep(self, now: float) -> None:
        """Drop expired keys now and then, so idle clients cost nothing."""
        self.calls += 1
        if self.calls % 1024 == 0:
            for key in [k for k, (_, exp) in self.data.items() if now >= exp]:
                del self.data[key]


# -- the algorithms (see lua/*.lua for the same steps) ----------------------------------


def _fixed_window_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    win = math.floor(now / P)
    k = f"{key}:{win}"
    n = float(s.get(k, now) or 0)
    reset = (win + 1) * P - now
    if n + c <= L:
        return [1, L - n - c, reset, 0, 0, k]
    return [0, _floor0(L - n), reset, reset, 0, k]


def _fixed_window_commit(
    s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str
) -> None:
    s.set(r[5], float(s.get(r[5], now) or 0) + c, now, r[2])


def _sliding_window_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    win = math.floor(now / P)
    elapsed = now - win * P
    k = f"{key}:{win}"
    cur = float(s.get(k, now) or 0)
    prev = float(s.get(f"{key}:{win - 1}", now) or 0)
    est = prev * (P - elapsed) / P + cur
    if est + c <= L + TOKEN_EPS:
        return [1, _floor0(L - est - c), 2 * P - elapsed, 0, 0, k, elapsed]
    if cur + c <= L:
        retry = math.ceil(P - (L - cur - c) * P / prev - elapsed)
    else:
        retry = math.ceil(P - elapsed + P - (L - c) * P / cur)
    retry = max(retry, 1)
    reset = 2 * P - elapsed if cur > 0 else P - elapsed
    return [0, _floor0(L - est), reset, retry, 0]


def _sliding_window_commit(
    s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str
) -> None:
    s.set(r[5], float(s.get(r[5], now) or 0) + c, now, 2 * P - r[6])


def _sliding_log_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    log: list[float] | None = s.get(key, now)
    if log:
        del log[: bisect.bisect_right(log, now - P)]
    n = len(log) if log else 0
    if n + c <= L:
        return [1, L - n - c, P, 0, 0]
    assert log  # n + c > L >= c, so n > 0
    oldest = log[int(n + c - L - 1)]
    return [0, _floor0(L - n), log[-1] + P - now, oldest + P - now, 0]


def _sliding_log_commit(
    s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str
) -> None:
    log: list[float] = s.get(key, now) or []
    at = bisect.bisect_right(log, now)
    log[at:at] = [now] * int(c)
    s.set(key, log, now, P)


def _token_bucket_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    state = s.get(key, now)
    tokens, ts = B, now
    if state is not None:
        tokens, ts = state
        if now > ts:
            tokens = min(B, tokens + (now - ts) * L / P)
            ts = now
    if tokens + TOKEN_EPS >= c:
        after = tokens - c
        return [1, _floor0(after), math.ceil((B - after) * P / L), 0, 0, after, ts]
    return [0, _floor0(tokens), math.ceil((B - tokens) * P / L), math.ceil((c - tokens) * P / L), 0]


def _token_bucket_commit(
    s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str
) -> None:
    s.set(key, (r[5], r[6]), now, r[2])


def _leaky_bucket_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    T = P / L
    tat = s.get(key, now)
    tat = now if tat is None or tat < now else tat
    wait = tat - now
    if wait <= B * T + EPS:
        after = tat + c * T
        return [
            1,
            _floor0((B * T - (after - now)) / T + 1),
            math.ceil(after - now),
            0,
            math.ceil(wait),
            after,
        ]
    return [0, 0, math.ceil(wait), math.ceil(wait - B * T), 0]


def _gcra_check(s: _Store, key: str, now: float, L: float, P: float, B: float, c: float) -> Check:
    T = P / L
    tat = s.get(key, now)
    tat = now if tat is None or tat < now else tat
    new = tat + c * T
    allow_at = new - B * T
    if now + EPS >= allow_at:
        return [1, _floor0((now - allow_at) / T), math.ceil(new - now), 0, 0, new]
    return [
        0,
        _floor0((B * T - (tat - now)) / T),
        math.ceil(tat - now),
        math.ceil(allow_at - now),
        0,
    ]


def _tat_commit(s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str) -> None:
    s.set(key, r[5], now, r[2])


def _concurrency_check(
    s: _Store, key: str, now: float, L: float, P: float, B: float, c: float
) -> Check:
    held: dict[str, float] | None = s.get(key, now)
    if held:
        for member in [m for m, expiry in held.items() if expiry <= now]:
            del held[member]
    n = len(held) if held else 0
    if n + c <= L:
        return [1, L - n - c, P, 0, 0]
    return [0, _floor0(L - n), P, min(P, float(US)), 0]


def _concurrency_commit(
    s: _Store, key: str, now: float, P: float, c: float, r: Check, token: str
) -> None:
    held: dict[str, float] = s.get(key, now) or {}
    for i in range(1, int(c) + 1):
        held[f"{token}:{i}"] = now + P
    s.set(key, held, now, P)


CheckFn = Callable[[_Store, str, float, float, float, float, float], Check]
CommitFn = Callable[[_Store, str, float, float, float, Check, str], None]

ALGORITHMS: dict[str, tuple[CheckFn, CommitFn]] = {
    "fixed_window": (_fixed_window_check, _fixed_window_commit),
    "sliding_window": (_sliding_window_check, _sliding_window_commit),
    "sliding_log": (_sliding_log_check, _sliding_log_commit),
    "token_bucket": (_token_bucket_check, _token_bucket_commit),
    "leaky_bucket": (_leaky_bucket_check, _tat_commit),
    "gcra": (_gcra_check, _tat_commit),
    "concurrency": (_concurrency_check, _concurrency_commit),
}


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


class MemoryEngine:
    """Same `evaluate` as `RedisEngine`, with the state in this process. Thread-safe."""

    def __init__(self, *, prefix: str = "rl:", version_key: str | None = None) -> None:
        self.prefix = prefix
        self.version_key = version_key
        self._store = _Store()
        self._version = 0
        self._lock = threading.Lock()

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        now_f = float(to_us(time.time() if now is None else now))
        token = new_token()
        prepared = [self.prepare(limit) for limit in limits]
        with self._lock:
            store = self._store
            store.sweep(now_f)
            checks = []
            admitted = True
            for key, check, _, L, P, B, c, shadow in prepared:
                r = check(store, key, now_f, L, P, B, c)
                checks.append(r)
                if r[0] == 0 and not shadow:
                    admitted = False
            raw: list[Any] = []
            minute = math.floor(now_f / (60 * US))
            for limit, p, r in zip(limits, prepared, checks, strict=True):
                if r[0] == 1 and admitted:
                    p.commit(store, p.key, now_f, p.period_us, p.cost, r, token)
                    field = "a"
                elif r[0] == 1:
                    r[1] += limit.cost
                    field = "o"
                else:
                    field = "w" if limit.shadow else "r"
                if limit.name:
                    self._count(stats_key(self.prefix, limit.name, minute), field, now_f)
                    if field in ("r", "w"):
                        hour = math.floor(now_f / (3600 * US))
                        self._offend(offenders_key(self.prefix, limit.name, hour),
                                     limit.key[:OFFENDER_CHARS], now_f)
                raw += [r[0], r[1], r[2], r[3], r[4], field]
            version = self._version if self.version_key else None
        return assemble(limits, raw, admitted=admitted, version=version, token=token)

    def prepare(self, limit: Limit) -> Prepared:
        """A limit made ready for `evaluate()` and `decide()`: key hashed, figures converted."""
        check, commit = ALGORITHMS[limit.algorithm]
        return Prepared(
            base_key(self.prefix, limit),
            check,
            commit,
            float(limit.limit),
            float(period_us(limit)),
            float(burst_of(limit)),
            float(limit.cost),
            limit.shadow,
        )

    def decide(self, prepared: Sequence[Prepared], now: float) -> tuple[bool, list[int]]:
        """`evaluate()` reduced to its decision, for replaying logs (millions of calls).

        The same algorithms and the same all-or-nothing charge; but no `Decision`, no
        per-minute counters and no offenders (the caller counts). Returns whether the
        request was admitted and, per limit, 1 if that limit alone would admit it.
        """
        now_f = float(to_us(now))
        with self._lock:
            store = self._store
            store.sweep(now_f)
            checks = [
                check(store, key, now_f, L, P, B, c) for key, check, _, L, P, B, c, _ in prepared
            ]
            verdicts = [r[0] for r in checks]
            if 0 in verdicts:
                for p, allowed in zip(prepared, verdicts, strict=False):
                    if not allowed and not p.shadow:
                        return False, verdicts
            token = ""  # names concurrency slots only (nothing releases them here)
            for (key, _, commit, _, P, _, c, _), r in zip(prepared, checks, strict=False):
                if r[0] == 1:
                    if commit is _concurrency_commit and not token:
                        token = new_token()
                    commit(store, key, now_f, P, c, r, token)
        return True, verdicts

    def _count(self, key: str, field: str, now: float) -> None:
        counts: dict[str, int] = self._store.get(key, now) or {}
        counts[field] = counts.get(field, 0) + 1
        self._store.set(key, counts, now, STATS_TTL * US)

    def _offend(self, key: str, who: str, now: float) -> None:
        """Space-Saving top-k, as the Lua `offend`: a newcomer to a full list takes the
        evicted minimum plus one."""
        counts: dict[str, int] | None = self._store.get(key, now)
        if counts is None:  # EXPIRE NX: the list's lifetime starts with its first member
            counts = {}
            self._store.set(key, counts, now, OFFENDERS_TTL * US)
        if who in counts:
            counts[who] += 1
            return
        floor = 0
        if len(counts) >= OFFENDERS_CAP:
            # ZPOPMIN: the lowest score, ties broken by the smallest member
            lowest = min(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
            floor = counts.pop(lowest)
        counts[who] = floor + 1

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs."""
        return [self.counters(name, minute) for name, minute in wanted]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs."""
        return [self.offenders(name, hour, n) for name, hour in wanted]

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour."""
        with self._lock:
            entry = self._store.data.get(offenders_key(self.prefix, name, hour))
            counts = dict(entry[0]) if entry else {}
        # ZREVRANGE order: highest score first, ties by the greatest member
        return sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:n]

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds."""
        if decision.token is None:
            return
        with self._lock:
            for result in decision.results:
                if result.limit.algorithm != "concurrency" or not result.allowed:
                    continue
                entry = self._store.data.get(base_key(self.prefix, result.limit))
                if entry is not None:
                    for i in range(1, result.limit.cost + 1):
                        entry[0].pop(f"{decision.token}:{i}", None)

    def bump_version(self) -> int:
        """Tell every reader that the policies changed; returns the new version."""
        with self._lock:
            self._version += 1
            return self._version

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute (minutes since the epoch)."""
        with self._lock:
            entry = self._store.data.get(stats_key(self.prefix, name, minute))
            return dict(entry[0]) if entry else {}

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit."""
        key = base_key(self.prefix, limit)
        with self._lock:
            for k in [k for k in self._store.data if k == key or k.startswith(key + ":")]:
                del self._store.data[k]

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the concurrency slots these decisions hold for another `period` from now.

        Slots already released or expired stay gone.
        """
        now_f = float(to_us(time.time() if now is None else now))
        with self._lock:
            store = self._store
            for decision in decisions:
                if decision.token is None:
                    continue
                for result in decision.results:
                    limit = result.limit
                    if limit.algorithm != "concurrency" or result.outcome != "a":
                        continue
                    key = base_key(self.prefix, limit)
                    held: dict[str, float] | None = store.get(key, now_f)
                    if not held:
                        continue
                    for member in [m for m, expiry in held.items() if expiry <= now_f]:
                        del held[member]
                    expiry = now_f + period_us(limit)
                    renewed = False
                    for i in range(1, limit.cost + 1):
                        member = f"{decision.token}:{i}"
                        if member in held and held[member] < expiry:
                            held[member] = expiry
                            renewed = True
                    if renewed and store.data[key][1] < now_f + _ttl_us(period_us(limit)):
                        store.set(key, held, now_f, period_us(limit))
