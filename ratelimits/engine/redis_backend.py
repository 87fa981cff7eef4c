"""The production engine: every limit of a request decided in one call on Redis (FCALL of
the batch function, or EVALSHA of the same script where the server has no Functions).

Its calls on the request path (a decision, the version, a lease, a release) are flows
(`flows`) that yield the Redis commands they need (`transport`): `RedisEngine` performs
them on its blocking client, its asyncio twin (`engine.aio`) awaits the same flows."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

import redis

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.constants import STATS_TTL
from ratelimits.engine.contract import (
    carry,
    decode,
    decode_lease,
    encode,
    encode_lease,
    encode_lease_reset,
    encode_renew,
    note_taken,
    returned_units,
)
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow, run_flow
from ratelimits.engine.functions import StoredScript
from ratelimits.engine.heartbeat import Heartbeat, beating
from ratelimits.engine.keynames import (
    US,
    base_key,
    figure_keys,
    guaranteed,
    offender_errors_key,
    offenders_key,
    stats_key,
    stored_state,
    to_us,
)
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.scripts import (
    batch_library,
    batch_source,
    lease_source,
    offend_source,
    renew_source,
    version_source,
)
from ratelimits.engine.tally import Counts, Tally
from ratelimits.engine.transport import (
    UNAVAILABLE_ERRORS,
    Command,
    Pipelined,
    Script,
    guarded,
    wire_of,
)
from ratelimits.engine.types import Decision, Limit

__all__ = ["RedisEngine"]

T = TypeVar("T")


@lru_cache(maxsize=1)
def lease_script() -> Script:
    """The lease script (see `lease`), run by EVALSHA."""
    return Script(lease_source())


class RedisEngine(Acquiring):
    """Decide requests atomically in Redis; safe to share between threads.

    `client` is a redis-py client (django-redis's `get_redis_connection()` hands one
    out). Time comes from the server's clock unless `evaluate()` is given `now`. With a
    `breaker`, consecutive failures make calls fail fast for its cool-down.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "rl:",
        version_key: str | None = None,
        stats: bool = True,
        breaker: CircuitBreaker | None = None,
        live_key: str | None = None,
    ) -> None:
        self.client: Any = client  # redis-py types sync and async replies as one union
        #: the commands of the request path, on connections kept for them (`Wire`)
        self.wire = wire_of(client)
        self.breaker = breaker
        self.prefix = prefix
        self.version_key = version_key
        #: The batch call, and the mode (FCALL or EVALSHA) learnt of the server: one per
        #: server, shared with the asyncio twin.
        self.script = StoredScript(batch_library(), batch_source())
        self._renew_script: Any = None
        self._offend_script: Any = None
        self.stats = stats
        #: decisions made without the script (see `local_first`), counted in process
        self.tally = Tally(self._send)
        #: With a `live_key`, calls carry a heartbeat now and then (see `engine.heartbeat`).
        self.heartbeat = Heartbeat(live_key) if live_key else None

    #: The slots of `concurrency` limits expire after their period unless renewed.
    slots_expire = True

    def perform(self, need: Any) -> Any:
        """Send one command (or pipeline) a flow needs, on this engine's client."""
        return self.wire.perform(need)

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        return run_flow(self.deciding(limits, now), self.perform)

    def deciding(self, limits: Sequence[Limit], now: float | None) -> Flow[Decision]:
        """`evaluate()` as a flow (run by this engine, awaited by its asyncio twin)."""
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        keys, args, token, carried = self._call_of(limits, now)
        try:
            reply = yield from guarded(self.breaker, self._calling(keys, args, now))
        except EngineError as exc:
            self._unsent(carried)
            note_taken(limits, token, exc)
            raise
        try:
            return self._decision_of(limits, reply, token)
        except EngineError as exc:  # the script ran: its reply is what went wrong
            note_taken(limits, token, exc)
            raise

    def _call_of(
        self, limits: Sequence[Limit], now: float | None
    ) -> tuple[list[str], list[Any], str | None, tuple[Counts, Counts] | None]:
        """KEYS and ARGV of one decision, its token, and the tallied counts riding along
        (None: none due)."""
        keys, args, token = encode(
            limits, prefix=self.prefix, now=now, version_key=self.version_key,
            stats=self.stats,
        )
        carried = None
        if self.stats and self.tally.due():  # counts made in process ride along
            carried = self.tally.take()
            args += carry(*carried)
        return keys, args, token, carried

    def _unsent(self, carried: tuple[Counts, Counts] | None) -> None:
        """The call that carried these counts failed: they wait for the next one."""
        if carried is not None:
            self.tally.restore(*carried)

    def _decision_of(self, limits: Sequence[Limit], reply: Any, token: str | None) -> Decision:
        """The script's reply as a Decision, counted in the tally."""
        try:
            decision = decode(limits, reply, versioned=bool(self.version_key), token=token)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        if self.stats:
            self.tally.add(decision, reply[2])
        return decision

    def _calling(self, keys: list[str], args: list[Any], now: float | None) -> Flow[Any]:
        """The batch call, a heartbeat pipelined beside it when one is due."""
        beat = self.heartbeat
        if beat is None or not beat.due():
            # The call loads the library (or the script, after NOSCRIPT) when the server
            # lacks it, so a restarted server or a FUNCTION FLUSH costs one round trip more.
            return self.script.call(keys, args)
        return self._beating(beat, keys, args, now)

    def _beating(self, beat: Heartbeat, keys: list[str], args: list[Any],
                 now: float | None) -> Flow[Any]:
        """The batch call and the beat that is due, in one round trip."""
        reply = yield from beating(beat, self.script.command(keys, args), now)
        if not isinstance(reply, Exception):
            return reply
        if (yield from self.script.recover(reply)):  # the server lacked its script
            return (yield from self.script.call(keys, args))
        raise reply

    @property
    def live_instances(self) -> int | None:
        """Processes that beat within the TTL at this one's last beat (None: no beat yet)."""
        return None if self.heartbeat is None else self.heartbeat.count

    def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET, carrying a heartbeat when one is due."""
        return run_flow(self.reading_version(now), self.perform)

    def reading_version(self, now: float | None) -> Flow[int]:
        """`read_version()` as a flow (see `deciding`)."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        raw = yield from guarded(self.breaker, self._getting(self.version_key, now))
        return int(raw) if raw is not None else 0

    def _getting(self, key: str, now: float | None) -> Flow[Any]:
        beat = self.heartbeat
        if beat is None or not beat.due():
            return (yield Command("GET", key))
        reply = yield from beating(beat, ("GET", key), now)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one round trip)."""
        run_flow(self.releasing(decision), self.perform)

    def releasing(self, decision: Decision) -> Flow[None]:
        """`release()` as a flow (see `deciding`), behind the circuit breaker like any
        call: while the store is out of reach it raises EngineUnavailable (at once while
        the circuit is open), so the caller knows the slots are still held and may try
        again (the pipeline's watchdog does)."""
        if decision.token is None:
            return
        zrems = (("ZREM", base_key(self.prefix, limit), *members)
                 for limit, members in decision.holding())
        replies = yield from guarded(self.breaker, _sent(Pipelined(*zrems)))
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    def bump_version(self) -> int:
        """Tell every process that the policies changed; returns the new version."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        try:  # INCR, from the server's clock when the key was lost (lua/version.lua)
            return int(self.client.register_script(version_source())(keys=[self.version_key]))
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc)) from exc

    # -- decisions made in process, counted like the script's --------------------------

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision made without the script (a remembered refusal, a leased unit):
        it reaches the counters and offenders within `tally.FLUSH_EVERY`."""
        self.tally.add(decision, now_us)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute (see `tally`)."""
        self.tally.add_fields(name, now_us, fields)

    def flush(self) -> None:
        """Send what `count_locally` tallied now (EngineUnavailable when it cannot)."""
        self.tally.flush()

    def close(self) -> None:
        """Send what is tallied and stop the tally's thread (also run at exit)."""
        self.tally.close()
        self.wire.close()

    def _send(self, counts: Counts, offenders: Counts) -> None:
        pipe = self.client.pipeline(transaction=False)
        for (name, minute), fields in counts.items():
            key = stats_key(self.prefix, name, minute)
            for field, n in fields.items():
                pipe.hincrby(key, field, n)
            pipe.expire(key, STATS_TTL)
        if offenders and self._offend_script is None:
            self._offend_script = self.client.register_script(offend_source())
        for (name, hour), whos in offenders.items():
            args: list[Any] = []
            for who, n in whos.items():
                args += (who.encode("utf-8", "surrogatepass"), n)
            self._offend_script(keys=[offenders_key(self.prefix, name, hour),
                                      offender_errors_key(self.prefix, name, hour)],
                                args=args, client=pipe)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        counts.clear()
        offenders.clear()

    # -- reading ---------------------------------------------------------------------------

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute (minutes since the epoch)."""
        return self.counters_many([(name, minute)])[0]

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs in one pipelined round trip, this
        process's tally sent first (other processes' arrive within a second)."""
        self._flush_pending()
        pipe = self.client.pipeline(transaction=False)
        for name, minute in wanted:
            pipe.hgetall(stats_key(self.prefix, name, minute))
        return [
            {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
            for raw in pipe.execute()
        ]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs in one pipelined round trip."""
        self._flush_pending()
        pipe = self.client.pipeline(transaction=False)
        for name, hour in wanted:
            # a list holds at most OFFENDERS_CAP members: read it whole to rank it
            pipe.zrange(offenders_key(self.prefix, name, hour), 0, -1, withscores=True)
            pipe.hgetall(offender_errors_key(self.prefix, name, hour))
        replies = pipe.execute()
        out = []
        for raw, raw_errors in zip(replies[::2], replies[1::2], strict=True):
            counts = {_text(k): int(v) for k, v in raw}
            errors = {_text(k): int(v) for k, v in raw_errors.items()}
            out.append(guaranteed(counts, errors, n))
        return out

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour, by
        guaranteed count: refusals each one certainly had (see `keynames.guaranteed`)."""
        return self.offenders_many([(name, hour)], n)[0]

    def _flush_pending(self) -> None:
        if self.tally.pending():
            self.tally.flush()

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit (current and previous windows). A
        leased limit keeps the units other processes' leases may still spend (see
        `lease`)."""
        if limit.batch is not None:
            keys, args = encode_lease_reset(self.prefix, limit, now)
            run_flow(guarded(self.breaker, lease_script().call(keys, args)), self.perform)
            return
        keys, cells = stored_state(self.prefix, limit, lambda: self._now_us(now))
        pipe = self.client.pipeline(transaction=False)
        if keys:
            pipe.delete(*keys)
        for key, field in cells:
            pipe.hdel(key, field)
        pipe.execute()

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name` (its per-minute counters, its offenders),
        as when the policy is deleted: a policy created again under its name starts from
        zero. This process's tally is sent first, or its last counts would come back.
        """
        self.flush()
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(*figure_keys(self.prefix, name, time.time() if now is None else now))
        pipe.execute()

    def _now_us(self, now: float | None) -> int:
        if now is not None:
            return to_us(now)
        seconds, micros = self.client.time()
        return int(seconds) * US + int(micros)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another `period` from now.

        One round trip for all of them. Slots already released or expired stay gone.
        Raises EngineUnavailable when the store is out of reach.
        """
        keys, args = encode_renew(self.prefix, (held for decision in decisions
                                                for held in decision.holding()), now)
        if not keys:
            return
        if self._renew_script is None:  # built on first use: most sites hold no slots
            self._renew_script = self.client.register_script(renew_source())
        try:
            self._renew_script(keys=keys, args=args)
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc

    # -- leases (see engine/lease.py) -------------------------------------------------

    def lease(
        self,
        limits: Sequence[Limit],
        now: float | None = None,
        *,
        back: Sequence[Leftover] = (),
    ) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits` (fixed or sliding window),
        after giving back `back`: one round trip for all of them. A grant has at least the
        limit's cost, or none (`units == 0`, with the window's `retry_after`).

        Raises EngineUnavailable when the store is out of reach, like `evaluate()`.
        """
        return run_flow(self.leasing(limits, now, back), self.perform)

    def leasing(self, limits: Sequence[Limit], now: float | None,
                back: Sequence[Leftover]) -> Flow[list[Grant]]:
        """`lease()` as a flow (see `deciding`)."""
        if not limits and not back:
            return []
        reply = yield from self._lease_call(limits, back, now)
        try:
            return decode_lease(limits, back, reply)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases; a window that has ended keeps its
        count. Returns the units taken back."""
        if not back:
            return 0
        reply = run_flow(self._lease_call((), back, now), self.perform)
        try:
            decode_lease((), back, reply)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        return returned_units(back, reply)

    def _lease_call(self, limits: Sequence[Limit], back: Sequence[Leftover],
                    now: float | None) -> Flow[Any]:
        keys, args = encode_lease(self.prefix, limits, back, now)
        return (yield from guarded(self.breaker, lease_script().call(keys, args)))


def _sent(need: Pipelined) -> Flow[Any]:
    """A flow of one round trip: `need`'s replies."""
    return (yield need)


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw

