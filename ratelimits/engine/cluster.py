"""The engine on Redis Cluster: a request's limits decided per hash slot, all at once.

Each policy-and-client has its own hash tag, so one request's limits may live on several
primaries. `ClusterEngine` groups them by slot, runs `lua/slot.lua` once per slot (the
calls of one node in one pipeline, the nodes concurrently), and keeps all-or-nothing
charging across slots with a compensating refund (`lua/refund.lua`) to the slots that
charged when another slot refused. The per-minute counters and the offenders are
tallied in process and flushed at most every second, because a slot's script may not
touch keys of other slots. See the README's "Redis Cluster" section for what a
concurrent observer can see between a charge and its refund.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.cluster
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.constants import OFFENDER_CHARS, STATS_TTL, US
from ratelimits.engine.contract import (
    FIELDS,
    HEAD_ARGS,
    assemble,
    encode,
    offend_source,
    refund_source,
    renew_source,
    slot_source,
)
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.keys import base_key, guaranteed, new_token, period_us, stats_key, to_us
from ratelimits.engine.redis_backend import UNAVAILABLE_ERRORS
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Decision, Limit

__all__ = [
    "FLUSH_EVERY",
    "REFRESH_EVERY",
    "ClusterEngine",
    "cluster_offender_errors_key",
    "cluster_offenders_key",
]

#: Tallied counters and offenders reach the cluster at most this late (seconds).
FLUSH_EVERY = 1.0
#: After a node failed, the cluster's slot map is read again at most this often (seconds).
REFRESH_EVERY = 0.5
#: How long a windowed limit's call waits for its slot's keys to finish migrating, and
#: how often it looks (seconds): MIGRATE moves a slot's few keys in milliseconds.
_MIGRATION_WAIT = 0.2
_MIGRATION_POLL = 0.005
#: Replies a slot's call answers that mean "not run here, send it again elsewhere".
_REDIRECTS = (NoScriptError, MovedError, AskError, TryAgainError)
#: The cluster client's own failures (no node reachable, no slot owner) are not
#: RedisErrors: they mean the store is out of reach, like a refused connection.
_UNAVAILABLE: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, RedisClusterException)
#: slot.lua's reply: admitted, now_us, then per limit the result fields and s1, s2.
_SLOT_HEAD = 2
_PER = FIELDS + 2
_TOKEN = HEAD_ARGS.index("token")


def cluster_offenders_key(prefix: str, name: str, hour: int) -> str:
    """One policy-hour's offenders on a cluster: hash-tagged by the policy, so the list and
    its error hash share a slot and one script updates both."""
    return f"{prefix}s:{{{name}}}:h{hour}"


def cluster_offender_errors_key(prefix: str, name: str, hour: int) -> str:
    return f"{cluster_offenders_key(prefix, name, hour)}:e"


class _Call:
    """One script call (or, with no script, a GET of `keys[0]`) bound for one slot.
    `windows`: the window keys its windowed limits may touch, undeclared (see `_moved`)."""

    __slots__ = ("args", "keys", "script", "windows")

    def __init__(self, script: Any, keys: list[str], args: list[Any],
                 windows: list[str] | None = None) -> None:
        self.script, self.keys, self.args = script, keys, args
        self.windows = windows or []


def _windows(prefix: str, limits: Sequence[Limit], now: float | None) -> list[str]:
    """The window keys of the windowed limits about `now` (this clock when None: one
    window either side covers a server clock that differs by less than a period)."""
    at = to_us(time.time() if now is None else now)
    out: list[str] = []
    for limit in limits:
        if REGISTRY[limit.algorithm].windowed:
            key, period = base_key(prefix, limit), period_us(limit)
            win = math.floor(at / period)
            out += (f"{key}:{w}" for w in (win - 1, win, win + 1))
    return out


class ClusterEngine:
    """Same API as `RedisEngine`, on a `redis.cluster.RedisCluster` client. Thread-safe.

    Time: each slot's script reads its own node's clock (`TIME`) unless `evaluate()` is
    given `now`; every key lives on one node, so each key's state sees one clock.
    """

    def __init__(
        self,
        client: redis.cluster.RedisCluster,
        *,
        prefix: str = "rl:",
        version_key: str | None = None,
        stats: bool = True,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.client: Any = client
        self.prefix = prefix
        self.version_key = version_key
        self.stats = stats
        self.breaker = breaker
        # redis-py's stubs type register_script for Redis only; RedisCluster has it too
        register: Any = getattr(client, "register_script")  # noqa: B009
        self._slot = register(slot_source())
        self._refund = register(refund_source())
        self._renew = register(renew_source())
        self._offend = register(offend_source())
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        # the tally: (name, minute) -> field -> n; (name, hour) -> who -> n
        self._counts: dict[tuple[str, int], dict[str, int]] = {}
        self._offenders: dict[tuple[str, int], dict[str, int]] = {}
        self._flushed_at = time.monotonic()
        self._flushing = False
        self._closing = threading.Event()
        # after a node failed, the slot map is read again before the next call (at most
        # once per REFRESH_EVERY): a promoted replica or a moved node is then found
        self._stale = False
        self._refreshed_at = -math.inf
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- deciding ---------------------------------------------------------------------

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits, across
        slots: a slot that charged is refunded when another slot refused."""
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        breaker = self.breaker
        if breaker is not None and not breaker.allow():
            raise EngineUnavailable("circuit open after repeated store failures")
        try:
            decision = self._evaluate(limits, now)
        except EngineUnavailable:
            if breaker is not None:
                breaker.failure()
            raise
        except EngineError:
            if breaker is not None:
                breaker.failure()
            raise
        if breaker is not None:
            breaker.success()
        return decision

    def _evaluate(self, limits: Sequence[Limit], now: float | None) -> Decision:
        token = ""
        groups: dict[int, list[int]] = {}  # slot -> indexes of its limits
        keyslot = self.client.keyslot
        for i, limit in enumerate(limits):
            groups.setdefault(keyslot(base_key(self.prefix, limit)), []).append(i)
            if not token and REGISTRY[limit.algorithm].stores_members:
                token = new_token()
        calls: dict[int, _Call] = {}
        for slot, indexes in groups.items():
            mine = [limits[i] for i in indexes]
            keys, args, _ = encode(mine, prefix=self.prefix, now=now, stats=False)
            args[_TOKEN] = token  # one token for the whole request: release() names it
            calls[slot] = _Call(self._slot, keys, args, _windows(self.prefix, mine, now))
        version_slot = -1
        if self.version_key:
            calls[version_slot] = _Call(None, [self.version_key], [])
        replies = self._fanout(calls)
        raw, undo, now_us = self._collect(limits, groups, replies)
        admitted = len(undo) == len(groups)
        if not admitted and undo:
            self._refund_slots(limits, groups, undo, token, raw)
        version = None
        if self.version_key:
            v = replies[version_slot]
            version = int(v) if v is not None else 0
        decision = assemble(limits, raw, admitted=admitted, version=version,
                            token=token or None)
        if self.stats and now_us is not None:
            self._tally(decision, now_us)
        return decision

    @staticmethod
    def _collect(limits: Sequence[Limit], groups: dict[int, list[int]],
                 replies: dict[int, Any]) -> tuple[list[Any], dict[int, list[Any]], int | None]:
        """The slots' replies laid out per limit in the request's order; the replies of the
        slots that charged; the first slot's time (µs)."""
        raw: list[Any] = [None] * (FIELDS * len(limits))
        undo: dict[int, list[Any]] = {}
        now_us: int | None = None
        for slot, indexes in groups.items():
            reply = replies[slot]
            if not isinstance(reply, list) or len(reply) != _SLOT_HEAD + _PER * len(indexes):
                raise EngineError(f"unexpected reply from the slot script: {reply!r}")
            if now_us is None:
                now_us = int(reply[1])
            if reply[0] == 1:
                undo[slot] = reply
            for j, i in enumerate(indexes):
                o = _SLOT_HEAD + j * _PER
                raw[i * FIELDS:(i + 1) * FIELDS] = reply[o:o + FIELDS]
        return raw, undo, now_us

    def _refund_slots(self, limits: Sequence[Limit], groups: dict[int, list[int]],
                      undo: dict[int, list[Any]], token: str, raw: list[Any]) -> None:
        """Give back what the admitting slots charged, at the time they charged; their
        limits' outcomes become SPARED, with the units they took counted as remaining."""
        calls: dict[int, _Call] = {}
        for slot, reply in undo.items():
            keys: list[str] = []
            args: list[Any] = [reply[1], token]
            for j, i in enumerate(groups[slot]):
                o = _SLOT_HEAD + j * _PER
                if _text(reply[o + 5]) != "a":
                    continue
                limit = limits[i]
                spec = REGISTRY[limit.algorithm]
                keys.append(base_key(self.prefix, limit))
                args += (limit.algorithm, limit.limit, period_us(limit), spec.burst_of(limit),
                         limit.cost, reply[o + FIELDS], reply[o + FIELDS + 1])
                r = i * FIELDS
                raw[r + 1] = int(raw[r + 1]) + limit.cost
                raw[r + 5] = "o"
            if keys:
                charged = [limits[i] for i in groups[slot]]
                calls[slot] = _Call(self._refund, keys, args,
                                    _windows(self.prefix, charged, int(reply[1]) / US))
        self._fanout(calls)

    # -- the fan-out --------------------------------------------------------------------

    def _fanout(self, calls: dict[int, _Call]) -> dict[int, Any]:
        """Run each slot's call, the calls of one node in one pipeline, the nodes at once:
        every node's pipeline is written before any reply is read, so the nodes work in
        parallel and a request waits about one round trip. A call the cluster redirected
        (MOVED, ASK, TRYAGAIN) or whose script the node lacked was not run: it goes again
        through the cluster client, which follows redirects and loads scripts."""
        if self._stale:
            self._refresh()
        by_node: dict[str, tuple[Any, list[int]]] = {}
        sent_to: dict[int, Any] = {}
        get_node = self.client.nodes_manager.get_node_from_slot
        for slot, call in calls.items():
            node = sent_to[slot] = get_node(slot if slot >= 0 else
                                            self.client.keyslot(call.keys[0]))
            by_node.setdefault(node.name, (node, []))[1].append(slot)
        try:
            replies = self._exchange(list(by_node.values()), calls)
            for slot, reply in replies.items():
                if isinstance(reply, _REDIRECTS):
                    call = calls[slot]
                    if isinstance(reply, AskError) and call.windows:
                        self._moved(sent_to[slot], call.windows)
                    replies[slot] = (self.client.get(call.keys[0]) if call.script is None
                                     else call.script(keys=call.keys, args=call.args))
                elif isinstance(reply, Exception):
                    raise reply
        except _UNAVAILABLE as exc:
            self._stale = True
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc
        return replies

    def _moved(self, source: Any, windows: list[str]) -> None:
        """Wait (briefly) until a migrating slot's window keys have left `source`.

        A node sends ASK for a migrating slot when a call's *declared* keys are missing.
        A windowed limit declares its base key, which never exists: its counts live in
        undeclared window keys, which may still be on the source. Run on the importing
        node then, the call would start the window from zero beside the real count. So
        the call follows the ASK only once the source holds none of its window keys (a
        multi-key EXISTS there answers ASK when all are gone, TRYAGAIN when some are);
        a node never takes back a key of a slot it is migrating, so none can return."""
        server = self.client.get_redis_connection(source)
        deadline = time.monotonic() + _MIGRATION_WAIT
        while True:
            try:
                if not server.exists(*windows):
                    return
            except (AskError, MovedError):
                return
            except TryAgainError:
                pass
            if time.monotonic() >= deadline:
                raise EngineUnavailable("a slot is migrating and its window keys have not "
                                        "moved yet; try again")
            time.sleep(_MIGRATION_POLL)

    def _refresh(self) -> None:
        """Read the slot map again (a failover or a reshard moved slots)."""
        with self._lock:
            if time.monotonic() - self._refreshed_at < REFRESH_EVERY:
                return
            self._refreshed_at = time.monotonic()
        try:
            self.client.nodes_manager.initialize()
        except _UNAVAILABLE as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        self._stale = False

    def _exchange(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, _Call]
                  ) -> dict[int, Any]:
        """Write every node's pipeline, then read every reply (errors as values)."""
        sent: list[tuple[Any, Any, list[int]]] = []
        replies: dict[int, Any] = {}
        try:
            for node, slots in jobs:
                server = self.client.get_redis_connection(node)
                conn = server.connection_pool.get_connection()
                sent.append((server, conn, slots))
                conn.send_packed_command(conn.pack_commands(
                    [("GET", calls[s].keys[0]) if calls[s].script is None else
                     ("EVALSHA", calls[s].script.sha, len(calls[s].keys), *calls[s].keys,
                      *calls[s].args) for s in slots]))
            for server, conn, slots in sent:
                for slot in slots:
                    try:
                        replies[slot] = server.parse_response(conn, "EVALSHA")
                    except redis.ResponseError as exc:
                        replies[slot] = exc
        except BaseException:
            for _, conn, _ in sent:  # replies may be left unread: never reuse them
                conn.disconnect()
            raise
        finally:
            for server, conn, _ in sent:
                server.connection_pool.release(conn)
        return replies

    def _executor(self) -> ThreadPoolExecutor:
        # the flush runs beside requests, not in front of one
        if self._pool is None or self._pool_pid != os.getpid():  # threads do not survive fork
            with self._lock:
                if self._pool is None or self._pool_pid != os.getpid():
                    self._pool = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="ratelimits-flush")
                    self._pool_pid = os.getpid()
        return self._pool

    # -- counters and offenders, tallied in process ------------------------------------

    def _tally(self, decision: Decision, now_us: int) -> None:
        minute = math.floor(now_us / (60 * US))
        hour = math.floor(now_us / (3600 * US))
        with self._lock:
            for result in decision.results:
                name = result.limit.name
                if not name:
                    continue
                field = result.outcome.value
                counts = self._counts.setdefault((name, minute), {})
                counts[field] = counts.get(field, 0) + 1
                if field in ("r", "w"):
                    who = result.limit.key[:OFFENDER_CHARS]
                    offenders = self._offenders.setdefault((name, hour), {})
                    offenders[who] = offenders.get(who, 0) + 1
            # one flush pending at a time: at once when the last one is a second old, else
            # when it will be, so a process that goes quiet still sends its last counts
            schedule = not self._flushing
            if schedule:
                self._flushing = True
                wait = max(0.0, FLUSH_EVERY - (time.monotonic() - self._flushed_at))
        if schedule:
            self._executor().submit(self._flush_quietly, wait)

    def _flush_quietly(self, wait: float = 0.0) -> None:
        if wait:
            self._closing.wait(wait)  # close() cuts the wait short and flushes
        with contextlib.suppress(EngineError):  # the tally was put back for the next one
            self.flush()

    def flush(self) -> None:
        """Send the tallied counters and offenders to the cluster now (pipelined, routed
        by the cluster client). On failure they stay tallied for the next flush."""
        with self._lock:
            counts, self._counts = self._counts, {}
            offenders, self._offenders = self._offenders, {}
            self._flushed_at = time.monotonic()
        try:
            if counts:
                pipe = self.client.pipeline()
                for (name, minute), fields in counts.items():
                    key = stats_key(self.prefix, name, minute)
                    for field, n in fields.items():
                        pipe.hincrby(key, field, n)
                    pipe.expire(key, STATS_TTL)
                pipe.execute()
                counts = {}
            # every policy-hour's script in one fan-out: a page that flushes first pays one
            # round trip per node, not one per policy (a negative id routes by the key)
            calls: dict[int, _Call] = {}
            for i, ((name, hour), whos) in enumerate(offenders.items()):
                args: list[Any] = []
                for who, n in whos.items():
                    args += (who.encode("utf-8", "surrogatepass"), n)
                calls[-2 - i] = _Call(self._offend,
                                      [cluster_offenders_key(self.prefix, name, hour),
                                       cluster_offender_errors_key(self.prefix, name, hour)],
                                      args)
            if calls:
                self._fanout(calls)
            offenders = {}
        except (redis.RedisError, RedisClusterException, EngineError) as exc:
            self._restore(counts, offenders)
            if isinstance(exc, EngineUnavailable):
                raise
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        finally:
            self._flushing = False

    def _restore(self, counts: dict[tuple[str, int], dict[str, int]],
                 offenders: dict[tuple[str, int], dict[str, int]]) -> None:
        with self._lock:
            for tally, back in ((self._counts, counts), (self._offenders, offenders)):
                for k, fields in back.items():
                    mine = tally.setdefault(k, {})
                    for f, n in fields.items():
                        mine[f] = mine.get(f, 0) + n

    def close(self) -> None:
        """Flush what is tallied and stop the engine's threads (also run at exit)."""
        self._closing.set()
        with contextlib.suppress(EngineError):
            self.flush()
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=True)

    # -- everything else ----------------------------------------------------------------

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds."""
        if decision.token is None or (self.breaker and self.breaker.state != "closed"):
            return  # the slots expire by themselves after their period
        pipe = self.client.pipeline()
        for limit, members in decision.holding():
            pipe.zrem(base_key(self.prefix, limit), *members)
        self._guard(pipe.execute)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another `period` from now: one call per
        slot, the nodes at once. Slots already released or expired stay gone."""
        head: list[Any] = ["" if now is None else to_us(now)]
        calls: dict[int, _Call] = {}
        for decision in decisions:
            for limit, members in decision.holding():
                key = base_key(self.prefix, limit)
                call = calls.setdefault(self.client.keyslot(key), _Call(self._renew, [], head[:]))
                call.keys.append(key)
                call.args += (period_us(limit), len(members), *members)
        if calls:
            self._fanout(calls)

    def bump_version(self) -> int:
        """Tell every process that the policies changed; returns the new version."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        return int(self._guard(lambda: self.client.incr(self.version_key)))

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute, this process's tally flushed
        first (other processes' arrive within `FLUSH_EVERY`)."""
        return self.counters_many([(name, minute)])[0]

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs in one pipelined fan-out."""
        self.flush()
        pipe = self.client.pipeline()
        for name, minute in wanted:
            pipe.hgetall(stats_key(self.prefix, name, minute))
        return [{_text(k): int(v) for k, v in raw.items()} for raw in self._guard(pipe.execute)]

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most in one hour, by guaranteed count."""
        return self.offenders_many([(name, hour)], n)[0]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs in one pipelined fan-out."""
        self.flush()
        pipe = self.client.pipeline()
        for name, hour in wanted:
            pipe.zrange(cluster_offenders_key(self.prefix, name, hour), 0, -1, withscores=True)
            pipe.hgetall(cluster_offender_errors_key(self.prefix, name, hour))
        replies = self._guard(pipe.execute)
        return [
            guaranteed({_text(k): int(v) for k, v in raw},
                       {_text(k): int(v) for k, v in errors.items()}, n)
            for raw, errors in zip(replies[::2], replies[1::2], strict=True)
        ]

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit (current and previous windows)."""
        key = base_key(self.prefix, limit)
        if not REGISTRY[limit.algorithm].windowed:
            self._guard(lambda: self.client.delete(key))
            return
        if now is None:
            node = self.client.get_node_from_key(key)
            seconds, micros = self._guard(self.client.get_redis_connection(node).time)
            now_us = seconds * US + micros
        else:
            now_us = to_us(now)
        win = math.floor(now_us / period_us(limit))
        self._guard(lambda: self.client.delete(key, f"{key}:{win}", f"{key}:{win - 1}"))

    @staticmethod
    def _guard(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except _UNAVAILABLE as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc


def _close_at_exit(ref: weakref.ref[ClusterEngine]) -> None:
    engine = ref()
    if engine is not None:
        engine.close()


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
