"""The lease call's contract (`lua/lease.lua`), written once: the arguments it sends and
the values it answers, shared by every engine that takes leases (`lease`).

A lease call carries the give-backs first, then one lease per limit; the reset of a
client under a leased limit is a lease call too (`LEASE_RESET`). A calendar window's
limit carries its window as the batch call does (`contract.LIMIT_SPEC`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ratelimits.engine.constants import US
from ratelimits.engine.contract import LEASE_RESET, Clock
from ratelimits.engine.keynames import cell, period_us, reached_keys, to_us
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.types import Limit

__all__ = [
    "LEASE_ARGS",
    "LEASE_FIELDS",
    "decode_lease",
    "encode_lease",
    "encode_lease_reset",
    "returned_units",
]

#: ARGV per leased limit, after the one head value (now_us); KEYS: one base key each.
#: `want` is the units to lease (0: only give back), or `LEASE_RESET` to reset the client;
#: `back_epoch` is the epoch (resets of its window) of the grant the units come from; a
#: calendar window's limit carries `cal0`..`cal2` as a decision does (`LIMIT_SPEC`), so
#: leased and unleased requests count in the same window.
LEASE_ARGS = ("algorithm", "limit", "period_us", "cost", "want", "back_window", "back_units",
              "field", "back_epoch", "cal0", "cal1", "cal2")
#: The lease script's reply: now_us, then per limit these values.
LEASE_FIELDS = ("granted", "window", "remaining", "reset_after", "retry_after", "ends_after",
                "returned", "epoch")


def encode_lease(
    prefix: str, limits: Sequence[Limit], back: Sequence[Leftover], now: float | None
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one lease call: the give-backs first (so a limit's leftover is
    back before its new grant is counted), then one lease of `batch` units per limit."""
    keys: list[str] = []
    args: list[Any] = ["" if now is None else to_us(now)]
    clock = Clock(now)
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
    return [*keys, *_reached(clock, prefix, [*(item.limit for item in back), *limits])], args


def encode_lease_reset(prefix: str, limit: Limit, now: float | None
                       ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the lease call that resets one client under a leased limit: its
    count keeps only the units leases may still spend, and units leased before the reset
    can no longer be given back (see lua/lease.lua)."""
    key, field = cell(prefix, limit)
    clock = Clock(now)
    return [key, *_reached(clock, prefix, [limit])], [
        "" if now is None else to_us(now), *_lease_args(limit, LEASE_RESET, "", 0, field, "",
                                                        clock)]


def _reached(clock: Clock, prefix: str, limits: Iterable[Limit]) -> list[str]:
    """The window hashes the lease script may touch for `limits` (declared in KEYS after
    their base keys, see `keynames.reached_keys`)."""
    out: list[str] = []
    for limit in limits:
        out += reached_keys(prefix, limit, clock.at(), exact=clock.now is not None,
                            lease=True)
    return out


def _lease_args(limit: Limit, want: int, window: int | str, units: int,
                field: str, epoch: int | str, clock: Clock) -> tuple[Any, ...]:
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
