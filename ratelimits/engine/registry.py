"""Every algorithm, declared once: its key code, its Lua file, its Python functions and
the facts the rest of the engine (and the app) asks about it.

A new algorithm is four files: its `lua/<name>.lua`, its `check`/`commit`/`refund` in
`algorithms.py`, one entry below, and its conformance rows (no migration: the model's
field takes its choices from here). Every list, set and dispatch elsewhere derives from
`REGISTRY`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratelimits.engine import algorithms as a

if TYPE_CHECKING:
    from ratelimits.engine.types import Limit


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One algorithm and its facts."""

    name: str
    #: Short suffix of its keys (memory per idle key matters at scale).
    code: str
    #: Its file in `ratelimits/engine/lua/` (a check body and a commit body).
    lua: str
    check: a.CheckFn
    commit: a.CommitFn
    #: Takes a charge back in process (Redis Cluster's refund is its Lua `--[[refund]]`).
    refund: a.RefundFn
    #: Takes a `burst`: a bucket's capacity, or (with `delays`) a queue's length.
    has_burst: bool = False
    #: The burst when none is set: None means the limit.
    default_burst: int | None = None
    #: Admits a request early with a delay until its turn, up to `burst` queued.
    delays: bool = False
    #: Stores one member per admitted unit named by the request's token (Redis sorted sets).
    stores_members: bool = False
    #: Holds its units while the request runs: `release()` frees them after the response.
    holds_slots: bool = False
    #: Keeps a count per client and aligned window, in Redis as a field of a hash shared
    #: by a shard of the policy's clients (`keynames.base_key`): its Lua bodies read and
    #: write field `f` of `<key>:<window>`; `reset()` clears the current and previous
    #: windows.
    windowed: bool = False
    #: A window algorithm whose check reads the previous window's count beside the
    #: current one's (so a call declares both window hashes, see `keynames.reached_keys`).
    reads_previous: bool = False
    #: Can be replayed from an access log (a log does not say how long a request ran).
    replayable: bool = True
    #: A process may take `batch` units ahead and spend them locally (a lease) without
    #: admitting more than the limit: true where a unit charged early counts exactly as
    #: one charged when spent, i.e. counts per aligned window with the lease ending at
    #: the window's end. A refilling bucket, GCRA or a log would forget an early charge
    #: sooner than the spend it stands for, and admit more than the limit.
    leasable: bool = False
    #: Can promise a future turn (`max_wait`): its state is a time or a level that a
    #: charge moves ahead, so a request admitted early is a turn reserved, never an extra.
    reserves: bool = False
    #: Takes a `warmup` (a cold client starts at a third of the rate, without burst).
    warms: bool = False
    #: Decided in each process by a limit learnt from latency (`adaptive.AdaptiveEngine`),
    #: never by a store: no Lua (`lua` is empty), no stored state, a `floor`.
    learned: bool = False
    #: A charge taken back later is exact only while the units it charged could not have
    #: been released meanwhile (`refund_within`): a later request may restart the
    #: state (GCRA's arrival time) from its own, and a late refund would then free units
    #: never charged. False: a refund is exact whenever it comes.
    refund_horizon: bool = False
    #: What operators call it, when more than its name with spaces.
    called: str = ""

    @property
    def label(self) -> str:
        """How people read the name: "sliding window"."""
        return self.called or self.name.replace("_", " ")

    @property
    def burst_word(self) -> str:
        """What its burst is called to an operator: "queue" or "burst"."""
        return "queue" if self.delays else "burst"

    def refund_within(self, limit: Limit) -> float | None:
        """Seconds after its charge during which a refund of `limit` is exact (what its
        units take to be released); None: always (see `refund_horizon`)."""
        if not self.refund_horizon:
            return None
        return limit.cost * limit.period / limit.limit

    def burst_of(self, limit: Limit) -> int:
        """The burst the algorithm computes with: the one set, else its default."""
        if limit.burst is not None:
            return limit.burst
        return limit.limit if self.default_burst is None else self.default_burst

    def queue_within(self, limit: Limit, seconds: float) -> int:
        """The longest queue (a `delays` algorithm's burst) whose last request waits at
        most `seconds`: each place ahead is one outflow interval, period / limit."""
        return math.floor(seconds * limit.limit / limit.period + 1e-9)

    def capacity(self, limit: Limit) -> int:
        """Units one client may consume at once.

        `burst` for the buckets; a queueing algorithm always lets one request through an
        empty queue, so its capacity is at least `limit`; otherwise `limit`.
        """
        if not self.has_burst:
            return limit.limit
        burst = self.burst_of(limit)
        return max(burst, limit.limit) if self.delays else burst


REGISTRY: dict[str, Algorithm] = {
    entry.name: entry
    for entry in (
        Algorithm("fixed_window", "fw", "fixed_window.lua",
                  a.fixed_window_check, a.fixed_window_commit, a.count_refund,
                  windowed=True, leasable=True),
        Algorithm("sliding_window", "sw", "sliding_window.lua",
                  a.sliding_window_check, a.sliding_window_commit, a.count_refund,
                  windowed=True, reads_previous=True, leasable=True),
        Algorithm("sliding_log", "sl", "sliding_log.lua",
                  a.sliding_log_check, a.sliding_log_commit, a.sliding_log_refund,
                  stores_members=True),
        Algorithm("token_bucket", "tb", "token_bucket.lua",
                  a.token_bucket_check, a.state_commit, a.token_bucket_refund,
                  has_burst=True, reserves=True, warms=True),
        Algorithm("leaky_bucket", "lb", "leaky_bucket.lua",
                  a.leaky_bucket_check, a.state_commit, a.tat_refund, has_burst=True,
                  default_burst=0, delays=True, reserves=True),
        Algorithm("gcra", "g", "gcra.lua", a.gcra_check, a.state_commit, a.tat_refund,
                  has_burst=True, reserves=True, warms=True, refund_horizon=True),
        Algorithm("concurrency", "c", "concurrency.lua",
                  a.concurrency_check, a.concurrency_commit, a.concurrency_refund,
                  stores_members=True, holds_slots=True, replayable=False),
        Algorithm("adaptive", "ad", "", a.learned_check, a.learned_commit, a.learned_refund,
                  holds_slots=True, replayable=False, learned=True,
                  called="adaptive concurrency"),
    )
}

#: The names of the algorithms a store engine decides, in the order operators see them.
ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if not e.learned)
#: Those each process learns alone (see `Algorithm.learned`).
LEARNED_ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.learned)
#: Those that take a `burst`.
BURST_ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.has_burst)
#: Those that take a `batch` (see `Algorithm.leasable`).
LEASABLE_ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.leasable)
#: Those that take a `max_wait` (see `Algorithm.reserves`).
WAITING_ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.reserves)
#: Those that take a `warmup`.
WARMUP_ALGORITHMS: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.warms)


def algorithm(name: str) -> Algorithm:
    """The entry of `name`, or a ValueError that lists the choices."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(REGISTRY)}")
    return entry
