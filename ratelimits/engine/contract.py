"""The contract between Python and the Lua scripts, Python's side, written once: each
call's arguments encoded and its reply decoded, as `layout` lays them out (the scripts
are generated from the same layout).

`RedisEngine` and the benchmarks in `bench/` encode with `encode()`; every backend turns
its answer into a `Decision` with `assemble()`. The Redis Cluster slot call and its
refund, the renewal of held slots and the leases have their encoders here too, shared by
every engine that sends them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits.engine import constants
from ratelimits.engine.algorithms import LEARNED_ONLY
from ratelimits.engine.calendar import bounds
from ratelimits.engine.errors import CircuitOpen, EngineError
from ratelimits.engine.keynames import (
    base_key,
    cell,
    new_token,
    offender_keys,
    period_us,
    reached_keys,
    stats_key,
    to_us,
)
from ratelimits.engine.layout import (
    CHARGE_FIELDS,
    LEASE_ARGS,
    LEASE_FIELDS,
    LEASE_RESET,
    LIMIT_SPEC,
    REPLY_HEAD,
    RESULT_FIELDS,
    SLOT_HEAD,
)
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.tally import Counts
from ratelimits.engine.types import RESERVE, Decision, Limit, Outcome, Result

US = constants.US

_NO_WINDOW = (0, 0, 0)

_REMAINING, _RESET, _WAIT, _OUTCOME = (
    RESULT_FIELDS.index(f) for f in ("remaining", "reset_after", "wait", "outcome"))
#: The outcomes of a limit that admitted the request (charged or not).
PASSED = frozenset({Outcome.ADMITTED, Outcome.SPARED})
FIELDS = len(RESULT_FIELDS)
_HEAD = len(REPLY_HEAD)
OUTCOMES: dict[str, Outcome] = {o.value: o for o in Outcome}
#: OUTCOMES, read from a reply's field as redis-py gives it (bytes) or as text
_OUTCOME_OF: dict[str | bytes, Outcome] = {
    text: o for field, o in OUTCOMES.items() for text in (field, field.encode())}
_VERSION_AT, _ADMITTED_AT, _NOW_AT = (
    REPLY_HEAD.index("version"), REPLY_HEAD.index("admitted"), REPLY_HEAD.index("now_us"))


def carry(prefix: str, counts: Counts, offenders: Counts) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV tails that carry tallied counts with a batch call
    (`CARRY_ARGS`): the counters' and offenders' keys the script writes, and the counts."""
    keys: list[str] = []
    out: list[Any] = []
    for (name, minute), fields in counts.items():
        keys.append(stats_key(prefix, name, minute))
        for field, n in fields.items():
            out += ("c", name, minute, field, n)
    for (name, hour), whos in offenders.items():
        keys += offender_keys(prefix, name, hour)
        for who, n in whos.items():
            out += ("o", name, hour, who.encode("utf-8", "surrogatepass"), n)
    return keys, out


def encode(
    limits: Sequence[Limit],
    *,
    prefix: str,
    now: float | None = None,
    version_key: str | None = None,
    stats: bool = True,
    token: str | None = None,
) -> tuple[list[str], list[Any], str | None]:
    """KEYS and ARGV of one batch call, and its token (None when no limit stores named
    members): `token` when given (Redis Cluster: one for all the slots of a request),
    else a new one."""
    keys: list[str] = []
    reached: list[str] = []
    fields: list[str] = []
    specs = []
    members = False
    clock = _Clock(now)
    for limit in limits:
        key, field = cell(prefix, limit)
        keys.append(key)
        if field or limit.warmup or limit.lockout:
            reached += reached_keys(prefix, limit, clock.at(), exact=now is not None)
        if field:
            fields.append(field)
        known = _SPECS.get((limit.algorithm, limit.limit, limit.period, limit.burst, limit.cost,
                            limit.shadow, limit.warmup, limit.max_wait, limit.lockout,
                            limit.stage, limit.calendar))
        if known is None:
            known = _spec(limit)
        text, stores = known
        if limit.calendar:
            cal0, cal1, cal2 = clock.window(limit)
            text = f"{text}|{cal0}|{cal1}|{cal2}"
        specs.append(text)
        members = members or stores
    head = _HEADS.get((now is None, members, version_key, prefix, stats))
    if head is None:
        head = _head(now is None, members, version_key, prefix, stats)
    args: list[Any] = [head + specs[0] if len(specs) == 1 else head + "".join(specs)]
    if now is not None:
        args.append(to_us(now))
    if members:
        token = token or new_token()
        args.append(token)
    else:
        token = None
    if fields:
        args += fields
    keys += reached
    if version_key:
        keys.append(version_key)
    return keys, args, token


#: Each limit's `LIMIT_SPEC` text (with its "|" before), and whether it stores named
#: members, by the fields they come from: encoding a call looks its limits up instead of
#: converting each figure again. A calendar limit's text lacks its boundaries (per call).
_SPECS: dict[tuple[Any, ...], tuple[str, bool]] = {}
#: The plans' heads, by (no time given, a token sent, version key, prefix, counters).
_HEADS: dict[tuple[Any, ...], str] = {}
#: Past this many, the caches start afresh (a site has few policies; overrides and
#: rollouts add a few variants each).
_CACHED = 4_096


def _spec(limit: Limit) -> tuple[str, bool]:
    spec = REGISTRY[limit.algorithm]
    if spec.learned:
        raise ValueError(LEARNED_ONLY)
    values = [limit.algorithm, limit.limit, period_us(limit), spec.burst_of(limit), limit.cost,
              1 if limit.shadow else 0, to_us(limit.warmup), to_us(limit.max_wait),
              to_us(limit.lockout), limit.stage]
    if not limit.calendar:
        values += _NO_WINDOW
    assert len(values) == len(LIMIT_SPEC) - (3 if limit.calendar else 0)
    known = "|" + "|".join(map(str, values)), spec.stores_members
    if len(_SPECS) >= _CACHED:
        _SPECS.clear()
    _SPECS[(limit.algorithm, limit.limit, limit.period, limit.burst, limit.cost, limit.shadow,
            limit.warmup, limit.max_wait, limit.lockout, limit.stage, limit.calendar)] = known
    return known


def _head(no_now: bool, members: bool, version_key: str | None, prefix: str,
          stats: bool) -> str:
    texts = (version_key or "", f"{prefix}s:" if stats else "")
    head = "".join(("0" if no_now else "1", "1" if members else "0",
                    *(f"{len(t.encode())}:{t}" for t in texts)))
    if len(_HEADS) >= _CACHED:
        _HEADS.clear()
    _HEADS[(no_now, members, version_key, prefix, stats)] = head
    return head


def decode(
    limits: Sequence[Limit], reply: Sequence[Any], *, versioned: bool, token: str | None
) -> Decision:
    """The batch script's reply as a `Decision`; ValueError when it is not one."""
    if not isinstance(reply, list) or len(reply) != _HEAD + FIELDS * len(limits):
        raise ValueError(f"unexpected reply from the batch script: {reply!r}")
    version = int(reply[_VERSION_AT]) if versioned else None
    admitted = reply[_ADMITTED_AT] == 1
    return assemble(limits, reply, admitted=admitted, version=version, token=token,
                    start=_HEAD, now_us=int(reply[_NOW_AT]))


