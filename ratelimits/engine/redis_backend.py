"""The production engine: every limit of a request decided in one call on Redis (FCALL of
the batch function, or EVALSHA of the same script where the server has no Functions).

A decision is pure steps around one command: the command built from the limits
(`contract.encode`), sent and its reply read, the reply read as a Decision
(`contract.decode`). `RedisEngine` sends it on its blocking client, its asyncio twin
(`engine.aio`) awaits it; the steps are the same, the twin's own. A lease is one
command too (`contract.encode_lease`, `decode_lease`). What is rare (the library or
script reloaded, a heartbeat pipelined beside the call, a release) is a flow (`flows`)
that yields the Redis commands it needs (`transport`), run by both."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

import redis

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.breaker import CLOSED, CircuitBreaker
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
    version_args,
)
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow, run_flow
from ratelimits.engine.functions import StoredScript
from ratelimits.engine.heartbeat import Heartbeat, beating
from ratelimits.engine.keynames import (
    US,
    base_key,
    clock_of,
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
    Pipelined,
    Recovering,
    Script,
    admit,
    failed,
    guard,
    guarded,
)
from ratelimits.engine.types import Decision, Limit
from ratelimits.engine.watch import RESET_TTL, ChangeWatch, forget_key, watch_connection
from ratelimits.engine.wire import wire_of

__all__ = ["RedisEngine"]

T = TypeVar("T")


@lru_cache(maxsize=1)
def lease_script() -> Script:
    """The lease script (see `lease`), run by EVALSHA."""
    return Script(lease_source())


class RedisEngine(Acquiring):
    """Decide requests atomically in Redis; safe to share between threads.

    `client` is a redis-py client (django-redis's `get_redis_connection()` hands one
    out). Time comes from the server's clock unless `evaluate()` is given `now`, or from
    this process's with `clock="client"` (`keynames.CLOCKS`: for a server that refuses
    `TIME` in scripts). With a `breaker`, consecutive failures make calls fail fast for its
    cool-down.
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
        clock: str = "store",
    ) -> None:
        self.client: Any = client  # redis-py types sync and async replies as one union
        #: the commands of the request path, on connections kept for them (`Wire`)
        self.wire = wire_of(client)
        self.breaker = breaker
        self.prefix = prefix
        self.version_key = version_key
        #: the time a call sends, given the caller's `now` (`keynames.clock_of`)
        self.when = clock_of(clock)
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

    # -- the request path: pure steps around one command --------------------------------
    #
    # A decision is `batch()` (pure: the command), one command sent and its reply read
    # (`_exchange()`: the breaker, redis-py's errors as the engine's), and `decided()`
    # (pure: the reply as a Decision). The asyncio twin (`engine.aio`) takes the same
    # pure steps and differs in `_exchange()` alone. What is rare (a beat riding along,
    # the function or script the server lost) runs as a flow (`flows`) that both run.

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        now = self.when(now)
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        command, token, chores = self.batch(limits, now)
        try:
            reply = self._exchange(command, chores, now, self.script)
        except EngineError as exc:
            self.unsent(limits, token, chores, exc)
            raise
        return self.decided(limits, reply, token)

    def batch(self, limits: Sequence[Limit], now: float | None
              ) -> tuple[tuple[Any, ...], str | None, Chores | None]:
        """The batch call of `limits` as one command, the token drawn for it, and the
        chores riding on it (None: none due, the common case)."""
        keys, args, token = encode(limits, prefix=self.prefix, now=now,
                                   version_key=self.version_key, stats=self.stats)
        beat = self.heartbeat
        if time.monotonic() < self.tally.due_at and (beat is None or beat.clock() < beat.next_at):
            return (*self.script.head, len(keys), *keys, *args), token, None
        chores = self._chores()
        if chores is not None and chores.carried is not None:
            # counts made in process ride along, their keys declared
            carried_keys, carried = carry(self.prefix, *chores.carried)
            keys += carried_keys
            args += carried
        return (*self.script.head, len(keys), *keys, *args), token, chores

    def _chores(self) -> Chores | None:
        """The tallied counts and the beat that are due (claimed), if any."""
        carried = self.tally.take() if self.stats and self.tally.due() else None
        beat = self.heartbeat if self.heartbeat is not None and self.heartbeat.due() else None
        return None if carried is None and beat is None else Chores(carried, beat)

    def decided(self, limits: Sequence[Limit], reply: Any, token: str | None) -> Decision:
        """The batch call's reply as a Decision, counted in the tally."""
        try:
            decision = decode(limits, reply, versioned=bool(self.version_key), token=token)
        except ValueError as exc:  # the script ran: its reply is what went wrong
            error = EngineError(str(exc))
            note_taken(limits, token, error)
            raise error from exc
        if self.stats:
            self.tally.add(decision, reply[2])
        return decision

    def unsent(self, limits: Sequence[Limit], token: str | None, chores: Chores | None,
               exc: EngineError) -> None:
        """The batch call failed with `exc`: the counts it carried wait for the next one,
        and the slots it takes if the store ran it anyway are noted on `exc`."""
        if chores is not None and chores.carried is not None:
            self.tally.restore(*chores.carried)
        note_taken(limits, token, exc)

    def _exchange(self, command: tuple[Any, ...], chores: Chores | None, now: float | None,
                 script: Recovering | None) -> Any:
        """Send `command` (a call of `script`, which the server may have lost, or a plain
        command) with its chores and read its reply, behind the circuit breaker; redis
        errors raised as the engine's (`transport.failed`)."""
        breaker = self.breaker
        if breaker is not None and breaker.state != CLOSED:
            admit(breaker)
        try:
            if chores is None or chores.beat is None:
                try:
                    reply = self.wire.call(command)
                except redis.ResponseError as exc:
                    if script is None:
                        raise
                    reply = run_flow(script.recovering(exc, command[2:]), self.perform)
            else:
                reply = run_flow(beating_call(chores.beat, command, now, script), self.perform)
        except redis.RedisError as exc:
            raise failed(exc, breaker) from exc
        if breaker is not None and not breaker.clear:
            breaker.success()
        return reply

    @property
    def live_instances(self) -> int | None:
        """Processes that beat within the TTL at this one's last beat (None: no beat yet)."""
        return None if self.heartbeat is None else self.heartbeat.count

    def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET, carrying a heartbeat when one is due."""
        now = self.when(now)
        command, chores = self.version_read()
        return version_of(self._exchange(command, chores, now, None))

    def version_read(self) -> tuple[tuple[Any, ...], Chores | None]:
        """The GET of the version, and the beat riding on it (None: none due)."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        beat = self.heartbeat
        if beat is None or not beat.due():
            return ("GET", self.version_key), None
        return ("GET", self.version_key), Chores(None, beat)

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one round trip)."""
        run_flow(self.releasing(decision), self.perform)

    def releasing(self, decision: Decision) -> Flow[None]:
        """`release()` as a flow (run by this engine, awaited by its asyncio twin),
        behind the circuit breaker like any call: while the store is out of reach it
        raises EngineUnavailable (at once while the circuit is open), so the caller
        knows the slots are still held and may try again (the pipeline's watchdog
        does)."""
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
        bump = self.client.register_script(version_source())
        # INCR, from the clock when the key was lost (lua/version.lua)
        args = version_args(self.when(None))
        return int(guard(lambda: bump(keys=[self.version_key], args=args)))

    # -- changes every process must hear (see `watch`) ----------------------------------

    def watch(self) -> ChangeWatch | None:
        """A connection of its own that hears the policy version written, an operator's
        reset and a flush (not opened yet); None without a version key."""
        if not self.version_key:
            return None
        return ChangeWatch(watch_connection(self.client.connection_pool), self.version_key)

    def announce_reset(self, name: str) -> None:
        """Tell every process's watch that clients of policy `name` were reset, so that
        none answers them from what it remembers (the key is its own message)."""
        if self.version_key:
            key = forget_key(self.version_key, name)
            guard(lambda: self.client.set(key, 1, ex=RESET_TTL))

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
            keys, args = encode_lease_reset(self.prefix, limit, self.when(now))
            script = lease_script()
            self._exchange(script.command(keys, args), None, now, script)
            return
        keys, cells = stored_state(self.prefix, limit, lambda: self._now_us(self.when(now)))
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
        now = self.when(now)
        keys, args = encode_renew(self.prefix, (held for decision in decisions
                                                for held in decision.holding()), now)
        if not keys:
            return
        if self._renew_script is None:  # built on first use: most sites hold no slots
            self._renew_script = self.client.register_script(renew_source())
        renew = self._renew_script
        guard(lambda: renew(keys=keys, args=args))

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
        now = self.when(now)
        if not limits and not back:
            return []
        script = lease_script()
        command = script.command(*encode_lease(self.prefix, limits, back, now))
        return granted(limits, back, self._exchange(command, None, now, script))

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases; a window that has ended keeps its
        count. Returns the units taken back."""
        now = self.when(now)
        if not back:
            return 0
        script = lease_script()
        reply = self._exchange(script.command(*encode_lease(self.prefix, (), back, now)),
                               None, now, script)
        granted((), back, reply)
        return returned_units(back, reply)


