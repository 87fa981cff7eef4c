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

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import redis.cluster
from redis.cluster import PRIMARY, ClusterNode
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.constants import STATS_TTL, US
from ratelimits.engine.contract import (
    FIELDS,
    HEAD_ARGS,
    assemble,
    encode,
    lease_source,
    offend_source,
    refund_source,
    renew_source,
    slot_source,
)
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow, run_flow
from ratelimits.engine.keys import (
    base_key,
    cell,
    guaranteed,
    new_token,
    period_us,
    stats_key,
    stored_state,
    to_us,
)
from ratelimits.engine.lease import Grant, Leftover, decode_lease, encode_lease, returned_units
from ratelimits.engine.live import Heartbeat, live_source
from ratelimits.engine.redis_backend import UNAVAILABLE_ERRORS, admit
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.tally import FLUSH_EVERY, Counts, Tally
from ratelimits.engine.types import Decision, Limit

__all__ = [
    "CLUSTER_UNAVAILABLE",
    "FLUSH_EVERY",
    "REFRESH_EVERY",
    "ClusterEngine",
    "cluster_offender_errors_key",
    "cluster_offenders_key",
]

#: After a node failed, the cluster's slot map is read again at most this often (seconds).
REFRESH_EVERY = 0.5
#: How long a windowed limit's call waits for its slot's keys to finish migrating, and
#: how often it looks (seconds): MIGRATE moves a slot's few keys in milliseconds.
_MIGRATION_WAIT = 0.2
_MIGRATION_POLL = 0.005
#: Replies a slot's call answers that mean "not run here, send it again elsewhere".
_REDIRECTS = (NoScriptError, MovedError, AskError, TryAgainError)
#: The cluster client's own failures (no node reachable, no slot owner) are not
#: RedisErrors: they mean the store is out of reach, like a refused connection. So does
#: CLUSTERDOWN (and MASTERDOWN): a node answers it while a slot has no owner it can
#: reach, and for two seconds after a primary restarts, before it serves writes again.
CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, RedisClusterException,
                                             ClusterDownError)
#: What one slot's call may fail with while the other slots' calls still count.
_UNREACHED: tuple[type[Exception], ...] = (*CLUSTER_UNAVAILABLE, EngineUnavailable)
#: slot.lua's reply: admitted, now_us, then per limit the result fields and s1, s2.
_SLOT_HEAD = 2
_PER = FIELDS + 2
_TOKEN = HEAD_ARGS.index("token")
#: The fan-out's ids of the calls that route by their key: the version GET, the heartbeat.
_VERSION, _LIVE = -1, -2


def cluster_offenders_key(prefix: str, name: str, hour: int) -> str:
    """One policy-hour's offenders on a cluster: hash-tagged by the policy, so the list and
    its error hash share a slot and one script updates both."""
    return f"{prefix}s:{{{name}}}:h{hour}"


def cluster_offender_errors_key(prefix: str, name: str, hour: int) -> str:
    return f"{cluster_offenders_key(prefix, name, hour)}:e"


class Fanout:
    """A step's need: run `calls` (slot -> call), each node's in one pipeline, the
    nodes at once; with `reached`, the replies of a fan-out that failed are left there."""

    __slots__ = ("calls", "reached")

    def __init__(self, calls: dict[int, _Call], reached: dict[int, Any] | None = None
                 ) -> None:
        self.calls, self.reached = calls, reached


class _Call:
    """One script call (or, with no script, a GET of `keys[0]`) bound for one slot.
    `windows`: the window keys its windowed limits may touch, undeclared (see `_moved`)."""

    __slots__ = ("args", "keys", "script", "windows")

    def __init__(self, script: Any, keys: list[str], args: list[Any],
                 windows: list[str] | None = None) -> None:
        self.script, self.keys, self.args = script, keys, args
        self.windows = windows or []

    def command(self) -> tuple[Any, ...]:
        """The call as one command of a node's pipeline."""
        if self.script is None:
            return ("GET", self.keys[0])
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


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