def assemble(
    limits: Sequence[Limit],
    raw: Sequence[Any],
    *,
    admitted: bool,
    version: int | None,
    token: str | None,
    start: int = 0,
    now_us: int | None = None,
) -> Decision:
    """`raw` holds, from `start`, per limit, the `RESULT_FIELDS` (times in µs; the
    outcome is its counter field: a, r, w or o; see `result_values`); `now_us`: the time
    the store decided at. Both backends end here."""
    results = []
    retry_us = 0
    delay = 0.0
    holds = reserved = False
    o = start
    for limit in limits:
        outcome = _OUTCOME_OF[raw[o + _OUTCOME]]
        wait = raw[o + _WAIT]
        allowed = outcome in PASSED
        # comparisons rather than max(): this runs for every limit of every request
        remaining = int(raw[o + _REMAINING])
        result = Result(limit, allowed, remaining if remaining > 0 else 0, raw[o + _RESET] / US,
                        0.0 if allowed else wait / US, wait / US if allowed else 0.0, outcome)
        results.append(result)
        if not limit.shadow:
            if not allowed:
                if wait > retry_us:
                    retry_us = int(wait)
            elif admitted and result.delay > delay:
                delay = result.delay
        if outcome is Outcome.ADMITTED:
            holds = holds or REGISTRY[limit.algorithm].holds_slots
            reserved = reserved or limit.stage == RESERVE
        o += FIELDS
    return Decision(
        admitted,
        tuple(results),
        0 if admitted else max(1, -(-retry_us // US)),
        delay,
        version,
        token if holds else None,
        now_us if reserved else None,
    )


def note_taken(limits: Sequence[Limit], token: str | None, exc: EngineError) -> None:
    """A call of `limits` under `token` failed with `exc`: note on it the slots the call
    takes if the store runs it anyway (`EngineError.taken`). A call that timed out was
    sent, and a paused server runs it as it resumes; one the breaker stopped was not."""
    if token and not isinstance(exc, CircuitOpen):
        held = tuple(Result(limit, True, 0, 0.0, 0.0, outcome=Outcome.ADMITTED)
                     for limit in limits if REGISTRY[limit.algorithm].holds_slots)
        if held:
            exc.taken = Decision(True, held, token=token)


def result_values(allowed: int, remaining: float, reset_after: float, retry_after: float,
                  delay: float, outcome: str) -> tuple[Any, ...]:
    """One limit's values laid out as `RESULT_FIELDS`, for `assemble()` (times in µs; the
    outcome is its counter field: a or o when `allowed`, else r or w)."""
    return remaining, reset_after, delay if allowed else retry_after, outcome


def spare(raw: list[Any], i: int, cost: int) -> None:
    """Limit `i` of `raw` (laid out for `assemble()`) was charged, then refunded: SPARED,
    with the units it took counted as remaining."""
    o = i * FIELDS
    raw[o + _REMAINING] = int(raw[o + _REMAINING]) + cost
    raw[o + _OUTCOME] = Outcome.SPARED.value


# -- Redis Cluster: one slot's decision (lua/slot.lua) and its refund (lua/refund.lua) -----

_SLOT_PER = FIELDS + len(CHARGE_FIELDS)


@dataclass(frozen=True, slots=True)
class SlotReply:
    """slot.lua's reply: whether the slot admitted, its time (µs), per limit the
    `RESULT_FIELDS` one after another (as `assemble()` takes them) and what its charge
    wrote."""

    admitted: bool
    now_us: int
    results: list[Any]
    writes: list[tuple[Any, Any]]

    def charged(self, j: int, limit: Limit) -> bool:
        """Whether the slot charged its `j`-th limit, `limit`."""
        field = self.results[j * FIELDS + _OUTCOME]
        admitted = (field.decode() if isinstance(field, bytes) else field) == "a"
        return admitted


def decode_slot(reply: Any, n: int) -> SlotReply:
    """slot.lua's reply for `n` limits; ValueError when it is not one."""
    head = len(SLOT_HEAD)
    if not isinstance(reply, list) or len(reply) != head + _SLOT_PER * n:
        raise ValueError(f"unexpected reply from the slot script: {reply!r}")
    results: list[Any] = []
    writes: list[tuple[Any, Any]] = []
    for j in range(n):
        o = head + j * _SLOT_PER
        results += reply[o:o + FIELDS]
        writes.append((reply[o + FIELDS], reply[o + FIELDS + 1]))
    return SlotReply(reply[SLOT_HEAD.index("admitted")] == 1,
                     int(reply[SLOT_HEAD.index("now_us")]), results, writes)


def encode_refund(prefix: str, now_us: int, token: str,
                  charged: Iterable[tuple[Limit, tuple[Any, Any]]]) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one refund call: each charged limit with what its charge wrote."""
    keys: list[str] = []
    windows: list[Any] = []  # the window hashes the charges wrote in, declared after
    args: list[Any] = [now_us, token]
    for limit, (s1, s2) in charged:
        key, field = cell(prefix, limit)
        keys.append(key)
        if field and s1:
            windows.append(s1)
        args += (limit.algorithm, limit.limit, period_us(limit),
                 REGISTRY[limit.algorithm].burst_of(limit), limit.cost, s1, s2, field)
    return [*keys, *windows], args


# -- the policy version bumped (lua/version.lua) -------------------------------------------


def version_args(now: float | None) -> list[Any]:
    """ARGV of a version bump: the time (µs) a lost version restarts from, or nothing:
    the server's clock."""
    return [] if now is None else [to_us(now)]


# -- held slots kept (lua/renew.lua) -------------------------------------------------------


def encode_renew(prefix: str, held: Iterable[tuple[Limit, Sequence[str]]],
                 now: float | None) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one renewal: the time ('' = the server's), then per key its
    period (µs), how many members it keeps and their names."""
    keys: list[str] = []
    args: list[Any] = ["" if now is None else to_us(now)]
    for limit, members in held:
        keys.append(base_key(prefix, limit))
        args += (period_us(limit), len(members), *members)
    return keys, args


def encode_release(prefix: str, held: Iterable[tuple[Limit, Sequence[str]]]
                   ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one release on a cluster's slot (lua/release.lua): per key, how
    many members it frees and their names."""
    keys: list[str] = []
    args: list[Any] = []
    for limit, members in held:
        keys.append(base_key(prefix, limit))
        args += (len(members), *members)
    return keys, args


# -- leases (lua/lease.lua) --------------------------------------------------------------



def encode_lease(
    prefix: str, limits: Sequence[Limit], back: Sequence[Leftover], now: float | None
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one lease call: the give-backs first (so a limit's leftover is
    back before its new grant is counted), then one lease of `batch` units per limit."""
    keys: list[str] = []
    args: list[Any] = ["" if now is None else to_us(now)]
    clock = _Clock(now)
    for item in back:
        key, field = cell(prefix, item.limit)
        keys.append(key)
        args += _lease_args(item.limit, 0, item.window, item.units, field, item.epoch, clock)
    for limit in limits:
        if limit.batch is None:
            raise ValueError(f"limit {limit.name or limit.key!r} has no batch to lease")
        key, field = cell(prefix, limit)
        keys.append(key)
        args += _lease_args(limit, limit.batch, "", 0, field, "", clock)
    return [*keys, *clock.reached(prefix, [*(item.limit for item in back), *limits])], args


def encode_lease_reset(prefix: str, limit: Limit, now: float | None
                       ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the lease call that resets one client under a leased limit: its
    count keeps only the units leases may still spend, and units leased before the reset
    can no longer be given back (see lua/lease.lua)."""
    key, field = cell(prefix, limit)
    clock = _Clock(now)
    return [key, *clock.reached(prefix, [limit])], [
        "" if now is None else to_us(now), *_lease_args(limit, LEASE_RESET, "", 0, field, "",
                                                        clock)]


class _Clock:
    """The caller's time in µs (`now`, else its clock), read once per call and only when
    a calendar window needs it: the windows around it go with the call (`bounds`)."""

    __slots__ = ("now", "us")

    def __init__(self, now: float | None) -> None:
        self.now = now
        self.us: int | None = None

    def at(self) -> int:
        if self.us is None:  # to_us, inline: read on every call of a windowed limit
            self.us = round((time.time() if self.now is None else self.now) * US)
        return self.us

    def window(self, limit: Limit) -> tuple[int, int, int]:
        if not limit.calendar:
            return _NO_WINDOW
        return bounds(limit.calendar, limit.zone, self.at())

    def reached(self, prefix: str, limits: Iterable[Limit]) -> list[str]:
        """The window hashes the lease script may touch for `limits` (declared in KEYS
        after their base keys, see `keynames.reached_keys`)."""
        out: list[str] = []
        for limit in limits:
            out += reached_keys(prefix, limit, self.at(), exact=self.now is not None,
                                lease=True)
        return out


def _lease_args(limit: Limit, want: int, window: int | str, units: int,
                field: str, epoch: int | str, clock: _Clock) -> tuple[Any, ...]:
    values = (limit.algorithm, limit.limit, period_us(limit), limit.cost, want, window, units,
              field, epoch, *clock.window(limit))
    assert len(values) == len(LEASE_ARGS)
    return values


_LEASE_PER = len(LEASE_FIELDS)
(_GRANTED, _WINDOW, _LEFT, _LEASE_RESET_AFTER, _LEASE_RETRY, _ENDS, _RETURNED, _EPOCH) = (
    LEASE_FIELDS.index(f) for f in
    ("granted", "window", "remaining", "reset_after", "retry_after", "ends_after", "returned",
     "epoch")
)


def decode_lease(
    limits: Sequence[Limit], back: Sequence[Leftover], reply: Any
) -> list[Grant]:
    """The lease script's reply as one `Grant` per limit; ValueError when it is not one."""
    if not isinstance(reply, list) or len(reply) != 1 + _LEASE_PER * (len(back) + len(limits)):
        raise ValueError(f"unexpected reply from the lease script: {reply!r}")
    grants = []
    for i, limit in enumerate(limits):
        o = 1 + (len(back) + i) * _LEASE_PER
        grants.append(Grant(
            limit=limit,
            units=int(reply[o + _GRANTED]),
            window=int(reply[o + _WINDOW]),
            remaining=int(reply[o + _LEFT]),
            reset_after=int(reply[o + _LEASE_RESET_AFTER]) / US,
            retry_after=int(reply[o + _LEASE_RETRY]) / US,
            ends_after=int(reply[o + _ENDS]) / US,
            epoch=int(reply[o + _EPOCH]),
        ))
    return grants


def returned_units(back: Sequence[Leftover], reply: Any) -> int:
    """How many of the given-back units the store took back (their window still ran)."""
    return sum(int(reply[1 + i * _LEASE_PER + _RETURNED]) for i in range(len(back)))
