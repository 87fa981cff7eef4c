"""Value types shared by every engine backend: what to check and what was decided."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ratelimits.engine.algorithms import member
from ratelimits.engine.calendar import CALENDARS, check_zone
from ratelimits.engine.records import quick_init
from ratelimits.engine.registry import (
    BURST_ALGORITHMS,
    LEARNED_ALGORITHMS,
    LEASABLE_ALGORITHMS,
    REGISTRY,
    WAITING_ALGORITHMS,
    WARMUP_ALGORITHMS,
    Algorithm,
)

#: `Limit.stage`: check and charge at once (the default); check and charge at once a
#: charge that the response may take back (a reservation); that charge taken back.
CHARGE, RESERVE, REFUND = 0, 1, 2
STAGES = (CHARGE, RESERVE, REFUND)
#: The longest `Limit.lockout` (seconds): 30 days. A lockout is a pause for a guessing
#: machine, held in the store; a client to be kept out for longer belongs in a firewall
#: or on its account, where someone can see it and lift it.
MAX_LOCKOUT = 30 * 86400

#: The algorithms a limit of cost 0 reads without changing: `Result.remaining` is what
#: is left, and nothing is taken (django-ratelimit's `increment=False`).
PEEKABLE_ALGORITHMS = ("fixed_window",)

#: Why the other algorithms take no batch (shown to operators).
_NO_LEASE = (
    "units taken ahead count from when they were taken, and a bucket, GCRA or a log "
    "would let them go (refill, expire) before they are spent, admitting more than the "
    "limit; a window's count keeps them until the window ends, and so does the lease"
)


@quick_init
@dataclass(frozen=True, slots=True)
class Limit:
    """One rate limit to check for one client.

    `name` identifies the policy (it namespaces the stored state and the per-minute
    counters); `key` identifies the client within it (IP, user id, header value ...).
    Both are hashed into fixed-length key parts, so any content and length is safe.
    `batch`: units a process may take from the store at once and spend locally (a lease;
    None: every request goes to the store); only for `LEASABLE_ALGORITHMS`.
    `max_wait`: seconds a request may wait for its turn: one whose turn comes within it
    is admitted now, charged, with `Result.delay` saying how long to wait (a
    reservation); only for `WAITING_ALGORITHMS`. `warmup`: seconds of use over which a
    cold client's rate rises from a third of the limit to all of it, without burst
    meanwhile (Guava's SmoothWarmingUp); only for `WARMUP_ALGORITHMS`. `floor`: the
    fewest requests in flight an adaptive limit ever allows (None: 1); only for
    `LEARNED_ALGORITHMS`, whose `limit` is the most it ever allows and `period` the
    seconds between its probes (see `adaptive`).

    `lockout`: seconds a client this limit refuses stays refused, whatever its count
    does meanwhile (0: none). `stage`: `CHARGE` (check, and charge if the call is
    admitted), `RESERVE` (the same, the charge being a reservation: a request in flight
    counts against the limit, and the caller takes it back with a `REFUND` call if the
    response is not one to charge) or `REFUND` (take back the units a `RESERVE` call
    charged; the call's time must be the reservation's, `Decision.reserved_at`; never
    refuses the call).
    `calendar`: `day`, `week` or `month` (fixed window only): windows of the calendar
    of `zone`, instead of `period`-long ones (see `calendar`).
    """

    key: str
    algorithm: str
    limit: int
    period: float
    burst: int | None = None
    cost: int = 1
    shadow: bool = False
    name: str = ""
    batch: int | None = None
    max_wait: float = 0.0
    warmup: float = 0.0
    floor: int | None = None
    lockout: float = 0.0
    stage: int = CHARGE
    calendar: str = ""
    zone: str = "UTC"

    def __post_init__(self) -> None:
        if self.algorithm not in REGISTRY:
            raise ValueError(
                f"unknown algorithm {self.algorithm!r}; choose one of {', '.join(REGISTRY)}"
            )
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit <= 0:
            raise ValueError(f"limit must be a positive integer, got {self.limit!r}")
        if not self.period > 0:
            raise ValueError(f"period must be a positive number of seconds, got {self.period!r}")
        if not isinstance(self.cost, int) or isinstance(self.cost, bool) or self.cost < 0:
            raise ValueError(f"cost must be an integer of at least 1, got {self.cost!r}")
        # cost 0 reads a window's count without taking from it (a peek): only a plain
        # count stays unchanged by it; a log, a bucket or a slot would record the call
        if self.cost == 0 and self.algorithm not in PEEKABLE_ALGORITHMS:
            raise ValueError(f"cost must be an integer of at least 1, got {self.cost!r} "
                             f"(cost 0, a read, applies only to {', '.join(PEEKABLE_ALGORITHMS)})")
        if self.burst is not None:
            if not self.spec.has_burst:
                raise ValueError(
                    f"burst applies only to {', '.join(sorted(BURST_ALGORITHMS))}, "
                    f"not to {self.algorithm}"
                )
            if not isinstance(self.burst, int) or isinstance(self.burst, bool) or self.burst < 0:
                raise ValueError(f"burst must be a non-negative integer, got {self.burst!r}")
        self._check_batch()
        self._check_waits()
        self._check_floor()
        self._check_counting()
        if self.cost > self.capacity:
            raise ValueError(
                f"cost {self.cost} exceeds the capacity {self.capacity} of this limit: "
                "no request could ever pass; lower the cost or raise the limit/burst"
            )

    def _check_batch(self) -> None:
        if self.batch is None:
            return
        if not self.spec.leasable:
            raise ValueError(
                f"batch applies only to {' and '.join(LEASABLE_ALGORITHMS)}, not to "
                f"{self.algorithm}: {_NO_LEASE}"
            )
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or not (
            self.cost <= self.batch <= self.limit
        ):
            raise ValueError(
                f"batch must be an integer from the cost ({self.cost}) to the limit "
                f"({self.limit}), got {self.batch!r}"
            )

    def _check_waits(self) -> None:
        for name, allowed, what in (
            ("max_wait", self.spec.reserves, WAITING_ALGORITHMS),
            ("warmup", self.spec.warms, WARMUP_ALGORITHMS),
        ):
            seconds = getattr(self, name)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                0 <= seconds < math.inf
            ):
                raise ValueError(f"{name} must be a number of seconds of at least 0, "
                                 f"got {seconds!r}")
            if seconds and not allowed:
                raise ValueError(f"{name} applies only to {', '.join(what)}, not to "
                                 f"{self.algorithm}")

    def _check_floor(self) -> None:
        if not self.spec.learned:
            if self.floor is not None:
                raise ValueError(f"floor applies only to {', '.join(LEARNED_ALGORITHMS)}, "
                                 f"not to {self.algorithm}")
            return
        if self.cost != 1:
            raise ValueError(f"cost must be 1 for {self.algorithm}: it counts requests in "
                             f"flight, got {self.cost!r}")
        if self.floor is not None and (
            not isinstance(self.floor, int) or isinstance(self.floor, bool)
            or not 1 <= self.floor <= self.limit
        ):
            raise ValueError(f"floor must be an integer from 1 to the limit ({self.limit}), "
                             f"got {self.floor!r}")
        if self.period < 2:
            raise ValueError(f"period must be at least 2 seconds for {self.algorithm} (it "
                             f"is the time between probes, each of 1 second), got "
                             f"{self.period!r}")

    def _check_counting(self) -> None:
        lockout = self.lockout
        if isinstance(lockout, bool) or not isinstance(lockout, (int, float)) or not (
            0 <= lockout < math.inf
        ):
            raise ValueError(f"lockout must be a number of seconds of at least 0, "
                             f"got {lockout!r}")
        if lockout > MAX_LOCKOUT:
            raise ValueError(f"lockout must be at most {MAX_LOCKOUT} seconds (30 days), got "
                             f"{lockout:g}; keep a client out for longer in your firewall "
                             "or by disabling its account")
        spec = self.spec
        if lockout and (spec.learned or self.batch is not None):
            raise ValueError("lockout applies to a limit decided by the store for each "
                             "request: not to an adaptive limit, nor with a batch")
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.stage != CHARGE:
            if spec.holds_slots or spec.delays:
                why = "holds a slot while the request runs" if spec.holds_slots else (
                    "queues a request before the view")
                raise ValueError(f"charging after the response applies to a count of "
                                 f"requests, not to {spec.label}: it {why}")
            if self.batch is not None or self.max_wait:
                raise ValueError("charging after the response does not go with a batch or "
                                 "a max_wait: both charge before the view")
        if self.calendar:
            if self.calendar not in CALENDARS:
                raise ValueError(f"calendar must be one of {', '.join(CALENDARS)}, "
                                 f"got {self.calendar!r}")
            if self.algorithm != "fixed_window":
                raise ValueError(
                    f"calendar applies only to fixed_window, not to {self.algorithm}: a "
                    "calendar window resets at its boundary, which only a fixed window "
                    "does")
            check_zone(self.zone)

    @property
    def spec(self) -> Algorithm:
        """This limit's algorithm: its facts and functions (see `registry`)."""
        return REGISTRY[self.algorithm]

    @property
    def capacity(self) -> int:
        """Units one client may consume at once (see `Algorithm.capacity`)."""
        return REGISTRY[self.algorithm].capacity(self)


class Outcome(str, enum.Enum):
    """What one limit did with one request; the value is the per-minute counter's field.

    ADMITTED: passed and charged. REJECTED: this enforced limit refused it. WOULD_REJECT:
    this shadow limit would have refused it. SPARED: this limit admitted it but another
    refused the request, so nothing was charged (or, for a `REFUND` call, its
    reservation was taken back). CHARGED: a reservation kept after the response, which
    named it (a request already counted as ADMITTED: not a request of its own).
    """

    ADMITTED = "a"
    REJECTED = "r"
    WOULD_REJECT = "w"
    SPARED = "o"
    CHARGED = "c"

    @property
    def label(self) -> str:
        """The name metrics and reports use: "admitted", "would_reject" ..."""
        return self.name.lower()


@quick_init
@dataclass(frozen=True, slots=True)
class Result:
    """What one limit said about one request.

    `remaining`: units left after this request; `reset_after`: seconds until the limit
    is fully reset; `retry_after`: seconds until a rejected request could pass (0 when
    allowed); `delay`: seconds an admitted request should wait (leaky bucket only);
    `outcome`: what the limit did, charging included (see `Outcome`).
    """

    limit: Limit
    allowed: bool
    remaining: int
    reset_after: float
    retry_after: float
    delay: float = 0.0
    outcome: Outcome = Outcome.ADMITTED


@quick_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one request against all of its limits."""

    allowed: bool
    results: tuple[Result, ...]
    #: Whole seconds until a refused request could pass (rounded up, at least 1): what
    #: the Retry-After header says. 0 when admitted.
    retry_after: int = 0
    delay: float = 0.0
    #: The policy version stored beside the counters, when the caller asked for it.
    version: int | None = None
    #: Identifies the concurrency slots this request holds, for `engine.release()`.
    token: str | None = field(default=None, compare=False)
    #: When a `RESERVE` limit charged (the store's time, µs): the time a `REFUND` call
    #: of it is made at (None: nothing reserved).
    reserved_us: int | None = field(default=None, compare=False)

    @property
    def reserved_at(self) -> float | None:
        """`reserved_us` in seconds, as `evaluate()` takes a time."""
        return None if self.reserved_us is None else self.reserved_us / 1_000_000

    @property
    def rejected_by(self) -> tuple[Result, ...]:
        """Enforced results that refused the request."""
        return tuple([r for r in self.results if not r.allowed and not r.limit.shadow])

    @property
    def would_reject(self) -> tuple[Result, ...]:
        """Shadow results that would have refused the request."""
        return tuple([r for r in self.results if not r.allowed and r.limit.shadow])

    def holding(self) -> list[tuple[Limit, list[str]]]:
        """The slots this request holds: each holding limit and its members' names (what
        `release()` frees and `renew()` keeps)."""
        token = self.token
        if token is None:
            return []
        return [
            (r.limit, [member(token, unit) for unit in range(1, r.limit.cost + 1)])
            for r in self.results
            if r.limit.spec.holds_slots and r.outcome is Outcome.ADMITTED
        ]
