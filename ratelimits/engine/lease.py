"""Token leases: units of a windowed limit taken from the store ahead, spent in process.

A limit with `batch` set is answered from a lease: the store charges up to `batch` units
to the limit's current window in one call (`lua/lease.lua`), and this process admits
from them without a round trip. A unit is charged before it is spent, so all processes
together never admit more than the limit; what a process holds unspent when others run
dry is the price (at most `batch` units per process and limit).

A lease ends when it is spent, when its window ends, or `LEASE_SECONDS` after it was
taken, whichever comes first; its unspent units then go back to the store (taken back
only while their window is still current). `Leases` is one process's book of them.

A reset of a client (the admin's, `manage.py ratelimits reset`) cannot take back the
units other processes hold: they will be spent, without a word to the store. So the
reset of a leased limit does not empty the window's count; it keeps of it the units
that leases taken within the last `LEASE_SECONDS` may still spend (the store keeps, per
client and window, what it granted in the last two lease periods), and it starts a new
epoch of the window: units of an earlier epoch can no longer be given back, as they are
not in the count any more. What processes hold is then spent on top of a count that
already holds it, and the window admits no more than its limit after the reset. A reset
made twice `LEASE_SECONDS` or more after the client's last lease frees the whole window;
one made sooner frees what was not leased since. (So a book's leases must last no
longer than `LEASE_SECONDS`, the default of `Leases`.)
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratelimits.engine.types import Decision, Limit, Outcome, Result

if TYPE_CHECKING:
    from ratelimits.engine.interfaces import AsyncEngine, StoreEngine

__all__ = [
    "LEASE_SECONDS",
    "Grant",
    "Hold",
    "Leases",
    "Leftover",
    "decide",
]

#: A lease lasts at most this long (seconds): units idle in one process come back to
#: the others within it, and the figures a lease reports are never older.
LEASE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    """What the store granted one limit: `units` (0 when its window has fewer than the
    limit's cost left), charged to window number `window`.

    `remaining`: units the window has left after the grant, for every process;
    `reset_after`, `retry_after` (0 when granted), `ends_after` (until the window ends,
    the grant's last moment): seconds from the grant. `epoch`: the resets the client had
    in that window; its units can be given back only in the same epoch."""

    limit: Limit
    units: int
    window: int
    remaining: int
    reset_after: float
    retry_after: float
    ends_after: float
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Leftover:
    """Unspent units of an ended lease, to give back to window number `window`, in the
    epoch (resets of that window) they were granted in."""

    limit: Limit
    window: int
    units: int
    epoch: int = 0


class _Lease:
    """A lease in the book (mutable, only under the book's lock)."""

    __slots__ = ("ended", "expires", "grant", "taken_at", "units")

    def __init__(self, grant: Grant, at: float, seconds: float) -> None:
        self.grant = grant
        self.units = grant.units
        self.taken_at = at
        self.expires = at + min(seconds, grant.ends_after)
        self.ended = False  # its unspent units went to the give-back


@dataclass(frozen=True, slots=True)
class Hold:
    """`limit.cost` units reserved from a lease for one request: spent when the whole
    request is admitted (nothing to do), put back by `Leases.cancel()` when it is not.

    `remaining` and `reset_after` are the figures as of the lease: the window's units
    left at the grant plus those this process still holds, and the grant's reset less
    the time since."""

    limit: Limit
    window: int
    remaining: int
    reset_after: float
    lease: _Lease  # where it came from, to put cancelled units back


class Leases:
    """One process's leases, by limit; thread-safe. `at` is the caller's clock (seconds):
    the explicit `now` it passes to the engine, else its own clock, read before the lease
    call, so that a lease ends no later than its window does on the store's clock."""

    def __init__(self, seconds: float = LEASE_SECONDS) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._leases: dict[Limit, _Lease] = {}
        self._leftovers: list[Leftover] = []
        self._swept_at = 0.0
        _books.add(self)

    def _forked(self) -> None:
        # A forked worker must not spend its parent's units: both would spend the same
        # charge. The parent gives them back; the child starts with an empty book.
        self._lock = threading.Lock()
        self._leases, self._leftovers = {}, []

    def take(self, limit: Limit, at: float) -> Hold | None:
        """Reserve `limit.cost` units of its live lease; None when it has no lease that
        runs at `at` with that many (a lease that ended leaves its units to give back)."""
        with self._lock:
            if at - self._swept_at >= self.seconds:
                self._sweep(at)
            lease = self._leases.get(limit)
            if lease is None:
                return None
            if at >= lease.expires or lease.units < limit.cost:
                self._end(limit, lease)
                return None
            return self._reserve(limit, lease, at)

    def grant(self, grant: Grant, at: float) -> Hold | None:
        """Record a fresh grant (taken at `at`) and reserve `cost` units of it; None when
        it granted too few. A lease the limit already had ends and gives its units back."""
        limit = grant.limit
        with self._lock:
            old = self._leases.get(limit)
            if old is not None:
                self._end(limit, old)
            if grant.units < limit.cost:
                if grant.units:
                    self._leftovers.append(Leftover(limit, grant.window, grant.units,
                                                    grant.epoch))
                return None
            lease = self._leases[limit] = _Lease(grant, at, self.seconds)
            return self._reserve(limit, lease, at)

    def _reserve(self, limit: Limit, lease: _Lease, at: float) -> Hold:
        lease.units -= limit.cost
        grant = lease.grant
        hold = Hold(limit, grant.window, grant.remaining + lease.units,
                    max(0.0, grant.reset_after - (at - lease.taken_at)), lease)
        if not lease.units:  # spent: nothing to give back, nothing to keep
            del self._leases[limit]
        return hold

    def cancel_all(self, holds: dict[int, Hold]) -> None:
        """`cancel()` each of `holds` (the store call that would decide them failed)."""
        for hold in holds.values():
            self.cancel(hold)

    def cancel(self, hold: Hold) -> None:
        """The request was refused elsewhere: its units go back to the lease, or, when
        that lease ended meanwhile, to the units to give back to the store."""
        with self._lock:
            lease = hold.lease
            if self._leases.get(hold.limit) is lease:
                lease.units += hold.limit.cost
            elif not lease.ended and hold.limit not in self._leases:
                # the reservations had emptied the lease: it runs again with these units
                lease.units = hold.limit.cost
                self._leases[hold.limit] = lease
            else:
                self._leftovers.append(Leftover(hold.limit, hold.window, hold.limit.cost,
                                                lease.grant.epoch))

    def leftovers(self) -> list[Leftover]:
        """The units of ended leases not yet given back; the caller sends them with its
        next lease call (or `give_back()`), and they are forgotten here."""
        with self._lock:
            out, self._leftovers = self._leftovers, []
        return out

    def drain(self) -> list[Leftover]:
        """End every lease (shutdown): all unspent units, to give back."""
        with self._lock:
            for limit, lease in list(self._leases.items()):
                self._end(limit, lease)
            out, self._leftovers = self._leftovers, []
        return out

    def units(self, limit: Limit) -> int:
        """Units this process holds for `limit` (0 without a lease)."""
        with self._lock:
            lease = self._leases.get(limit)
            return 0 if lease is None else lease.units

    def forget(self, limit: Limit) -> None:
        """Drop the leases of one client under one policy, giving nothing back (after an
        admin reset: their epoch of the window is over, the store would refuse them)."""
        with self._lock:
            for leased in [x for x in self._leases if (x.name, x.key) == (limit.name, limit.key)]:
                self._leases.pop(leased).ended = True

    def held(self) -> dict[Limit, int]:
        """Units this process holds, per limit with a lease."""
        with self._lock:
            return {limit: lease.units for limit, lease in self._leases.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _end(self, limit: Limit, lease: _Lease) -> None:
        del self._leases[limit]
        lease.ended = True
        if lease.units:
            self._leftovers.append(Leftover(limit, lease.grant.window, lease.units,
                                            lease.grant.epoch))
            lease.units = 0

    def _sweep(self, at: float) -> None:
        # once a lease period: leases of clients that went quiet end and give back
        self._swept_at = at
        for limit, lease in list(self._leases.items()):
            if at >= lease.expires:
                self._end(limit, lease)


#: Every book of this process, emptied in a forked child (`Leases._forked`).
_books: weakref.WeakSet[Leases] = weakref.WeakSet()


def _forked() -> None:
    for book in list(_books):
        book._forked()


os.register_at_fork(after_in_child=_forked)


def decide(
    store: StoreEngine, book: Leases, limits: Sequence[Limit], now: float | None, at: float
) -> tuple[Decision, Decision]:
    """Decide a request whose leased limits (`batch` set) are answered from `book`.

    Leased limits without enough units lease in one `store.lease()` call (carrying the
    units of ended leases back) before the unleased limits go to `store.evaluate()`, so
    that a window with nothing left refuses the request without charging the others. The
    reserved units are spent only when the whole request is admitted. Returns the
    decision, in the request's order, and the part of it answered here (for the tally).
    Raises what the store raises; nothing is spent then.

    The steps are pure (`reserve`, `granted`, `unleased`, `settle`); `adecide` takes the
    same ones around the store's awaited calls.
    """
    holds, need = reserve(book, limits, at)
    refused: dict[int, Grant] = {}
    try:
        if need:
            wanted, back = [limits[i] for i in need], book.leftovers()
            refused = granted(book, need, store.lease(wanted, now, back=back), holds, at)
        asked = unleased(limits, refused)
        stored = store.evaluate(asked, now) if asked else None
    except BaseException:
        book.cancel_all(holds)  # nothing is spent when the store fails
        raise
    return settle(book, limits, holds, refused, stored)


async def adecide(
    store: AsyncEngine, book: Leases, limits: Sequence[Limit], now: float | None, at: float
) -> tuple[Decision, Decision]:
    """`decide()` with a store whose `lease` and `evaluate` are awaited (`engine.aio`)."""
    holds, need = reserve(book, limits, at)
    refused: dict[int, Grant] = {}
    try:
        if need:
            wanted, back = [limits[i] for i in need], book.leftovers()
            grants = await store.lease(wanted, now, back=back)
            refused = granted(book, need, grants, holds, at)
        asked = unleased(limits, refused)
        stored = await store.evaluate(asked, now) if asked else None
    except BaseException:
        book.cancel_all(holds)
        raise
    return settle(book, limits, holds, refused, stored)


def reserve(book: Leases, limits: Sequence[Limit], at: float
            ) -> tuple[dict[int, Hold], list[int]]:
    """The units each leased limit reserves from `book` for this request, by index, and
    the indexes of the leased limits whose book has too few (to lease)."""
    holds: dict[int, Hold] = {}
    need: list[int] = []
    for i, limit in enumerate(limits):
        if limit.batch is not None:
            hold = book.take(limit, at)
            if hold is None:
                need.append(i)
            else:
                holds[i] = hold
    return holds, need


def granted(book: Leases, need: list[int], grants: Sequence[Grant], holds: dict[int, Hold],
            at: float) -> dict[int, Grant]:
    """Record the grants the store gave the limits at `need`, their units reserved into
    `holds`; the grants that brought too few, by index."""
    refused: dict[int, Grant] = {}
    for i, grant in zip(need, grants, strict=True):
        hold = book.grant(grant, at)
        if hold is None:
            refused[i] = grant
        else:
            holds[i] = hold
    return refused


def unleased(limits: Sequence[Limit], refused: dict[int, Grant]) -> list[Limit]:
    """The unleased limits, for the store to decide; none when a lease refused the
    request (`refused` holds an enforced limit): nothing else is charged then."""
    for grant in refused.values():
        if not grant.limit.shadow:
            return []
    return [limit for limit in limits if limit.batch is None]


def settle(book: Leases, limits: Sequence[Limit], holds: dict[int, Hold],
           refused: dict[int, Grant], stored: Decision | None) -> tuple[Decision, Decision]:
    """The request's decision, in its order, from the holds, the refused grants and the
    store's decision of the unleased limits (None: not asked), the holds spent when it
    is admitted and put back otherwise; and the part of it answered here."""
    blocked = False
    for grant in refused.values():
        blocked = blocked or not grant.limit.shadow
    admitted = not blocked and (stored is None or stored.allowed)
    asked = iter(() if stored is None else stored.results)
    results: list[Result] = []
    local: list[Result] = []
    for i, limit in enumerate(limits):
        if limit.batch is None:
            # unleased limits not asked (a lease refused): nothing charged, as on a refusal
            result = next(asked, None) or Result(limit, True, 0, 0.0, 0.0,
                                                 outcome=Outcome.SPARED)
            results.append(result)
            continue
        hold = holds.get(i)
        if hold is not None:
            if not admitted:
                book.cancel(hold)
            result = Result(limit, True, hold.remaining + (0 if admitted else limit.cost),
                            hold.reset_after, 0.0,
                            outcome=Outcome.ADMITTED if admitted else Outcome.SPARED)
        else:
            grant = refused[i]
            result = Result(limit, False, grant.remaining, grant.reset_after,
                            grant.retry_after, outcome=Outcome.WOULD_REJECT
                            if limit.shadow else Outcome.REJECTED)
        results.append(result)
        local.append(result)
    done = tuple(results)
    if blocked:
        retry = max(g.retry_after for g in refused.values() if not g.limit.shadow)
        decision = Decision(allowed=False, results=done, retry_after=max(1, math.ceil(retry)))
        return decision, decision  # answered here whole
    if stored is not None:
        decision = Decision(allowed=admitted, results=done, retry_after=stored.retry_after,
                            delay=stored.delay, version=stored.version, token=stored.token)
    else:
        decision = Decision(allowed=True, results=done)
    return decision, Decision(allowed=admitted, results=tuple(local))
