"""Outcomes counted in process and sent to the store's counters at most a second later.

Every decision is counted here, in memory, not by the script that decides it: a
`HINCRBY` per policy per request cost the script more than the decision itself, and the
decisions a cluster makes per slot (a slot's script may not touch the counters' keys) or
the process answers by itself (`local_first`: a remembered refusal, a leased unit) never
reach a script anyway. The counts of one policy and minute add up in one entry, so a
busy process sends one increment per policy and outcome a second, however many requests
it served. An engine whose call can carry them takes them (`take`) once they are `due()`
(half of `FLUSH_EVERY` old) and sends them with that call, at no extra round trip;
otherwise the tally hands them to its engine's `send` `FLUSH_EVERY` seconds after the
first one, from a background thread, so a request never waits for it and a process that
goes quiet still sends its last counts. A failed send puts the counts back for the next
one.

What waits stays bounded however long the store is away (an outage, or refusals of
rotating clients between two flushes): each policy-hour keeps at most `OFFENDERS_CAP`
offenders, ranked as the store ranks them (Space-Saving: a newcomer to a full list takes
the place of the least refused and inherits its count as its error, and only what a
client certainly earned, count less error, is sent, so rotating keys inflate nobody);
and counts older than the store keeps them are dropped. Nor is what waits ever sent in
one huge call: a decision call carries at most `CARRY_MOST` counts, a flush sends
`SEND_MOST` per round trip, both a few milliseconds of the server's time, well within a
socket timeout; and after a send failed no call carries counts for `every` seconds,
so a store that fails them never makes the requests slow.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from ratelimits.engine.constants import (
    OFFENDER_CHARS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    US,
)
from ratelimits.engine.errors import EngineError
from ratelimits.engine.types import Decision, Outcome

__all__ = ["CARRY_MOST", "FLUSH_EVERY", "SEND_MOST", "Counts", "Tally", "discard_all"]

#: Tallied counters and offenders reach the store at most this late (seconds).
FLUSH_EVERY = 1.0
#: Counts (a counter's field, an offender) a decision call carries at most, and a flush
#: sends per round trip at most. An offender costs the server a few microseconds: a
#: carried slice adds about a millisecond to its call, a flush's round trip some ten.
CARRY_MOST = 200
SEND_MOST = 2_000

#: (policy name, minute) -> counter field -> n, or (policy name, hour) -> who -> n.
Counts = dict[tuple[str, int], dict[str, int]]
#: Sends counters and offenders to the store, emptying each mapping it delivered (what
#: is left is put back for the next flush); raises EngineError when it cannot.
Send = Callable[[Counts, Counts], None]

_REFUSED = (Outcome.REJECTED.value, Outcome.WOULD_REJECT.value)
_MINUTE_US, _HOUR_US = 60 * US, 3600 * US
#: How old (minutes, hours) a count may be before the store would no longer keep it.
_MINUTES_KEPT = STATS_TTL // 60
_HOURS_KEPT = OFFENDERS_TTL // 3600


class Tally:
    """Counts decided outside the store's script, flushed by `send`. Thread-safe."""

    def __init__(self, send: Send, every: float = FLUSH_EVERY) -> None:
        self._send = send
        self.every = every
        self._lock = threading.Lock()
        self._counts: Counts = {}
        #: each policy-hour's offenders (counts with what they inherited), and the
        #: inherited part: their errors (only for those that have one)
        self._offenders: Counts = {}
        self._errors: Counts = {}
        self._flushing = False
        #: Held from taking the counts to sending them, so `discard()` returns only once
        #: a flush in the background thread has delivered what it took.
        self._sending = threading.Lock()
        self._first = 0.0  # monotonic time of the oldest count not yet taken
        self._quiet_until = 0.0  # after a failed send: no call carries counts until then
        #: no call need carry counts before this monotonic time (a call made sooner need
        #: not ask `due()`; one made later asks it)
        self.due_at = math.inf
        self._closing = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        atexit.register(_close_at_exit, weakref.ref(self))
        _tallies.add(self)

    def add(self, decision: Decision, now_us: int) -> None:
        """Count each named limit's outcome in `decision`, made at `now_us` (µs)."""
        minute = int(now_us // _MINUTE_US)
        with self._lock:
            if not (self._counts or self._offenders):
                self._starting()
            mine = self._counts
            for result in decision.results:
                name = result.limit.name
                if not name:
                    continue
                field = result.outcome._value_  # the plain str: `.value` is a property
                try:
                    counts = mine[name, minute]
                except KeyError:
                    counts = mine[name, minute] = {}
                try:
                    counts[field] += 1
                except KeyError:
                    counts[field] = 1
                if field in _REFUSED:
                    hour, who = (name, int(now_us // _HOUR_US)), result.limit.key[:OFFENDER_CHARS]
                    try:  # an offender counted already this hour: the usual refusal
                        self._offenders[hour][who] += 1
                    except KeyError:
                        self._offend(hour, who, 1)
            schedule = not self._flushing  # one flush pending at a time (`_schedule`)
            self._flushing = True
        if schedule:
            self._executor().submit(self._flush_quietly, self.every)

    def add_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add `fields` (counter field -> n) to policy `name`'s counters of the minute of
        `now_us`: figures beside the outcomes, such as an adaptive limit's samples."""
        minute = math.floor(now_us / (60 * US))
        with self._lock:
            self._starting()
            counts = self._counts.setdefault((name, minute), {})
            for field, n in fields.items():
                counts[field] = counts.get(field, 0) + n
            schedule = self._schedule()
        if schedule:
            self._executor().submit(self._flush_quietly, self.every)

    def _offend(self, key: tuple[str, int], who: str, n: int) -> None:
        """Add `n` refusals of `who` to one policy-hour's offenders (the lock held), as
        the store's `offend()` (lua/prelude.lua) does: at most `OFFENDERS_CAP` of them."""
        top = self._offenders.setdefault(key, {})
        if who in top:
            top[who] += n
            return
        floor = 0
        if len(top) >= OFFENDERS_CAP:
            evicted = min(top, key=top.__getitem__)
            floor = top.pop(evicted)
            errors = self._errors.get(key)
            if errors is not None:
                errors.pop(evicted, None)
        top[who] = floor + n
        if floor:
            self._errors.setdefault(key, {})[who] = floor

    def _starting(self) -> None:
        """Before counting (the lock held): the first count starts the clock of `due()`."""
        if not self._counts and not self._offenders:
            self._first = time.monotonic()
            self.due_at = max(self._first + self.every / 2, self._quiet_until)

    def _forked(self) -> None:
        """In a forked child: it starts empty (the parent sends its own counts), with
        locks of its own (a thread of the parent may have held them)."""
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        self._counts, self._offenders, self._errors = {}, {}, {}
        self._flushing, self._quiet_until, self.due_at = False, 0.0, math.inf

    def _schedule(self) -> bool:
        """Whether to schedule a flush (the lock held). One flush is pending at a time,
        `every` after the first count it will send: a call made meanwhile may carry
        them instead, and a process that goes quiet still sends its last counts."""
        if self._flushing:
            return False
        self._flushing = True
        return True

    def pending(self) -> bool:
        """Whether anything waits to be sent."""
        with self._lock:
            return bool(self._counts or self._offenders)

    def __len__(self) -> int:
        """How many counts wait to be sent: counter fields and offenders."""
        with self._lock:
            return sum(map(len, self._counts.values())) + sum(map(len, self._offenders.values()))

    def due(self) -> bool:
        """Whether a call should carry the counts now: some are half `every` old, and no
        send failed within `every`. A busy process so sends them about twice a second,
        on calls it makes anyway."""
        with self._lock:
            now = time.monotonic()
            return bool(self._counts or self._offenders) and \
                now - self._first >= self.every / 2 and now >= self._quiet_until

    def take(self, most: int = CARRY_MOST) -> tuple[Counts, Counts]:
        """The oldest tallied counts, about `most` of them (whole policy-minutes and
        policy-hours), for a call that sends them; `restore()` them if the call fails.
        Offenders come as the refusals each certainly had (count less error)."""
        with self._lock:
            counts: Counts = {}
            offenders: Counts = {}
            budget = most
            while self._counts and budget > 0:
                key = next(iter(self._counts))
                fields = counts[key] = self._counts.pop(key)
                budget -= len(fields)
            while self._offenders and budget > 0:
                key = next(iter(self._offenders))
                top = self._offenders.pop(key)
                errors = self._errors.pop(key, {})
                sure = {who: n - errors.get(who, 0) for who, n in top.items()
                        if n > errors.get(who, 0)}
                if sure:
                    offenders[key] = sure
                budget -= len(top)
        return counts, offenders

    def restore(self, counts: Counts, offenders: Counts) -> None:
        """Put back what `take()` returned and could not be sent; no call carries counts
        for `every` seconds then (the background flush tries again)."""
        self._restore(counts, offenders)

    def flush(self) -> None:
        """Send what is tallied now, `SEND_MOST` counts per round trip. On failure what
        was not sent stays tallied and EngineError is raised."""
        with self._sending:
            try:
                # what is tallied now, and no more: counts that keep arriving wait for
                # the next flush, so that this one ends
                rounds = 1 + len(self) // SEND_MOST
                for _ in range(rounds):
                    counts, offenders = self.take(SEND_MOST)
                    if not counts and not offenders:
                        break
                    try:
                        self._send(counts, offenders)
                    except EngineError:
                        self._restore(counts, offenders)
                        raise
            finally:
                self._flushing = False

    def discard(self) -> None:
        """Drop what is tallied and not sent yet (a send in progress ends first)."""
        with self._sending, self._lock:
            self._counts, self._offenders, self._errors = {}, {}, {}

    def close(self) -> None:
        """Flush what is tallied and stop the background thread (also run at exit)."""
        self._closing.set()
        with contextlib.suppress(Exception):  # closing (often at exit) never raises
            self.flush()
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=True)

    def _flush_quietly(self, wait: float = 0.0) -> None:
        if wait:
            self._closing.wait(wait)  # close() cuts the wait short and flushes
        with contextlib.suppress(Exception):  # what failed is put back, sent below
            self.flush()
        if self._closing.is_set():
            return
        # counts tallied while this flush sent (no flush was scheduled for them: one was
        # running), or put back by its failure: sent `every` later, whether or not a
        # decision comes to carry them (the last of a burst has none after it)
        with self._lock:
            again = not self._flushing and bool(self._counts or self._offenders)
            self._flushing = self._flushing or again
        if again:
            self._executor().submit(self._flush_quietly, self.every)

    def _restore(self, counts: Counts, offenders: Counts) -> None:
        with self._lock:
            self._quiet_until = time.monotonic() + self.every
            if not self._counts and not self._offenders:
                self._first = time.monotonic()
            self.due_at = max(self._first + self.every / 2, self._quiet_until)
            for key, fields in counts.items():
                mine = self._counts.setdefault(key, {})
                for field, n in fields.items():
                    mine[field] = mine.get(field, 0) + n
            for key, whos in offenders.items():
                for who, n in whos.items():
                    self._offend(key, who, n)
            self._drop_expired()

    def _drop_expired(self) -> None:
        """Drop the counts the store would no longer keep (the lock held): those older
        than `STATS_TTL`, offenders older than `OFFENDERS_TTL`, by the newest tallied."""
        if self._counts:
            newest = max(minute for _, minute in self._counts)
            for key in [k for k in self._counts if k[1] < newest - _MINUTES_KEPT]:
                del self._counts[key]
        if self._offenders:
            newest = max(hour for _, hour in self._offenders)
            for key in [k for k in self._offenders if k[1] < newest - _HOURS_KEPT]:
                del self._offenders[key]
                self._errors.pop(key, None)

    def _executor(self) -> ThreadPoolExecutor:
        # the flush runs beside requests, not in front of one; threads do not survive fork
        if self._pool is None or self._pool_pid != os.getpid():
            with self._lock:
                if self._pool is None or self._pool_pid != os.getpid():
                    self._pool = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="ratelimits-tally")
                    self._pool_pid = os.getpid()
        return self._pool


#: Every tally of this process that is still referenced (`discard_all`).
_tallies: weakref.WeakSet[Tally] = weakref.WeakSet()


def discard_all() -> None:
    """Drop every tally's unsent counts, after any send in progress has ended: from here
    on, nothing counted so far reaches a store. For a test suite that empties its
    database between tests; a process that means to keep its counts closes its engines."""
    for tally in list(_tallies):
        tally.discard()


def _forked() -> None:
    for tally in list(_tallies):
        tally._forked()


os.register_at_fork(after_in_child=_forked)


def _close_at_exit(ref: weakref.ref[Tally]) -> None:
    tally = ref()
    if tally is not None:
        tally.close()
