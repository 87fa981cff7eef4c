"""The concurrency watchdog: a slot lives as long as its request, not just `period`.

A `concurrency` slot is stored with an expiry of `period` so that a crashed worker's
slots come back by themselves. A request that runs longer than `period` must not lose
its slot meanwhile (that let 4 five-second requests run under a limit of 2 with a period
of 2). So, per process, one daemon thread renews the slots of every request in flight,
every third of the shortest period among them, in one engine call per engine, and stops
renewing a request's slots when it releases them. The thread starts with the first slot
held: a process without concurrency policies never has one. An engine whose slots last
until released (`Holder.slots_expire` False: the adaptive one) is not renewed.

A release that failed (the store out of reach, or its circuit open) leaves slots held
that no request will free: a 3 s pause once cut a limit to a third of its capacity for a
whole period. So the thread also tries such releases again, every `RETRY_EVERY` seconds,
until the store takes them or their slots have expired by themselves (`period` after
the last renewal); a retry goes through the store's circuit breaker like any call, so
it costs nothing while the circuit is open and is the probe that closes it once the
cool-down is over. A decision that timed out is released the same way: the paused store
runs it as it resumes, and its slots, whose token only this process knows, would
otherwise hold the limit for a whole period (a 3 s pause once took a limit of 3 to zero
for 27 s).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Sequence

from ratelimits import runtime
from ratelimits.engine.interfaces import Holder
from ratelimits.engine.types import Decision
from ratelimits.pipeline.state import RequestState

logger = logging.getLogger("ratelimits")

#: Seconds between two tries of the releases that failed.
RETRY_EVERY = 0.5
#: Failed releases kept at most (the oldest go first: their slots expire by themselves).
MAX_UNRELEASED = 10_000


def _period(decision: Decision) -> float:
    return min(
        (r.limit.period for r in decision.results if r.limit.spec.holds_slots),
        default=60.0,
    )


class Watchdog:
    """Renews the concurrency slots of in-flight requests until they are released."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: dict[int, tuple[Holder, Decision]] = {}  # id(decision) -> both
        self._interval = 0.0  # how long the thread is waiting now (0: idle or none)
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._generation = 0
        self._failing = False
        #: Releases that failed: (engine, decision, when its slots expire by themselves).
        self._unreleased: list[tuple[Holder, Decision, float]] = []
        self._unreleased_told = False
        #: A release failed since the store last answered: the next answer (`answered()`)
        #: has the thread try again at once, not at its next round.
        self.owed = False

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def in_flight(self) -> int:
        """How many held decisions are being renewed."""
        with self._cond:
            return len(self._held)

    def hold(self, engine: Holder, decision: Decision) -> None:
        """Renew `decision`'s slots until `drop()` (when they expire unless renewed)."""
        if not engine.slots_expire:
            return
        interval = _period(decision) / 3
        with self._cond:
            self._held[id(decision)] = (engine, decision)
            if self._thread is None or self._pid != os.getpid():  # none yet, or forked
                self._start()
            elif self._interval == 0.0 or interval < self._interval:
                self._cond.notify()  # idle, or waiting longer than this slot allows

    def drop(self, decision: Decision) -> None:
        """Stop renewing `decision`'s slots (the request released them)."""
        with self._cond:
            self._held.pop(id(decision), None)

    def unreleased(self) -> int:
        """How many failed releases wait to be tried again."""
        with self._cond:
            return len(self._unreleased)

    def release_later(self, engine: Holder, decision: Decision, exc: Exception) -> None:
        """`engine.release(decision)` failed with `exc`: try it again until the store takes
        it (logged once per outage; the request goes on either way)."""
        self._later(engine, decision, exc, runtime.clock().monotonic() + _period(decision))

    def release_taken(self, engine: Holder, decision: Decision, exc: Exception) -> None:
        """The call that would take `decision`'s slots failed with `exc` after it was sent
        (`EngineError.taken`): a paused store runs it when it resumes, a `period` before
        those slots expire, and nobody else knows their token. Release them as soon as the
        store answers, however long the outage lasts (a release of slots never taken
        frees nothing)."""
        self._later(engine, decision, exc, math.inf)

    def _later(self, engine: Holder, decision: Decision, exc: Exception, until: float) -> None:
        with self._cond:
            if len(self._unreleased) >= MAX_UNRELEASED:
                del self._unreleased[0]
            self._unreleased.append((engine, decision, until))
            self.owed = True
            told, self._unreleased_told = self._unreleased_told, True
            if self._thread is None or self._pid != os.getpid():
                self._start()
            elif self._interval == 0.0 or self._interval > RETRY_EVERY:
                self._cond.notify()  # idle, or waiting longer than a retry may
        if not told:
            logger.warning(
                "ratelimits: could not release concurrency slots (%s); trying again every "
                "%s s until the store answers (logged once per outage)", exc, RETRY_EVERY)

    def answered(self) -> None:
        """The store answered a request's call after releases failed (`owed`): the
        thread tries them now. Its round comes every `RETRY_EVERY` seconds anyway; this
        saves that wait when an outage ends. Only a new failure sets `owed` again: a
        retry that fails keeps its pace, and requests never drive the thread faster."""
        with self._cond:
            if self.owed and self._unreleased:
                self._cond.notify()
            self.owed = False

    def stop(self) -> None:
        """Forget every held decision and end the thread (tests, settings changes)."""
        with self._cond:
            self._held.clear()
            self._generation += 1
            self._thread = None
            self._interval = 0.0
            self._failing = False
            self._unreleased.clear()
            self._unreleased_told = False
            self.owed = False
            self._cond.notify_all()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._generation += 1
        self._thread = threading.Thread(
            target=self._run, args=(self._generation,), name="ratelimits-watchdog", daemon=True
        )
        self._thread.start()

    def _run(self, generation: int) -> None:
        while True:
            with self._cond:
                while not self._held and not self._unreleased and \
                        self._generation == generation:
                    self._interval = 0.0
                    self._cond.wait()
                if self._generation != generation:
                    return
                self._interval = self._next_wait()
                self._cond.wait(self._interval)
                if self._generation != generation:
                    return
                by_engine: dict[int, tuple[Holder, list[Decision]]] = {}
                for engine, decision in self._held.values():
                    by_engine.setdefault(id(engine), (engine, []))[1].append(decision)
                retried, self._unreleased = self._unreleased, []
            # outside the lock: requests hold and drop while the store answers
            for engine, decisions in by_engine.values():
                self._renew(engine, decisions)
            self._release_again(retried, generation)

    def _next_wait(self) -> float:
        """Seconds until the next round: a third of the shortest period held, or sooner
        when failed releases wait (called under the lock)."""
        wait = min((_period(d) for _, d in self._held.values()), default=3 * RETRY_EVERY) / 3
        return min(wait, RETRY_EVERY) if self._unreleased else wait

    def _release_again(self, retried: list[tuple[Holder, Decision, float]],
                       generation: int) -> None:
        """Try the failed releases again; keep those the store still refuses (not those
        whose slots have expired meanwhile: nothing is left to free)."""
        if not retried:
            return
        now = runtime.clock().monotonic()
        left: list[tuple[Holder, Decision, float]] = []
        down: set[int] = set()  # an engine that failed now is not asked again this round
        for engine, decision, until in retried:
            if until <= now:
                continue
            if id(engine) not in down:
                try:
                    engine.release(decision)
                    continue
                except Exception:
                    down.add(id(engine))
            left.append((engine, decision, until))
        with self._cond:
            if self._generation != generation:
                return  # forgotten meanwhile (`stop()`)
            self._unreleased[:0] = left
            if not self._unreleased:
                self._unreleased_told = False  # the outage is over: log the next one

    def _renew(self, engine: Holder, decisions: Sequence[Decision]) -> None:
        try:
            engine.renew(decisions)
        except Exception as exc:  # never a request's problem: its slot may expire early
            if not self._failing:
                self._failing = True
                logger.error(
                    "ratelimits: could not renew concurrency slots (%s); they expire after "
                    "their period until renewing works again (logged once)",
                    exc,
                )
        else:
            self._failing = False


watchdog = Watchdog()
runtime.on_reset(watchdog.stop)


def hold(state: RequestState, engine: Holder, decision: Decision) -> None:
    """A request holds concurrency slots: keep them until it releases them."""
    state.holds = [*state.holds, (engine, decision)]
    watchdog.hold(engine, decision)