class Chores:
    """What rides on a call besides its command, when due: tallied counts (`carried`,
    in the command's ARGV) and a heartbeat (`beat`, pipelined beside it)."""

    __slots__ = ("beat", "carried")

    def __init__(self, carried: tuple[Counts, Counts] | None, beat: Heartbeat | None) -> None:
        self.carried, self.beat = carried, beat


def beating_call(beat: Heartbeat, command: tuple[Any, ...], now: float | None,
                 script: Recovering | None) -> Flow[Any]:
    """`command` and the beat that is due, in one round trip: its reply; a call of
    `script` that the server lacked made again once it is loaded."""
    reply = yield from beating(beat, command, now)
    if not isinstance(reply, Exception):
        return reply
    if script is None:
        raise reply
    return (yield from script.recovering(reply, command[2:]))


def granted(limits: Sequence[Limit], back: Sequence[Leftover], reply: Any) -> list[Grant]:
    """The lease script's reply as one Grant per limit (`contract.decode_lease`)."""
    try:
        return decode_lease(limits, back, reply)
    except ValueError as exc:
        raise EngineError(str(exc)) from exc


def version_of(raw: Any) -> int:
    """The policy version a GET answered (0 before the first bump)."""
    return int(raw) if raw is not None else 0


def _sent(need: Pipelined) -> Flow[Any]:
    """A flow of one round trip: `need`'s replies."""
    return (yield need)


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw

