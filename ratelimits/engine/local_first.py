"""What a process decides without a round trip, in front of the store's engine.

`LocalFirst` wraps a `RedisEngine` or `ClusterEngine` and answers in process what it can
answer exactly:

- **Remembered refusals (the deny cache).** Once an enforced limit refuses a client, the
  refusal stands until its retry time: asking the store again before then can only be
  refused again. The process remembers it and refuses that client on that limit without
  a round trip. A flood from one client then costs each process about one store call per
  `HOLD`, not one per request. Anchor: Envoy's rate-limit service keeps a local cache of
  over-limit keys for the same reason. What the process remembers is dropped when it
  hears of a change (an edit, a reset, a flush: `watch`, through `forget_remembered`),
  never trusted while a change may be waiting unheard (`unheard`), learnt under one
  policy version and dropped when the store reports another, never trusted at a time
  before it was learnt, and trusted at most `HOLD` seconds whatever else happens: the
  bound when the store cannot tell (no watch).
- **Leased units.** A limit with `batch` takes up to `batch` units of its window from
  the store in one call and is answered from them in process (see `lease`); the
  request's unleased limits still go to the store, and a unit is spent only when the
  whole request is admitted.

Decisions answered here are counted through the store engine's tally (`count_locally`),
so the per-minute counters, the offenders, metrics and signals see every one of them.
Everything else the store engine offers (`interfaces.StoreEngine`) is passed through by
name, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ratelimits.engine import lease
from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.errors import EngineError
from ratelimits.engine.interfaces import AsyncEngine, StoreEngine, Watch
from ratelimits.engine.keynames import to_us
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.types import Decision, Limit, Outcome, Result

__all__ = ["HOLD", "DenyCache", "LocalFirst"]

#: A remembered refusal is trusted at most this long (seconds): the bound on how late an
#: edit, a reset or another process's refund is seen by a process that stopped asking,
#: when no watch tells it sooner.
HOLD = 1.0
#: Refusals remembered at most, per process (about 500 bytes each: 5 MB). Past it the
#: oldest goes: under a flood of distinct clients the cache keeps the newest refusals,
#: those most likely to be asked about again within `HOLD`.
MAX_REMEMBERED = 10_000


class DenyCache:
    """Refusals, remembered until their retry time or `hold` seconds, whichever comes
    first, at most `size` of them. Thread-safe; times are the caller's (seconds).

    An enforced refusal answers the next requests of its client alone; a shadow one is
    only reported beside it. A concurrency limit is never remembered: a held slot can be
    released at any moment, so its refusal has no retry time to trust.

    The entries are kept in the order they were learnt, which is (but for threads racing
    by microseconds) the order they expire in: each `learn()` first drops the expired ones
    from the oldest end, so an entry is gone at most `hold` after it expired, however many
    distinct clients come and go, and the cost is constant per entry."""

    def __init__(self, hold: float = HOLD, size: int = MAX_REMEMBERED) -> None:
        self.hold = hold
        self.size = size
        self._lock = threading.Lock()
        #: limit -> (trusted until, retry at, reset at, learnt at), the oldest learnt
        #: first (read without the lock: empty, nothing can be answered here)
        self.refused: OrderedDict[Limit, tuple[float, float, float, float]] = OrderedDict()
        #: The policy version the refusals were learnt under (None: none reported yet).
        self.version: int | None = None
        #: Set once the store reported a version: it answered this process.
        self.answered = threading.Event()

    def learn(self, decision: Decision, at: float) -> None:
        """Remember the enforced refusals of a decision the store made at `at`."""
        if decision.allowed:
            return
        with self._lock:
            self._expire(at)
            refused = self.refused
            for result in decision.results:
                # a shadow limit's would-be refusal is remembered too, to be reported as
                # such beside an enforced one (alone it never answers a request)
                if result.allowed or result.limit.spec.holds_slots:
                    continue
                retry_at = at + result.retry_after
                entry = (at + min(result.retry_after, self.hold), retry_at,
                         at + max(result.reset_after, result.retry_after), at)
                if result.limit in refused:
                    refused.move_to_end(result.limit)  # learnt again: the newest now
                elif len(refused) >= self.size:
                    refused.popitem(last=False)  # full: the oldest goes
                refused[result.limit] = entry

    def answer(self, limits: Sequence[Limit], at: float) -> Decision | None:
        """The refusal of `limits` at `at` if one of them is remembered, else None."""
        refused = self.refused
        if not refused:
            return None
        hits: dict[int, tuple[float, float, float, float]] = {}
        enforced = False
        for i, limit in enumerate(limits):
            entry = refused.get(limit)
            if entry is None:
                continue
            # never before it was learnt: a clock set back (a test's timer) would make
            # its retry time years away
            if entry[3] <= at < entry[0]:
                hits[i] = entry
                enforced = enforced or not limit.shadow
            else:  # expired, or asked about before it was learnt: the store decides
                with self._lock:
                    if refused.get(limit) is entry:
                        del refused[limit]
        if not enforced:
            return None
        results = []
        retry = 0.0
        for i, limit in enumerate(limits):
            if i not in hits:  # not consulted: nothing was charged, as on any refusal
                results.append(Result(limit, True, 0, 0.0, 0.0, outcome=Outcome.SPARED))
                continue
            _, retry_at, reset_at, _ = hits[i]
            retry_after = retry_at - at if retry_at > at else 0.0
            if not limit.shadow and retry_after > retry:
                retry = retry_after
            results.append(Result(limit, False, 0, reset_at - at if reset_at > at else 0.0,
                                  retry_after, outcome=Outcome.WOULD_REJECT if limit.shadow
                                  else Outcome.REJECTED))
        whole = int(retry)  # whole seconds, at least one (`Decision.retry_after`)
        if whole < retry:
            whole += 1
        return Decision(allowed=False, results=tuple(results),
                        retry_after=whole if whole > 1 else 1)

    def forget(self, limit: Limit) -> None:
        """Drop what is remembered of one client under one limit (after a reset)."""
        with self._lock:
            for remembered in [k for k in self.refused if _same_client(k, limit)]:
                del self.refused[remembered]

    def forget_policy(self, name: str) -> None:
        """Drop what is remembered under policy `name` (its clients were reset)."""
        with self._lock:
            for remembered in [k for k in self.refused if k.name == name]:
                del self.refused[remembered]

    def moved(self, version: int | None) -> None:
        """The store reported policy `version`, not the one the refusals were learnt
        under: they go (a policy edited, the store flushed: its version is then 0)."""
        with self._lock:
            self.refused.clear()
            self.version = version
        if version is not None:
            self.answered.set()

    def clear(self) -> None:
        with self._lock:
            self.refused.clear()

    def __len__(self) -> int:
        return len(self.refused)

    def _expire(self, at: float) -> None:
        """Drop the expired entries at the oldest end (the lock held)."""
        refused = self.refused
        while refused:
            oldest, entry = next(iter(refused.items()))
            if entry[0] > at:
                return
            del refused[oldest]


def _all_heard() -> bool:
    return False


def _same_client(a: Limit, b: Limit) -> bool:
    return a.name == b.name and a.key == b.key


class LocalFirst(Acquiring):
    """A store engine with the decisions a process can make alone in front of it.

    Same API as the engine it wraps (`store`, a `StoreEngine`); `evaluate()` answers a
    remembered refusal in process, leased limits from the process's leases, and sends the
    rest to the store. `aio` is the store's asyncio twin (`engine.aio`), when the app
    built one: the async calls then await the store on the event loop. `clock` gives the
    time when `evaluate()` is not given `now` (seconds; only differences matter).
    `unheard`, set by whoever runs this store's `watch()`, says whether a change of the
    store may have come that was not heard yet: remembered refusals wait for it.
    """

    def __init__(self, store: StoreEngine, aio: AsyncEngine | None = None, *,
                 hold: float = HOLD, clock: Callable[[], float] = time.time,
                 leasing: bool = True) -> None:
        self.store = store
        #: False for a store that takes no leases yet (PostgreSQL): a limit's `batch` is
        #: then left unused, and the store decides each of its requests, exactly.
        self.leasing = leasing
        self.aio = aio
        self.clock = clock
        self.denied = DenyCache(hold)
        #: this process's leases of the limits with a `batch` (see `lease`)
        self.leases = lease.Leases()
        self.unheard: Callable[[], bool] = _all_heard

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Decide a request: in process when one of its limits refused this client within
        the last `HOLD` seconds and its retry time has not come, else in the store."""
        # read before the store is asked: a refusal is remembered from no later than the
        # store made it, so never past its retry time
        at = self.clock() if now is None else now
        # (read without the lock: nothing remembered, no answer)
        if self.denied.refused and not self.unheard():
            local = self._remembered(limits, at)
            if local is not None:
                return local
        for limit in limits:
            if limit.batch is not None and self.leasing:
                decision = self._leased(limits, now, at)
                break
        else:
            decision = self.store.evaluate(limits, now)
        return self._learnt(decision, at)

    async def aevaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """`evaluate()` for async code: the store awaited on the event loop when it has
        an asyncio twin (`aio`), in a worker thread otherwise."""
        if self.aio is None:
            return await asyncio.to_thread(self.evaluate, limits, now)
        # read before the store is asked: a refusal is remembered from no later than the
        # store made it, so never past its retry time
        at = self.clock() if now is None else now
        if self.denied.refused and not self.unheard():
            local = self._remembered(limits, at)
            if local is not None:
                return local
        decision: Decision
        for limit in limits:
            if limit.batch is not None and self.leasing:
                decision, answered = await lease.adecide(self.aio, self.leases, limits, now, at)
                self._count_answered(answered, at)
                break
        else:
            decision = await self.aio.evaluate(limits, now)
        return self._learnt(decision, at)

    async def arelease(self, decision: Decision) -> None:
        """The store's `release()`, awaited on the loop when it has an asyncio twin."""
        if self.aio is None:
            await asyncio.to_thread(self.store.release, decision)
        else:
            await self.aio.release(decision)

    async def aread_version(self) -> int:
        """The store's `read_version()`, awaited on the loop when it has an asyncio twin."""
        if self.aio is None:
            version: int = await asyncio.to_thread(self.store.read_version)
        else:
            version = await self.aio.read_version()
        if version != self.denied.version:
            self.denied.moved(version)
        return version

    def _learnt(self, decision: Decision, at: float) -> Decision:
        """`decision`, made by the store at `at`: its refusals remembered, under the
        policy version it reported (what was learnt under another one goes)."""
        version = decision.version
        if version is not None and version != self.denied.version:
            self.denied.moved(version)
        if not decision.allowed:
            self.denied.learn(decision, at)
        return decision

    def _remembered(self, limits: Sequence[Limit], at: float) -> Decision | None:
        """The deny cache's answer, counted like the store's; None to ask the store."""
        local = self.denied.answer(limits, at)
        if local is not None:
            self.store.count_locally(local, to_us(at))
        return local

    def _leased(self, limits: Sequence[Limit], now: float | None, at: float) -> Decision:
        """Leased limits from this process's units; only the others go to the store."""
        decision, answered = lease.decide(self.store, self.leases, limits, now, at)
        self._count_answered(answered, at)
        return decision

    def _count_answered(self, answered: Decision, at: float) -> None:
        """Count what the leases answered in process, as the store's calls are."""
        if answered.results:
            self.store.count_locally(answered, to_us(at))

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit, here and in the store."""
        self.denied.forget(limit)
        self.leases.forget(limit)  # the store's reset voids their give-back (see lease)
        self.store.reset(limit, now)

    def forget_remembered(self, name: str | None = None) -> None:
        """Drop what this process remembers of policy `name`'s clients (None: of every
        policy): something changed that the store alone knows the effect of."""
        if name is None:
            self.denied.clear()
        else:
            self.denied.forget_policy(name)

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name`, in the store."""
        self.store.forget_figures(name, now)

    def close(self) -> None:
        """Give the unspent leased units back, then close the store engine."""
        with contextlib.suppress(EngineError):  # they are then lost for their window only
            self.store.give_back(self.leases.drain())
        self.store.close()

    # -- the store's own, passed through ------------------------------------------------

    @property
    def slots_expire(self) -> bool:
        return self.store.slots_expire

    @property
    def live_instances(self) -> int | None:
        return self.store.live_instances

    @property
    def client(self) -> Any:
        return self.store.client

    def release(self, decision: Decision) -> None:
        self.store.release(decision)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        self.store.renew(decisions, now)

    def read_version(self, now: float | None = None) -> int:
        version = self.store.read_version(now)
        if version != self.denied.version:
            self.denied.moved(version)
        return version

    def bump_version(self) -> int:
        return self.store.bump_version()

    def lease(self, limits: Sequence[Limit], now: float | None = None, *,
              back: Sequence[Leftover] = ()) -> list[Grant]:
        return self.store.lease(limits, now, back=back)

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        return self.store.give_back(back, now)

    def count_locally(self, decision: Decision, now_us: int) -> None:
        self.store.count_locally(decision, now_us)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        self.store.count_fields(name, now_us, fields)

    def flush(self) -> None:
        self.store.flush()

    def watch(self) -> Watch | None:
        return self.store.watch()

    def announce_reset(self, name: str) -> None:
        self.store.announce_reset(name)

    def counters(self, name: str, minute: int) -> dict[str, int]:
        return self.store.counters(name, minute)

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        return self.store.counters_many(wanted)

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        return self.store.offenders(name, hour, n)

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        return self.store.offenders_many(wanted, n)