class ClusterEngine(Acquiring):
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
        live_key: str | None = None,
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
        self._live = register(live_source())
        #: With a `live_key`, calls carry a heartbeat now and then (see `engine.live`): the
        #: live set is one key on one node, its call one more in the fan-out.
        self.heartbeat = Heartbeat(live_key) if live_key else None
        self._lock = threading.Lock()
        #: counters and offenders: a slot's script may not touch their keys
        self.tally = Tally(self._send)
        # after a node failed, the slot map is read again before the next call (at most
        # once per REFRESH_EVERY): a promoted replica or a moved node is then found
        self._stale = False
        self._refreshed_at = -math.inf
        # nodes an ASK named that the client's slot map lacks (a primary without slots)
        self._strangers: dict[tuple[str, int], Any] = {}

    # -- deciding ---------------------------------------------------------------------

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits, across
        slots: a slot that charged is refunded when another slot refused."""
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        decision: Decision = self._breaking(lambda: self._evaluate(limits, now))
        return decision

    def _evaluate(self, limits: Sequence[Limit], now: float | None) -> Decision:
        decision: Decision = run_flow(self.deciding(limits, now), self.perform)
        return decision

    def deciding(self, limits: Sequence[Limit], now: float | None) -> Flow[Decision]:
        """The decision as a flow that yields each fan-out it needs (`Fanout`): this
        engine runs it with `perform`, the asyncio twin (`engine.aio`) awaits it."""
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
        version_slot = _VERSION
        if self.version_key:
            calls[version_slot] = _Call(None, [self.version_key], [])
        reached: dict[int, Any] = {}
        try:
            replies = yield from self._beating(calls, now, reached)
        except EngineUnavailable:
            yield from self._refund_reached(limits, groups, reached, token)
            raise
        raw, undo, now_us = self._collect(limits, groups, replies)
        admitted = len(undo) == len(groups)
        if not admitted and undo:
            yield from self._refund_slots(limits, groups, undo, token, raw)
        version = None
        if self.version_key:
            v = replies[version_slot]
            version = int(v) if v is not None else 0
        decision = assemble(limits, raw, admitted=admitted, version=version,
                            token=token or None)
        if self.stats and now_us is not None:
            self.tally.add(decision, now_us)
        return decision

    def perform(self, need: Fanout) -> dict[int, Any]:
        """Run one fan-out the flow asked for, in this thread."""
        return self._fanout(need.calls, need.reached)

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

    def _refund_reached(self, limits: Sequence[Limit], groups: dict[int, list[int]],
                        replies: dict[int, Any], token: str) -> Flow[None]:
        """A node was out of reach: the request is undecided, so the slots that charged
        on the nodes reached give it back (best effort: the caller fails either way)."""
        undo = {slot: reply for slot, reply in replies.items()
                if slot in groups and isinstance(reply, list) and reply and reply[0] == 1}
        if not undo:
            return
        raw: list[Any] = [0] * (FIELDS * len(limits))
        with contextlib.suppress(EngineError):  # what stays charged expires by itself
            yield from self._refund_slots(limits, groups, undo, token, raw)

    def _refund_slots(self, limits: Sequence[Limit], groups: dict[int, list[int]],
                      undo: dict[int, list[Any]], token: str, raw: list[Any]
                      ) -> Flow[None]:
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
                key, field = cell(self.prefix, limit)
                keys.append(key)
                args += (limit.algorithm, limit.limit, period_us(limit), spec.burst_of(limit),
                         limit.cost, reply[o + FIELDS], reply[o + FIELDS + 1], field)
                r = i * FIELDS
                raw[r + 1] = int(raw[r + 1]) + limit.cost
                raw[r + 5] = "o"
            if keys:
                charged = [limits[i] for i in groups[slot]]
                calls[slot] = _Call(self._refund, keys, args,
                                    _windows(self.prefix, charged, int(reply[1]) / US))
        yield Fanout(calls)

    # -- the version and the heartbeat ------------------------------------------------

    @property
    def live_instances(self) -> int | None:
        """Processes that beat within the TTL at this one's last beat (None: no beat yet)."""
        return None if self.heartbeat is None else self.heartbeat.count

    def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET, with a heartbeat beside it when one is due
        (the nodes at once)."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        raw = self._breaking(lambda: run_flow(self.reading_version(now), self.perform))
        return int(raw) if raw is not None else 0

    def reading_version(self, now: float | None) -> Flow[Any]:
        """The version's GET as a flow (see `deciding`); the raw value."""
        key = self.version_key or ""  # read_version() made sure there is one
        replies = yield from self._beating({_VERSION: _Call(None, [key], [])}, now)
        return replies[_VERSION]

    def _beating(self, calls: dict[int, _Call], now: float | None,
                 reached: dict[int, Any] | None = None) -> Flow[dict[int, Any]]:
        """The fan-out of `calls`, with the heartbeat's call among them when one is due."""
        beat = self.heartbeat
        if beat is None or not beat.due():
            alone: dict[int, Any] = yield Fanout(calls, reached)
            return alone
        calls[_LIVE] = _Call(self._live, [beat.key], beat.args(now))
        try:
            replies: dict[int, Any] = yield Fanout(calls, reached)
        except EngineError:
            beat.missed()
            raise
        beat.learnt(replies.pop(_LIVE))
        return replies

    # -- the fan-out --------------------------------------------------------------------

    def _fanout(self, calls: dict[int, _Call],
                reached: dict[int, Any] | None = None) -> dict[int, Any]:
        """Run each slot's call, the calls of one node in one pipeline, the nodes at once:
        every node's pipeline is written before any reply is read, so the nodes work in
        parallel and a request waits about one round trip. A call the cluster redirected
        or whose script the node lacked was not run: it goes again (`_follow`).

        A node out of reach fails the whole call with EngineUnavailable, after the other
        nodes' replies were read: with `reached`, they are left there for the caller."""
        if self._stale:
            self.refresh()
        jobs, sent_to = self.route(calls)
        try:
            replies = self._exchange(jobs, calls)
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc
        return self.settle(replies, calls, sent_to, reached)

    def route(self, calls: dict[int, _Call]
              ) -> tuple[list[tuple[Any, list[int]]], dict[int, Any]]:
        """Per node, the slots of `calls` it serves (by the client's slot map: no I/O),
        and each slot's node."""
        by_node: dict[str, tuple[Any, list[int]]] = {}
        sent_to: dict[int, Any] = {}
        get_node = self.client.nodes_manager.get_node_from_slot
        for slot, call in calls.items():
            node = sent_to[slot] = get_node(slot if slot >= 0 else
                                            self.client.keyslot(call.keys[0]))
            by_node.setdefault(node.name, (node, []))[1].append(slot)
        return list(by_node.values()), sent_to

    def settle(self, replies: dict[int, Any], calls: dict[int, _Call],
               sent_to: dict[int, Any], reached: dict[int, Any] | None = None
               ) -> dict[int, Any]:
        """The final replies of a fan-out whose first replies (errors as values) are
        `replies`: the calls redirected or whose script was missing sent again; a node
        out of reach fails the whole call, after the others' replies were read."""
        failed: Exception | None = None
        try:
            self._load_missing(replies, calls, sent_to)
            for slot, reply in replies.items():
                try:
                    replies[slot] = self._follow(reply, calls[slot], sent_to[slot])
                except _UNREACHED as exc:
                    # one node out of reach: the others' replies still count (a slot
                    # that charged is refunded by the caller), the call fails after them
                    replies[slot] = exc
                    failed = failed or exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc
        if failed is not None:
            self._stale = True
            if reached is not None:  # for the caller to refund what the others charged
                reached.update(replies)
            raise EngineUnavailable(str(failed) or type(failed).__name__) from failed
        return replies

    def _follow(self, reply: Any, call: _Call, source: Any) -> Any:
        """A slot's final reply: its call sent again where the cluster redirected it (MOVED,
        ASK, TRYAGAIN); errors raised."""
        if isinstance(reply, CLUSTER_UNAVAILABLE):
            raise reply
        if isinstance(reply, AskError) and not isinstance(reply, MovedError):
            if call.windows:  # (redis-py's MovedError is an AskError)
                self._moved(source, call.windows)
            return self._ask(reply, call)
        if isinstance(reply, _REDIRECTS):
            return self._again(call)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _load_missing(self, replies: dict[int, Any], calls: dict[int, _Call],
                      sent_to: dict[int, Any]) -> None:
        """The calls whose script their node lacked, sent again as EVAL to the same node
        (which keeps the script for the next EVALSHA): one pipeline per node. Not through
        the cluster client: it loads a script on every primary, and fails while any one of
        them is out of reach. Replies replace the NOSCRIPT ones (errors as values)."""
        missing: dict[str, tuple[Any, list[int]]] = {}
        for slot, reply in replies.items():
            if isinstance(reply, NoScriptError):
                node = sent_to[slot]
                missing.setdefault(node.name, (node, []))[1].append(slot)
        for node, slots in missing.values():
            pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
            for slot in slots:
                call = calls[slot]
                pipe.execute_command("EVAL", call.script.script, len(call.keys), *call.keys,
                                     *call.args)
            try:
                again = pipe.execute(raise_on_error=False)
            except CLUSTER_UNAVAILABLE as exc:
                again = [exc] * len(slots)
            replies.update(zip(slots, again, strict=True))

    def _again(self, call: _Call) -> Any:
        """Send a call again through the cluster client (it follows MOVED, loads scripts)."""
        return (self.client.get(call.keys[0]) if call.script is None
                else call.script(keys=call.keys, args=call.args))

    def _ask(self, ask: AskError, call: _Call) -> Any:
        """Send a call that a migrating slot's node answered ASK to the node it names,
        `ASKING` first; through the cluster client when that node answers MOVED (the slot
        moved on meanwhile).

        The engine follows ASK itself because redis-py follows it only to a node of its
        slot map, and a primary just added (`redis-cli --cluster add-node`) is in no slot
        map until it owns a slot: redis-py fails with AttributeError then (redis-py issue
        4015). The script goes as EVAL: the importing node may not have loaded it."""
        node = self.client.get_node(host=ask.host, port=ask.port)
        if node is None:
            with self._lock:
                node = self._strangers.get(ask.node_addr)
                if node is None:
                    node = ClusterNode(ask.host, ask.port, PRIMARY)  # type: ignore[no-untyped-call]
                    self.client.nodes_manager.create_redis_connections([node])
                    self._strangers[ask.node_addr] = node
        pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
        pipe.execute_command("ASKING")
        if call.script is None:
            pipe.execute_command("GET", call.keys[0])
        else:
            pipe.execute_command("EVAL", call.script.script, len(call.keys), *call.keys,
                                 *call.args)
        reply = pipe.execute(raise_on_error=False)[1]
        if isinstance(reply, MovedError):  # the slot finished moving meanwhile
            return self._again(call)
        if isinstance(reply, TryAgainError):  # several keys, not all of them moved yet
            raise EngineUnavailable("a slot is migrating and its keys have not all moved "
                                    "yet; try again")
        if isinstance(reply, Exception):
            raise reply
        return reply

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

    @property
    def stale(self) -> bool:
        """Whether a node failed since the slot map was last read (`refresh()` then)."""
        return self._stale

    def refresh(self) -> None:
        """Read the slot map again (a failover or a reshard moved slots)."""
        with self._lock:
            if time.monotonic() - self._refreshed_at < REFRESH_EVERY:
                return
            self._refreshed_at = time.monotonic()
        try:
            self.client.nodes_manager.initialize()
        except CLUSTER_UNAVAILABLE as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        self._stale = False

    def _exchange(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, _Call]
                  ) -> dict[int, Any]:
        """Write every node's pipeline, then read every reply. Errors are values: a
        script's error for its slot, a node's failure for each slot sent to it (the
        other nodes' replies are still read)."""
        sent: list[tuple[Any, Any, list[int]]] = []
        replies: dict[int, Any] = {}
        broken: list[Any] = []  # connections whose replies may be left unread
        try:
            for node, slots in jobs:
                try:
                    server = self.client.get_redis_connection(node)
                    conn = server.connection_pool.get_connection()
                except CLUSTER_UNAVAILABLE as exc:
                    replies.update((s, exc) for s in slots)
                    continue
                sent.append((server, conn, slots))
                try:
                    conn.send_packed_command(conn.pack_commands(
                        [calls[s].command() for s in slots]))
                except CLUSTER_UNAVAILABLE as exc:
                    replies.update((s, exc) for s in slots)
                    broken.append(conn)
            for server, conn, slots in sent:
                if conn in broken:
                    continue
                for i, slot in enumerate(slots):
                    try:
                        replies[slot] = server.parse_response(conn, "EVALSHA")
                    except redis.ResponseError as exc:
                        replies[slot] = exc
                    except CLUSTER_UNAVAILABLE as exc:
                        replies.update((s, exc) for s in slots[i:])
                        broken.append(conn)
                        break
        except BaseException:
            broken = [conn for _, conn, _ in sent]
            raise
        finally:
            for conn in broken:
                conn.disconnect()
            for server, conn, _ in sent:
                server.connection_pool.release(conn)
        return replies

    # -- counters and offenders, tallied in process ------------------------------------

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision made without the store's script (see `tally`)."""
        self.tally.add(decision, now_us)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute (see `tally`)."""
        self.tally.add_fields(name, now_us, fields)

    def flush(self) -> None:
        """Send the tallied counters and offenders to the cluster now (raises
        EngineUnavailable when it cannot; they stay tallied for the next flush)."""
        self.tally.flush()

    def _send(self, counts: Counts, offenders: Counts) -> None:
        """Pipelined counters, routed by the cluster client, and every policy-hour's
        offenders in one fan-out: a page that flushes first pays one round trip per node,
        not one per policy (a negative id routes by the key)."""
        try:
            if counts:
                pipe = self.client.pipeline()
                for (name, minute), fields in counts.items():
                    key = stats_key(self.prefix, name, minute)
                    for field, n in fields.items():
                        pipe.hincrby(key, field, n)
                    pipe.expire(key, STATS_TTL)
                pipe.execute()
                counts.clear()  # delivered: a failure below must not send them twice
        except (redis.RedisError, RedisClusterException) as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
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
            try:
                self._fanout(calls)
            except EngineError as exc:
                if isinstance(exc, EngineUnavailable):
                    raise
                raise EngineUnavailable(str(exc)) from exc

    def close(self) -> None:
        """Flush what is tallied and stop the engine's threads (also run at exit)."""
        self.tally.close()

    # -- everything else ----------------------------------------------------------------

    #: The slots of `concurrency` limits expire after their period unless renewed.
    slots_expire = True

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

        def now_us() -> int:
            if now is not None:
                return to_us(now)
            node = self.client.get_node_from_key(key)
            seconds, micros = self._guard(self.client.get_redis_connection(node).time)
            return int(seconds) * US + int(micros)

        keys, cells = stored_state(self.prefix, limit, now_us)

        def delete() -> None:
            pipe = self.client.pipeline()  # one slot: the limit's keys share a hash tag
            for key in keys:
                pipe.delete(key)
            for hash_key, field in cells:
                pipe.hdel(hash_key, field)
            pipe.execute()

        self._guard(delete)

    # -- leases (see engine/lease.py) -------------------------------------------------

    _lease_script: Any = None  # registered on first use: most sites lease nothing

    def lease(
        self,
        limits: Sequence[Limit],
        now: float | None = None,
        *,
        back: Sequence[Leftover] = (),
    ) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits` after giving back `back`
        (see `RedisEngine.lease`): one call per slot, the nodes at once."""
        grants, _ = self._leases(limits, back, now)
        return grants

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases (see `RedisEngine.give_back`)."""
        return self._leases((), back, now)[1] if back else 0

    def _leases(self, limits: Sequence[Limit], back: Sequence[Leftover],
                now: float | None) -> tuple[list[Grant], int]:
        if not limits and not back:
            return [], 0
        if self._lease_script is None:
            register: Any = getattr(self.client, "register_script")  # noqa: B009
            self._lease_script = register(lease_source())
        keyslot = self.client.keyslot
        wanted: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (limits, give-backs)
        for i, item in enumerate(back):
            wanted.setdefault(keyslot(base_key(self.prefix, item.limit)), ([], []))[1].append(i)
        for i, limit in enumerate(limits):
            wanted.setdefault(keyslot(base_key(self.prefix, limit)), ([], []))[0].append(i)
        calls: dict[int, _Call] = {}
        parts: dict[int, tuple[list[Limit], list[Leftover]]] = {}
        for slot, (mine, theirs) in wanted.items():
            part = parts[slot] = ([limits[i] for i in mine], [back[i] for i in theirs])
            keys, args = encode_lease(self.prefix, *part, now)
            calls[slot] = _Call(self._lease_script, keys, args,
                                _windows(self.prefix, [*part[0], *(b.limit for b in part[1])],
                                         now))
        replies = self._lease_fanout(calls)
        grants: list[Grant | None] = [None] * len(limits)
        returned = 0
        try:
            for slot, (mine, _) in wanted.items():
                for i, grant in zip(mine, decode_lease(*parts[slot], replies[slot]),
                                    strict=True):
                    grants[i] = grant
                returned += returned_units(parts[slot][1], replies[slot])
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        return [g for g in grants if g is not None], returned

    def _lease_fanout(self, calls: dict[int, _Call]) -> dict[int, Any]:
        """`_fanout()` behind the breaker, as `evaluate()` runs it."""
        replies: dict[int, Any] = self._breaking(lambda: self._fanout(calls))
        return replies

    def _breaking(self, run: Callable[[], Any]) -> Any:
        """`run()` behind the circuit breaker: fails fast while it is open, and counts
        each EngineError (EngineUnavailable included) as a failure."""
        breaker = self.breaker
        admit(breaker)
        try:
            result = run()
        except EngineError:
            if breaker is not None:
                breaker.failure()
            raise
        if breaker is not None:
            breaker.success()
        return result

    @staticmethod
    def _guard(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except CLUSTER_UNAVAILABLE as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
