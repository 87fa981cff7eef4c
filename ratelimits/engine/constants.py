"""The figures both backends share. The Lua script gets them generated from here (see
`scripts.lua_constants()`), so Python and Lua can never disagree on one of them."""

from __future__ import annotations

#: Both backends compute time in integer microseconds held in doubles.
US = 1_000_000
#: Float time (T = P/L) drifts by fractions of a microsecond at epoch magnitudes; a
#: request this close to its turn is on time (EPS: µs, TOKEN_EPS: units).
EPS = 1.0
TOKEN_EPS = 1e-9
#: Counts derived from float time land a hair below whole numbers: floor(x + FLOOR_EPS).
FLOOR_EPS = 1e-3
#: Per-policy counters are kept this long (seconds): a day plus an hour of slack.
STATS_TTL = 25 * 3600
#: Each policy's top offenders: one list per hour, kept two hours, at most this many.
OFFENDERS_TTL = 2 * 3600
OFFENDERS_CAP = 100
#: An offender is listed under the first this many characters of its identity.
OFFENDER_CHARS = 200
#: A refused concurrency request is told to retry after at most this (µs): slots free
#: when requests finish, which no clock predicts.
CONCURRENCY_RETRY_US = US
#: A window algorithm's clients are packed into this many hashes per policy and window
#: (see `keynames.base_key`). About 100 clients per hash keeps Redis's compact encoding
#: (listpack, up to `hash-max-listpack-entries`, 128 by default) from 4,000 to 400,000
#: clients per policy and window; every process of a site must agree on it.
WINDOW_SHARDS = 4096
