"""The in-process engine: the algorithms of `algorithms.py` over a `ExpiringStore`, for
development, the demo, traffic replay and the local fallback when Redis is out of reach.

It mirrors the batch script: check every limit, charge all or none (`charging.charge()`,
used by both `evaluate()` and `decide()`), count and list offenders as the script does.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.algorithms import (
    ALLOWED,
    DELAY,
    REMAINING,
    RESET_AFTER,
    RETRY_AFTER,
)
from ratelimits.engine.charging import Prepared, Receipt, charge, refund, waiting_and_warm
from ratelimits.engine.constants import (
    OFFENDER_CHARS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    US,
)
from ratelimits.engine.contract import assemble, result_values
from ratelimits.engine.expiring import ExpiringStore
from ratelimits.engine.keynames import (
    client_key,
    figure_keys,
    guaranteed,
    offenders_key,
    period_us,
    state_keys,
    stats_key,
    to_us,
)
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import CHARGE, REFUND, Decision, Limit, Outcome, Result

__all__ = ["MemoryEngine"]

#: At most this many limits are kept made ready (see `MemoryEngine.take`).
PREPARED_KEPT = 4_096


class MemoryEngine(Acquiring):
    """Same `evaluate` as `RedisEngine`, with the state in this process. Thread-safe."""

    def __init__(self, *, prefix: str = "rl:", version_key: str | None = None,
                 counted: bool = True) -> None:
        self.prefix = prefix
        self.version_key = version_key
        #: Whether its decisions are counted here, per minute and in its offenders: False
        #: when it decides beside a store, which counts them instead and is the one read.
        self.counted = counted
        self._store = ExpiringStore()
        self._version = 0
        self._lock = threading.Lock()
        #: Each limit made ready once (`prepare`), by identity: a client's limit is one
        #: object (`CompiledPolicy.limit_for`) and recurs on its requests; the entry holds
        #: the limit, so its id names no other while it is kept.
        self._prepared: dict[int, tuple[Limit, Prepared]] = {}

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        return self.take(limits, now)[0]

    def take(self, limits: Sequence[Limit], now: float | None = None
             ) -> tuple[Decision, Receipt | None]:
        """`evaluate()`, and a receipt of what it charged for `refund()` (None: nothing)."""
        now_f = float(to_us(time.time() if now is None else now))
        kept = self._prepared
        prepared = []
        for limit in limits:
            entry = kept.get(id(limit))
            if entry is None or entry[0] is not limit:
                if len(kept) >= PREPARED_KEPT:
                    kept.clear()  # many clients: start again rather than grow
                entry = kept[id(limit)] = (limit, self.prepare(limit))
            prepared.append(entry[1])
        with self._lock:
            if now_f >= self._store.next_due:
                self._store.sweep(now_f)
            admitted, checks, _, token = charge(self._store, prepared, now_f)
            raw: list[Any] = []
            counted = self.counted  # beside a store (the usual case), the store counts
            for limit, r in zip(limits, checks, strict=True):
                remaining = r[REMAINING]
                if limit.stage == REFUND:
                    field = "o"  # a reservation taken back
                elif r[ALLOWED] and admitted:
                    field = "a"
                elif r[ALLOWED]:
                    remaining += limit.cost  # not charged: its units are still there
                    field = "o"
                else:
                    field = "w" if limit.shadow else "r"
                if counted and limit.name:
                    minute = math.floor(now_f / (60 * US))
                    self._count(stats_key(self.prefix, limit.name, minute), field, now_f)
                    if field in ("r", "w"):
                        hour = math.floor(now_f / (3600 * US))
                        self._offend(offenders_key(self.prefix, limit.name, hour),
                                     limit.key[:OFFENDER_CHARS], now_f)
                raw += result_values(r[ALLOWED], remaining, r[RESET_AFTER], r[RETRY_AFTER],
                                     r[DELAY], field)
            version = self._version if self.version_key else None
        decision = assemble(limits, raw, admitted=admitted, version=version,
                            token=token or None, now_us=int(now_f))
        if not admitted:
            return decision, None
        return decision, Receipt(decision, tuple(prepared), tuple(checks), now_f, token)

    def take_one(self, limit: Limit, now: float | None = None) -> Decision:
        """`take([limit])` without a receipt, for a caller that never refunds it (the only
        layer of a request): the usual per-process call, one limit whose check is its
        all or nothing, without the lists and the assembly of a batch. Counted as
        `take()` counts when this engine counts its own decisions."""
        entry = self._prepared.get(id(limit))
        if entry is None or entry[0] is not limit or self.counted:
            return self.take([limit], now)[0]  # made ready (or counted) there
        p = entry[1]
        if p.stage != CHARGE or p.lockout or p.needs_token:
            return self.take([limit], now)[0]
        now_f = float(to_us(time.time() if now is None else now))
        with self._lock:
            store = self._store
            if now_f >= store.next_due:
                store.sweep(now_f)
            r = charge(store, (p,), now_f)[1][0]  # one limit: its check is all or nothing
            version = self._version if self.version_key else None
        return _assembled_one(limit, r[ALLOWED], r[REMAINING], r[RESET_AFTER], r[RETRY_AFTER],
                            r[DELAY], version)

    def refund(self, receipt: Receipt) -> Decision:
        """Give back what `take()` charged, because something outside this engine refused
        the request; returns the decision as if it had been refused here (its admitted
        limits SPARED, with their units still remaining).

        Exact for the windows, the log and the slots; a bucket, GCRA or queue gets its
        units back only while its state is still the one the charge wrote (another
        request since may have built on it: then the charge stays, under-admitting).
        """
        decision = receipt.decision
        now = receipt.now
        minute = math.floor(now / (60 * US))
        results = []
        with self._lock:
            for result, p, r in zip(decision.results, receipt.prepared, receipt.checks,
                                    strict=True):
                if result.outcome is not Outcome.ADMITTED:
                    results.append(result)
                    continue
                if result.limit.stage != REFUND:
                    refund(self._store, result.limit.algorithm, p, now, r, receipt.token)
                if result.limit.name:
                    key = stats_key(self.prefix, result.limit.name, minute)
                    counts = self._store.get(key, now)
                    if counts is not None and counts.get("a"):
                        counts["a"] -= 1
                        if not counts["a"]:
                            del counts["a"]
                        counts["o"] = counts.get("o", 0) + 1
                results.append(dataclasses.replace(
                    result, remaining=result.remaining + result.limit.cost,
                    outcome=Outcome.SPARED))
        return dataclasses.replace(decision, allowed=False, results=tuple(results),
                                   retry_after=max(1, decision.retry_after), delay=0.0,
                                   token=None)

    def read_version(self, now: float | None = None) -> int:
        """The policy version (in process: no round trip to save)."""
        return self._version

    def prepare(self, limit: Limit) -> Prepared:
        """A limit made ready for `evaluate()` and `decide()`: key hashed, figures converted."""
        spec = REGISTRY[limit.algorithm]
        check, commit = spec.check, spec.commit
        # bound here: the plain checks stay as fast
        if limit.max_wait or limit.warmup or limit.calendar:
            check, commit = waiting_and_warm(check, commit, limit)
        return Prepared(
            client_key(self.prefix, limit),
            check,
            commit,
            float(limit.limit),
            float(period_us(limit)),
            float(spec.burst_of(limit)),
            float(limit.cost),
            limit.shadow,
            spec.holds_slots,
            limit.stage,
            float(to_us(limit.lockout)),
            limit.algorithm,
        )

    def decide(self, prepared: Sequence[Prepared], now: float) -> tuple[bool, list[int]]:
        """`evaluate()` reduced to its decision, for replaying logs (millions of calls).

        The same algorithms and the same all-or-nothing `charge()`; but no `Decision`, no
        per-minute counters and no offenders (the caller counts). Returns whether the
        request was admitted and, per limit, 1 if that limit alone would admit it.
        """
        now_f = float(to_us(now))
        store = self._store
        with self._lock:
            if now_f >= store.next_due:
                store.sweep(now_f)
            admitted, _, allowed, _ = charge(store, prepared, now_f)
        return admitted, allowed

    def _count(self, key: str, field: str, now: float, n: int = 1) -> None:
        counts: dict[str, int] = self._store.get(key, now) or {}
        counts[field] = counts.get(field, 0) + n
        self._store.set(key, counts, now, STATS_TTL * US)

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision another engine of this process made (an adaptive limit's),
        in the counters and offenders, as `evaluate()` counts its own."""
        now_f = float(now_us)
        minute = math.floor(now_f / (60 * US))
        with self._lock:
            for result in decision.results:
                name = result.limit.name
                if not name:
                    continue
                field = result.outcome.value
                self._count(stats_key(self.prefix, name, minute), field, now_f)
                if not result.allowed:
                    hour = math.floor(now_f / (3600 * US))
                    self._offend(offenders_key(self.prefix, name, hour),
                                 result.limit.key[:OFFENDER_CHARS], now_f)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute (as `Tally.add_fields`)."""
        now_f = float(now_us)
        key = stats_key(self.prefix, name, math.floor(now_f / (60 * US)))
        with self._lock:
            for field, n in fields.items():
                self._count(key, field, now_f, n)

    def _offend(self, key: str, who: str, now: float) -> None:
        """Space-Saving top-k, as the Lua `offend`: a newcomer to a full list takes the
        evicted minimum plus one, and keeps that floor as its error."""
        entry: tuple[dict[str, int], dict[str, int]] | None = self._store.get(key, now)
        if entry is None:  # EXPIRE NX: the list's lifetime starts with its first member
            entry = ({}, {})
            self._store.set(key, entry, now, OFFENDERS_TTL * US)
        counts, errors = entry
        if who in counts:
            counts[who] += 1
            return
        floor = 0
        if len(counts) >= OFFENDERS_CAP:
            # ZPOPMIN: the lowest score, ties broken by the smallest member
            lowest = min(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
            floor = counts.pop(lowest)
            errors.pop(lowest, None)
        counts[who] = floor + 1
        if floor:
            errors[who] = floor

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs."""
        return [self.counters(name, minute) for name, minute in wanted]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs."""
        return [self.offenders(name, hour, n) for name, hour in wanted]

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour, by
        guaranteed count: refusals each one certainly had (see `keynames.guaranteed`)."""
        with self._lock:
            entry = self._store.data.get(offenders_key(self.prefix, name, hour))
            counts, errors = (dict(entry[0][0]), dict(entry[0][1])) if entry else ({}, {})
        return guaranteed(counts, errors, n)

    async def aevaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """`evaluate()` on the event loop itself: in process, nothing to wait for."""
        return self.evaluate(limits, now)

    async def arelease(self, decision: Decision) -> None:
        self.release(decision)

    async def aread_version(self) -> int:
        return self.read_version()

    #: The slots of `concurrency` limits expire after their period unless renewed.
    slots_expire = True

    @property
    def live_instances(self) -> int | None:
        """None: no heartbeat, the state is this process's alone."""
        return None

    def close(self) -> None:
        """Nothing to send or to stop: the state lives and ends with the process."""

    def release(self, decision: Decision) -> None:
        """Free the slots an admitted decision holds."""
        holding = decision.holding()
        if not holding:
            return
        with self._lock:
            for limit, members in holding:
                entry = self._store.data.get(client_key(self.prefix, limit))
                if entry is not None:
                    for name in members:
                        entry[0].pop(name, None)

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
        """Forget one client's state under one limit (current and previous windows)."""
        keys = state_keys(self.prefix, limit, lambda: to_us(time.time() if now is None else now))
        with self._lock:
            for key in keys:
                self._store.delete(key)

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name` (its per-minute counters, its offenders),
        as when the policy is deleted: a policy created again under its name starts from
        zero."""
        keys = figure_keys(self.prefix, name, time.time() if now is None else now)
        with self._lock:
            for key in keys:
                self._store.delete(key)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another `period` from now.

        Slots already released or expired stay gone.
        """
        now_f = float(to_us(time.time() if now is None else now))
        with self._lock:
            store = self._store
            for decision in decisions:
                for limit, members in decision.holding():
                    key = client_key(self.prefix, limit)
                    held: dict[str, float] | None = store.get(key, now_f)
                    if not held:
                        continue
                    for gone in [m for m, expiry in held.items() if expiry <= now_f]:
                        del held[gone]
                    period = period_us(limit)
                    renewed = False
                    for name in members:
                        if name in held and held[name] < now_f + period:
                            held[name] = now_f + period
                            renewed = True
                    if renewed:
                        store.set(key, held, now_f, period)


def _assembled_one(limit: Limit, allowed: int, remaining: float, reset_after: float,
                    retry_after: float, delay: float, version: int | None) -> Decision:
    """`contract.assemble()` of a call of one `CHARGE` limit that holds no slot, from its
    check's figures (µs), as `take_one` answers: its refusal refuses the call unless it is
    shadow, and nothing is spared (tests hold it to `take()`'s decisions)."""
    rem = int(remaining)
    if rem < 0:
        rem = 0
    if allowed:
        result = Result(limit, True, rem, reset_after / US, 0.0, delay / US, Outcome.ADMITTED)
        return Decision(True, (result,), 0, 0.0 if limit.shadow else result.delay, version)
    if limit.shadow:
        result = Result(limit, False, rem, reset_after / US, retry_after / US, 0.0,
                        Outcome.WOULD_REJECT)
        return Decision(True, (result,), 0, 0.0, version)
    result = Result(limit, False, rem, reset_after / US, retry_after / US, 0.0,
                    Outcome.REJECTED)
    retry = -(-int(retry_after) // US)
    return Decision(False, (result,), retry if retry > 1 else 1, 0.0, version)
