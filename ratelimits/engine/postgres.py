"""The PostgreSQL engine: every limit of a request decided in one call of a PL/pgSQL
function, for sites whose only shared store is their database.

The function (`sql/postgres.sql`) is to PostgreSQL what the batch script is to Redis:
it locks the request's clients (transaction-level advisory locks, taken in one order so
that two requests never deadlock), checks every limit, and charges all of them or none,
each algorithm step for step as its twin in `algorithms.py`, in the same IEEE doubles,
so the figures are the ones the other engines give. The engine installs its tables and
functions itself on first use (no migration: the engine knows nothing of Django), and
talks through connections of its own in autocommit, one per thread (`postgres_sessions`):
a charge is never part of a view's transaction.

Changes reach every process as on Redis, within the same half second: the statement
that bumps the policy version, or resets a client, also sends a `NOTIFY` on the
engine's channel (`watch.channel`, one per key prefix) in its transaction, so the message
leaves at the commit and never without it; `watch()` is a session of its own that
`LISTEN`s on it (`watch.ListenWatch`). That session must stay one server session: a
transaction-pooling PgBouncer cannot carry it (changes then arrive within about a
second, at the version reads; a session pool or the server keeps them within half a
second). The heartbeat rides on the version read every `BEAT_EVERY` seconds.

Leases (`batch`, for the fixed and sliding windows) are the Redis engine's, to the
unit: `ratelimits_lease_v1` is the twin of `lua/lease.lua`, charging the count that
decisions read, so leased and unleased requests share it. The counters and offenders are
tallied in process and sent in the background, as the Redis engine does (`tally`). A call with
a calendar window is decided on this process's clock, which names the window (the
server's could name it only inside the call).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.calendar import window
from ratelimits.engine.constants import US
from ratelimits.engine.contract import assemble, result_values
from ratelimits.engine.errors import EngineError
from ratelimits.engine.heartbeat import BEAT_EVERY, LIVE_TTL
from ratelimits.engine.keynames import (
    client_key,
    guaranteed,
    new_token,
    period_us,
    to_us,
)
from ratelimits.engine.layout import LEASE_RESET
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.postgres_sessions import Sessions
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.tally import Counts, Tally
from ratelimits.engine.types import Decision, Limit
from ratelimits.engine.watch import POLICIES, RESET, ListenWatch, channel, notice

__all__ = ["PostgresEngine", "unsupported"]

#: Every this many calls per process, one call also deletes expired rows, at most
#: `SWEEP_ROWS` of each table (a bounded DELETE, never a walk of the whole table).
SWEEP_EVERY = 1_000
SWEEP_ROWS = 1_000


def unsupported(limit: Limit) -> str | None:
    """Why this engine cannot decide `limit` (None: it can)."""
    spec = REGISTRY[limit.algorithm]
    if spec.learned:
        return (f"{spec.label} is learnt in each process "
                "(ratelimits.engine.adaptive.AdaptiveEngine), not decided by a store")
    return None


def _windows(limits: Sequence[Limit], now: float | None
             ) -> tuple[list[float | None], list[float | None]]:
    """Each limit's calendar window at `now` (this process's clock), as the functions
    take it: its number (its start, in seconds) and its end (µs); None for a period-long
    window."""
    wins: list[float | None] = []
    ends: list[float | None] = []
    for limit in limits:
        if limit.calendar and now is not None:
            start, end = window(limit.calendar, limit.zone, now)
            wins.append(float(start))
            ends.append(float(end * US))
        else:
            wins.append(None)
            ends.append(None)
    return wins, ends


class PostgresEngine(Acquiring):
    """Decides on a PostgreSQL server at `conninfo` (a `postgresql://` URL or a libpq
    connection string). Thread-safe: each thread of each process talks through its own
    autocommit connection (async code: in a worker thread, `Acquiring`'s).

    `timeout` (seconds) bounds a call's wait for a client's lock on the server, and twice
    it the wait for any answer here; `connect_timeout` bounds each new connection; a
    server out of reach, a lock held too long or a server too slow raise
    `EngineUnavailable`, as the Redis engine does, and `breaker` makes calls fail fast
    after a few of them.
    """

    def __init__(self, conninfo: str, *, prefix: str = "rl:",
                 version_key: str | None = None, timeout: float = 0.5,
                 connect_timeout: float = 0.5, breaker: CircuitBreaker | None = None,
                 beat_every: float = BEAT_EVERY, clock: str = "store") -> None:
        try:
            import psycopg  # noqa: F401  (said at construction, not on the first request)
        except ImportError:  # pragma: no cover - the extra is installed in the tests
            raise ImportError(
                "the PostgreSQL engine needs psycopg 3: pip install 'ratelimits[postgres]'"
            ) from None
        self.conninfo = conninfo
        self.prefix = prefix
        self.version_key = version_key
        self.timeout = timeout
        #: The longest a call waits for a client's lock, in whole milliseconds.
        self._lock_ms = max(1, round(timeout * 1000))
        self.connect_timeout = connect_timeout
        self.breaker = breaker
        self._sessions = Sessions(conninfo, timeout=timeout, connect_timeout=connect_timeout,
                                  breaker=breaker)
        #: One statement, its first row (`Sessions.call`).
        self._call = self._sessions.call
        #: Whose clock decides a call given no time (`keynames.CLOCKS`): the server's
        #: ("store"), or this process's ("client"), sent with the call.
        self.clock = clock
        self._calls = 0
        self.tally = Tally(self._send)
        #: The heartbeat: seconds between two beats, the next one's monotonic time, this
        #: process's name in the group (new in a forked child) and the last count learnt.
        self.beat_every = beat_every
        self._beat_at = 0.0
        self._member = ""
        self._live: int | None = None

    # -- deciding ------------------------------------------------------------------

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits: one
        call of `ratelimits_decide_v1`."""
        keys: list[str] = []
        algos: list[str] = []
        shadows: list[bool] = []
        stages: list[int] = []
        ls: list[float] = []
        ps: list[float] = []
        bs: list[float] = []
        cs: list[float] = []
        mws: list[float] = []
        ws: list[float] = []
        lockouts: list[float] = []
        holds = False
        if now is None and (self.clock == "client"
                            or any(limit.calendar for limit in limits)):
            now = time.time()  # this process's clock: a calendar window is named here
        for limit in limits:
            why = unsupported(limit)
            if why is not None:
                raise ValueError(f"limit {limit.name or limit.key!r}: {why}")
            spec = REGISTRY[limit.algorithm]
            keys.append(client_key(self.prefix, limit))
            algos.append(limit.algorithm)
            ls.append(float(limit.limit))
            ps.append(float(period_us(limit)))
            bs.append(float(spec.burst_of(limit)))
            cs.append(float(limit.cost))
            mws.append(float(to_us(limit.max_wait)))
            ws.append(float(to_us(limit.warmup)))
            shadows.append(limit.shadow)
            lockouts.append(float(to_us(limit.lockout)))
            stages.append(limit.stage)
            holds = holds or spec.holds_slots
        wins, ends = _windows(limits, now)
        token = new_token() if holds else None
        now_us = None if now is None else float(to_us(now))
        row = self._call(
            "SELECT * FROM ratelimits_decide_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s::float8[], %s::float8[], %s, %s, %s)",
            (now_us, keys, algos, ls, ps, bs, cs, mws, ws, shadows, lockouts, stages,
             wins, ends, token, self.version_key, self._lock_ms),
        )
        self._chores(now_us)
        decided_us, admitted, version, remaining, reset_after, wait, outcome = row
        raw: list[Any] = []
        for i in range(len(limits)):
            raw += result_values(1 if outcome[i] in ("a", "o") else 0, remaining[i],
                                 reset_after[i], wait[i], wait[i], outcome[i])
        decision = assemble(limits, raw, admitted=admitted, version=version, token=token,
                            now_us=int(decided_us))
        self.tally.add(decision, int(decided_us))
        return decision

    def _chores(self, now_us: float | None) -> None:
        """Every `SWEEP_EVERY` calls, delete expired rows (a separate short statement, so
        the decision's locks are never held while it runs)."""
        self._calls += 1
        if self._calls % SWEEP_EVERY:
            return
        with contextlib.suppress(EngineError):  # the next sweep deletes what this one left
            self._call("SELECT ratelimits_sweep_v1(%s, %s)", (now_us, SWEEP_ROWS))

    def sweep(self, now: float | None = None, most: int = SWEEP_ROWS) -> int:
        """Delete at most `most` expired rows of each table now; how many went."""
        now_us = None if now is None else float(to_us(now))
        return int(self._call("SELECT ratelimits_sweep_v1(%s, %s)", (now_us, most))[0])

    # -- held slots ----------------------------------------------------------------

    #: The slots of `concurrency` limits expire after their period unless renewed.
    slots_expire = True

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one call)."""
        self._slots(decision.holding(), None, renew=False)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another period from now."""
        held = [pair for decision in decisions for pair in decision.holding()]
        if now is None and self.clock == "client":
            now = time.time()
        self._slots(held, None if now is None else float(to_us(now)), renew=True)

    def _slots(self, held: Sequence[tuple[Limit, Sequence[str]]], now_us: float | None,
               *, renew: bool) -> None:
        if not held:
            return
        self._call(
            "SELECT ratelimits_slots_v1(%s, %s, %s, %s, %s, %s)",
            (now_us, [client_key(self.prefix, limit) for limit, _ in held],
             ["\n".join(members) for _, members in held],
             [float(period_us(limit)) for limit, _ in held], renew, self._lock_ms),
        )

    # -- the policy version ----------------------------------------------------------

    def read_version(self, now: float | None = None) -> int:
        """The policy version (0 until the first bump), with this process's heartbeat
        riding on the same call when one is due."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        if time.monotonic() < self._beat_at:
            row = self._call("SELECT coalesce(max(v), 0) FROM ratelimits_version_v1 "
                             "WHERE k = %s", (self.version_key,))
            return int(row[0])
        row = self._call(
            "SELECT (SELECT coalesce(max(v), 0) FROM ratelimits_version_v1 WHERE k = %s), "
            "ratelimits_beat_v1(%s, %s, %s)",
            (self.version_key, self.prefix, self._name(), float(LIVE_TTL * US)))
        self._beat_at = time.monotonic() + self.beat_every
        self._live = int(row[1])
        return int(row[0])

    def _name(self) -> str:
        """This process's name among those sharing the limits (a forked child's own)."""
        pid = os.getpid()
        if not self._member.endswith(f":{pid}"):
            self._member = f"{socket.gethostname()}:{secrets.token_hex(4)}:{pid}"
        return self._member

    def bump_version(self) -> int:
        """Tell every reader that the policies changed; the new version."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        # the NOTIFY is in the write's transaction: it leaves at the commit, never alone
        row = self._call(
            "WITH b AS (INSERT INTO ratelimits_version_v1 AS t (k, v) VALUES (%s, 1) "
            "ON CONFLICT (k) DO UPDATE SET v = t.v + 1 RETURNING v) "
            "SELECT v, pg_notify(%s, %s) FROM b",
            (self.version_key, channel(self.version_key), notice(POLICIES)))
        return int(row[0])

    # -- state ----------------------------------------------------------------------

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit: its key and every key under it
        (its windows, its warm-up); a leased limit keeps the units other processes'
        leases may still spend (see `lease`). Every process's watch then hears of it (a
        named limit, with a version key)."""
        # the NOTIFY in the reset's own statement: it leaves at its commit, never alone
        said = ((channel(self.version_key), notice(RESET, limit.name))
                if limit.name and self.version_key else None)
        if limit.batch is not None:  # what leases may still spend stays counted (`lease`)
            self._lease([(limit, LEASE_RESET, None)], now, said)
        elif said is None:
            self._call("SELECT ratelimits_reset_v1(%s)", (client_key(self.prefix, limit),))
        else:
            self._call("SELECT ratelimits_reset_v1(%s), pg_notify(%s, %s)",
                       (client_key(self.prefix, limit), *said))

    # -- counters and offenders (tallied in process, see `tally`) -----------------------

    def _send(self, counts: Counts, offenders: Counts) -> None:
        names, minutes, fields, ns = [], [], [], []
        for (name, minute), by_field in counts.items():
            for field, n in by_field.items():
                names.append(name)
                minutes.append(minute)
                fields.append(field)
                ns.append(n)
        onames, hours, whos, ons = [], [], [], []
        for (name, hour), by_who in offenders.items():
            for who, n in by_who.items():
                onames.append(name)
                hours.append(hour)
                whos.append(who)
                ons.append(n)
        self._call("SELECT ratelimits_count_v1(%s, %s, %s, %s, %s, %s, %s, %s)",
                   (names, minutes, fields, ns, onames, hours, whos, ons))
        counts.clear()
        offenders.clear()

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision made without the function (a remembered refusal)."""
        self.tally.add(decision, now_us)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute (see `tally`)."""
        self.tally.add_fields(name, now_us, fields)

    def _flush_pending(self) -> None:
        """Send this process's tally before reading figures (other processes' arrive
        within `tally.FLUSH_EVERY`)."""
        if self.tally.pending():
            self.tally.flush()

    def flush(self) -> None:
        """Send what is tallied now (EngineUnavailable when it cannot)."""
        self.tally.flush()

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute (minutes since the epoch)."""
        return self.counters_many([(name, minute)])[0]

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs, in one call."""
        if not wanted:
            return []
        self._flush_pending()
        row = self._call(
            "SELECT coalesce(json_agg(json_build_array(w.i, c.field, c.n)), '[]') "
            "FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY w(name, minute, i) "
            "JOIN ratelimits_counts_v1 c ON c.name = w.name AND c.minute = w.minute",
            ([name for name, _ in wanted], [minute for _, minute in wanted]),
        )
        out: list[dict[str, int]] = [{} for _ in wanted]
        for i, field, n in row[0]:
            out[i - 1][field] = int(n)
        return out

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour."""
        return self.offenders_many([(name, hour)], n)[0]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs, in one call."""
        if not wanted:
            return []
        self._flush_pending()
        row = self._call(
            "SELECT coalesce(json_agg(json_build_array(w.i, o.who, o.n, o.e)), '[]') "
            "FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY w(name, hour, i) "
            "JOIN ratelimits_offenders_v1 o ON o.name = w.name AND o.hour = w.hour",
            ([name for name, _ in wanted], [hour for _, hour in wanted]),
        )
        found: list[tuple[dict[str, int], dict[str, int]]] = [({}, {}) for _ in wanted]
        for i, who, count, error in row[0]:
            counts, errors = found[i - 1]
            counts[who] = int(count)
            if error:
                errors[who] = int(error)
        return [guaranteed(counts, errors, n) for counts, errors in found]

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name` (its counters and offenders), as when the
        policy is deleted. This process's tally is sent first, or its last counts would
        come back (the other policies' with them)."""
        self.flush()
        self._call(
            "WITH a AS (DELETE FROM ratelimits_counts_v1 WHERE name = %s RETURNING 1), "
            "b AS (DELETE FROM ratelimits_offenders_v1 WHERE name = %s RETURNING 1) "
            "SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)", (name, name))

    # -- what a store engine offers that this one does not yet --------------------------

    @property
    def live_instances(self) -> int | None:
        """Processes that beat within `LIVE_TTL` at this one's last beat (None: no beat
        yet)."""
        return self._live

    def lease(self, limits: Sequence[Limit], now: float | None = None, *,
              back: Sequence[Leftover] = ()) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits` (fixed or sliding window),
        after giving back `back`: one call of `ratelimits_lease_v1`. A grant has at least
        the limit's cost, or none (`units == 0`, with the window's `retry_after`)."""
        if not limits and not back:
            return []
        for limit in limits:
            if limit.batch is None:
                raise ValueError(f"limit {limit.name or limit.key!r} has no batch to lease")
        rows = self._lease([*((item.limit, 0, item) for item in back),
                            *((limit, limit.batch or 0, None) for limit in limits)], now)
        return [Grant(limit, int(g), int(w), int(left), rst / US, rty / US, ends / US,
                      int(epoch))
                for limit, (g, w, left, rst, rty, ends, _, epoch)
                in zip(limits, rows[len(back):], strict=True)]

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases; a window that has ended keeps its
        count. Returns the units taken back."""
        if not back:
            return 0
        rows = self._lease([(item.limit, 0, item) for item in back], now)
        return sum(int(row[6]) for row in rows)

    def _lease(self, entries: Sequence[tuple[Limit, int, Leftover | None]],
               now: float | None, said: tuple[str, str] | None = None
               ) -> list[tuple[float, ...]]:
        """One call of `ratelimits_lease_v1`: per (limit, units wanted or `LEASE_RESET`,
        units given back) entry, in order, (granted, window, remaining, reset_after,
        retry_after, ends_after, returned, epoch), times in µs. `said`: a (channel,
        payload) notified in the same statement."""
        if now is None and (self.clock == "client"
                            or any(limit.calendar for limit, _, _ in entries)):
            now = time.time()  # this process's clock: a calendar window is named here
        wins, ends = _windows([limit for limit, _, _ in entries], now)
        row = self._call(
            "SELECT l.*" + (", pg_notify(%s, %s)" if said else "") + " FROM "
            "ratelimits_lease_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::float8[], "
            "%s::float8[], %s) l",
            (*(said or ()), None if now is None else float(to_us(now)),
             [client_key(self.prefix, limit) for limit, _, _ in entries],
             [limit.algorithm for limit, _, _ in entries],
             [float(limit.limit) for limit, _, _ in entries],
             [float(period_us(limit)) for limit, _, _ in entries],
             [float(limit.cost) for limit, _, _ in entries],
             [float(want) for _, want, _ in entries],
             [float(back.window) if back else 0.0 for _, _, back in entries],
             [float(back.units) if back else 0.0 for _, _, back in entries],
             [float(back.epoch) if back else 0.0 for _, _, back in entries],
             wins, ends, self._lock_ms))
        return list(zip(*row[1:9], strict=True))

    def watch(self) -> ListenWatch | None:
        """A session of its own that LISTENs on the engine's channel, hearing the policy
        version bumped and an operator's reset (not opened yet); None without a version
        key."""
        if not self.version_key:
            return None
        return ListenWatch(self._sessions.open, channel(self.version_key))

    def announce_reset(self, name: str) -> None:
        """Tell every process's watch that clients of policy `name` were reset, so that
        none answers them from what it remembers."""
        if self.version_key:
            self._call("SELECT pg_notify(%s, %s)",
                       (channel(self.version_key), notice(RESET, name)))

    @property
    def client(self) -> Any:
        """This thread's psycopg connection."""
        return self._sessions.connection()

    def close(self) -> None:
        """Send what is tallied and close every connection this process opened."""
        self.tally.close()
        self._sessions.close()

