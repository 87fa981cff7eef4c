"""The layout of every call of the scripts, written once: the values each call sends and
each reply holds, by name and in order, and the constants both sides compute with.

`ratelimits.engine.scripts` generates the Lua side from it (the constants and where each
value sits); `contract` encodes the calls and decodes the replies by it, and the
PostgreSQL engine's functions take the same constants. A request's limits go in one
batch call (`lua/batch.lua`); a Redis Cluster sends one call per hash slot
(`lua/slot.lua`) and refunds what a slot charged when another refused
(`lua/refund.lua`); leases have a call of their own (`lua/lease.lua`).
"""

from __future__ import annotations

from ratelimits.engine import constants
from ratelimits.engine.keynames import to_us
from ratelimits.engine.lease import LEASE_SECONDS
from ratelimits.engine.types import REFUND

# -- the batch call (lua/batch.lua, lua/check_all.lua) ------------------------------------

#: A batch call's ARGV opens with its plan: one string holding all that repeats from one
#: call of the same policies to the next (`begin` in lua/check_all.lua parses it once
#: and keeps it; receiving an argument costs Redis about a third of a GET, so the
#: call sends one where it sent a value per field). After the plan come only the values
#: of this call, each present only when needed, in this order: its time (µs; absent: the
#: server's TIME), its token (when a limit stores named members), and, per window limit
#: in the limits' order, the client's field in its shard's hashes (`keynames.cell`).
#: KEYS holds one base key per limit (`keynames.base_key`), then every other key the
#: script may touch (`keynames.reached_keys`: window hashes, warm-up and lockout states;
#: the version key; the counters and offenders a call carries, see `contract.carry`), so
#: that a strict server, which refuses a script a key it was not given, runs it. The
#: script counts the limits by its plan, not by KEYS.
#:
#: The plan: "1" or "0" for each of `PLAN_FLAGS`; the version key and the counters'
#: prefix ('' = none), each written as its length, ":" and itself; then per limit "|"
#: and its `LIMIT_SPEC` values joined by "|". `stage` is the limit's `Limit.stage`; a
#: calendar window's limit carries the window holding the caller's time and the next
#: one as three boundaries (`calendar.bounds`; 0 otherwise), and the script takes the
#: one holding its own.
PLAN_FLAGS = ("has_now", "has_token")
LIMIT_SPEC = ("algorithm", "limit", "period_us", "burst", "cost", "shadow", "warmup_us",
              "wait_us", "lockout_us", "stage", "cal0", "cal1", "cal2")
#: The plans a script keeps parsed before it starts afresh (a plan per set of policies a
#: request meets, and per calendar window: few).
PLANS_KEPT = 1_000
#: After the limits, each count the process tallied alone (`tally`) rides in this order:
#: kind "c" (a counter: field in `what`) or "o" (an offender: who in `what`).
CARRY_ARGS = ("kind", "name", "at", "what", "n")
#: The reply's head, then per limit these values. A limit that refuses has no delay and
#: one that admits no retry: `wait` is its retry_after when it refused, else its delay
#: (µs). Whether it admitted is its outcome's (`contract.PASSED`), and every element a
#: reply carries costs Redis about a fifth of a GET.
REPLY_HEAD = ("version", "admitted", "now_us")
RESULT_FIELDS = ("remaining", "reset_after", "wait", "outcome")


# -- Redis Cluster: one slot's decision (lua/slot.lua) and its refund (lua/refund.lua) -----

#: slot.lua's reply: this head, then per limit its `RESULT_FIELDS` and what its charge
#: wrote (`CHARGE_FIELDS`, '' when nothing), for the refund should another slot refuse.
SLOT_HEAD = ("admitted", "now_us")
CHARGE_FIELDS = ("s1", "s2")
#: refund.lua's ARGV: this head (the charge's time, as slot.lua answered it, and the
#: request's token), then per key these values; KEYS: one base key per charged limit.
REFUND_HEAD = ("now_us", "token")
REFUND_ARGS = ("algorithm", "limit", "period_us", "burst", "cost", "s1", "s2", "field")


# -- leases (lua/lease.lua) --------------------------------------------------------------

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
#: A lease call's `want` for a key whose client is reset instead (see lua/lease.lua).
LEASE_RESET = -1


# -- what the scripts compute with ----------------------------------------------------

#: Values the script's constants are generated from (Lua name -> Python value).
LUA_CONSTANTS: dict[str, int | float | str] = {
    "US": constants.US,
    "EPS": constants.EPS,
    "TOKEN_EPS": constants.TOKEN_EPS,
    "FLOOR_EPS": constants.FLOOR_EPS,
    "STATS_TTL": constants.STATS_TTL,
    "OFFENDERS_TTL": constants.OFFENDERS_TTL,
    "OFFENDERS": constants.OFFENDERS_CAP,
    "CONCURRENCY_RETRY": constants.CONCURRENCY_RETRY_US,
    "SPEC": len(LIMIT_SPEC),
    # one limit's spec in a plan, each value captured
    "SPEC_PATTERN": "^" + "|([^|]*)" * len(LIMIT_SPEC),
    "PLANS_KEPT": PLANS_KEPT,
    "CARRY": len(CARRY_ARGS),
    "LEASE_US": to_us(LEASE_SECONDS),
    "LEASE_RESET": LEASE_RESET,
    # `Limit.stage` as a plan carries it (text)
    "STAGE_REFUND": str(REFUND),
}
