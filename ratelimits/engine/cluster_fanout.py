"""Redis Cluster's slot fan-out, written once as a flow (`flows`) and run two ways.

A fan-out runs one call per hash slot (`SlotCall`), the calls of one node in one
pipeline, the nodes at once: every node's pipeline is written before any reply is read,
so a request waits about one round trip. What a cluster answers while it changes is
settled here too: a call whose script its node lost goes again as EVAL, a MOVED or a
TRYAGAIN again through the cluster client, an ASK to the node it names; a node out of
reach fails the fan-out after the other nodes' replies were read, and the slot map is
read again before the next one.

`SlotFanout.run` is the flow. It yields what it needs done on the nodes (`Exchange`,
a `transport.Pipelined` to one node), by the blocking cluster client (`OnClient`) or by
time (`Pause`): `SlotFanout.perform` does it in the calling thread,
`engine.aio.AsyncNodes` on the event loop, so `ClusterEngine` and its asyncio twin
differ only there. Store errors mean what they mean everywhere in the engine
(`transport.engine_error`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.cluster import PRIMARY, ClusterNode
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    TryAgainError,
)

from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow
from ratelimits.engine.keynames import base_key, cell, lock_key, to_us, windows
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.transport import UNAVAILABLE_ERRORS, Pipelined
from ratelimits.engine.types import Limit
from ratelimits.engine.wire import wire_of

__all__ = [
    "REFRESH_EVERY",
    "Exchange",
    "Need",
    "OnClient",
    "Pause",
    "SlotCall",
    "SlotFanout",
    "window_keys",
]

#: After a node failed, the cluster's slot map is read again at most this often (seconds).
REFRESH_EVERY = 0.5
#: How long a windowed limit's call waits for its slot's keys to finish migrating, and
#: how often it looks (seconds): MIGRATE moves a slot's few keys in milliseconds.
_MIGRATION_WAIT = 0.2
_MIGRATION_POLL = 0.005
#: Replies a slot's call answers that mean "not run here, send it again elsewhere".
_REDIRECTS = (NoScriptError, MovedError, AskError, TryAgainError)
#: What one slot's call may fail with while the other slots' calls still count.
_UNREACHED: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, EngineUnavailable)


class SlotCall:
    """One script call (or, with no script, a GET of `keys[0]`) bound for one slot.
    `windows`: the window keys its windowed limits may touch (see `_moved`)."""

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

    def source_command(self) -> tuple[Any, ...]:
        """The call with its script's source (EVAL), for a node that may lack the script."""
        if self.script is None:
            return ("GET", self.keys[0])
        return ("EVAL", self.script.script, len(self.keys), *self.keys, *self.args)


def window_keys(prefix: str, limits: Sequence[Limit], now: float | None) -> list[str]:
    """The keys the slot script reaches beyond its base keys: the window keys of the
    windowed limits about `now` (this clock when None: one window either side covers a
    server clock that differs by less than a period), and lockouts' keys."""
    at = to_us(time.time() if now is None else now)
    out: list[str] = []
    for limit in limits:
        if REGISTRY[limit.algorithm].windowed:
            key, field = cell(prefix, limit)
            out += [f"{key}:{w}" for w in windows(limit, at, ahead=True)]
        else:
            key, field = base_key(prefix, limit), ""
        if limit.lockout:
            out.append(lock_key(key, field))
    return out


# -- what the flow needs done -------------------------------------------------------------


class Exchange:
    """Each node's calls in one pipeline, the nodes at once (`jobs`: each node and its
    slots of `calls`). The flow is sent each slot's reply, errors as values: a script's
    error for its slot, a node's failure for each slot sent to it."""

    __slots__ = ("calls", "jobs")

    def __init__(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, SlotCall]
                 ) -> None:
        self.jobs, self.calls = jobs, calls


class OnClient:
    """A call of the blocking cluster client (it routes by key, follows MOVED, loads
    scripts, reads the slot map); an async driver runs it in a worker thread."""

    __slots__ = ("call",)

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call


class Pause:
    """Seconds to wait before looking again."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Need = Exchange | Pipelined | OnClient | Pause


# -- the flow ---------------------------------------------------------------------------


class SlotFanout:
    """The fan-out over one cluster client, and what it keeps between fan-outs: whether
    the slot map is stale, the nodes an ASK named that the slot map lacks. Thread-safe."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._lock = threading.Lock()
        # after a node failed, the slot map is read again before the next call (at most
        # once per REFRESH_EVERY): a promoted replica or a moved node is then found
        self._stale = False
        self._refreshed_at = -math.inf
        # nodes an ASK named that the client's slot map lacks (a primary without slots)
        self._strangers: dict[tuple[str, int], Any] = {}
        # the hash slot of each rider's key (see `route`)
        self._riders: dict[str, int] = {}

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
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        self._stale = False

    def run(self, calls: dict[int, SlotCall], reached: dict[int, Any] | None = None,
            rider: tuple[int, SlotCall] | None = None) -> Flow[dict[int, Any]]:
        """Each slot's final reply to its call (`calls`: slot -> call; a negative id routes
        by its call's first key). A call the cluster redirected or whose script the node
        lacked was not run: it goes again (`_follow`). `rider` (an id and its call) goes
        only where it costs no node more: to a node `calls` already reach, or alone when
        there are none; its reply is there only when it went.

        A node out of reach fails the whole fan-out with EngineUnavailable, after the
        other nodes' replies were read: with `reached`, they are left there for the
        caller (to refund what they charged)."""
        if self._stale:
            yield OnClient(self.refresh)
        jobs, sent_to = self.route(calls, rider)
        try:
            replies: dict[int, Any] = yield Exchange(jobs, calls)
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc
        for reply in replies.values():
            if isinstance(reply, Exception):
                return (yield from self._settle(replies, calls, sent_to, reached))
        return replies  # the usual case: every call ran where it was sent

    def route(self, calls: dict[int, SlotCall], rider: tuple[int, SlotCall] | None = None
              ) -> tuple[list[tuple[Any, list[int]]], dict[int, Any]]:
        """Per node, the slots of `calls` it serves (by the client's slot map: no I/O),
        and each slot's node; `rider` among them where it costs no node more (see `run`),
        added to `calls` then."""
        by_node: dict[str, tuple[Any, list[int]]] = {}
        sent_to: dict[int, Any] = {}
        get_node = self.client.nodes_manager.get_node_from_slot
        for slot, call in calls.items():
            node = sent_to[slot] = get_node(slot if slot >= 0 else
                                            self.client.keyslot(call.keys[0]))
            by_node.setdefault(node.name, (node, []))[1].append(slot)
        if rider is not None:
            slot, call = rider
            key = call.keys[0]
            at = self._riders.get(key)
            if at is None:  # a rider's key is the same call after call: its slot kept
                at = self._riders[key] = self.client.keyslot(key)
            node = get_node(at)
            if not by_node or node.name in by_node:
                calls[slot], sent_to[slot] = call, node
                by_node.setdefault(node.name, (node, []))[1].append(slot)
        return list(by_node.values()), sent_to

    def _settle(self, replies: dict[int, Any], calls: dict[int, SlotCall],
                sent_to: dict[int, Any], reached: dict[int, Any] | None
                ) -> Flow[dict[int, Any]]:
        """The final replies of a fan-out whose first replies (errors as values) are
        `replies`: the calls redirected or whose script was missing sent again; a node
        out of reach fails the whole call, after the others' replies were read."""
        failed: Exception | None = None
        try:
            yield from self._load_missing(replies, calls, sent_to)
            for slot, reply in replies.items():
                try:
                    replies[slot] = yield from self._follow(reply, calls[slot], sent_to[slot])
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

    def _follow(self, reply: Any, call: SlotCall, source: Any) -> Flow[Any]:
        """A slot's final reply: its call sent again where the cluster redirected it (MOVED,
        ASK, TRYAGAIN); errors raised."""
        if isinstance(reply, UNAVAILABLE_ERRORS):
            raise reply
        if isinstance(reply, AskError) and not isinstance(reply, MovedError):
            if call.windows:  # (redis-py's MovedError is an AskError)
                yield from self._moved(source, call.windows)
            return (yield from self._ask(reply, call))
        if isinstance(reply, TryAgainError) and call.windows:
            # some of its keys have moved, some not yet: once none is left on the source,
            # the source answers ASK
            yield from self._moved(source, call.windows)
            [reply] = yield Pipelined(call.command(), node=source)
            return (yield from self._follow(reply, call, source))
        if isinstance(reply, _REDIRECTS):
            return (yield self._again(call))
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _load_missing(self, replies: dict[int, Any], calls: dict[int, SlotCall],
                      sent_to: dict[int, Any]) -> Flow[None]:
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
            try:
                again = yield Pipelined(*(calls[s].source_command() for s in slots), node=node)
            except UNAVAILABLE_ERRORS as exc:
                again = [exc] * len(slots)
            replies.update(zip(slots, again, strict=True))

    def _again(self, call: SlotCall) -> OnClient:
        """A call sent again through the cluster client (it follows MOVED, loads scripts)."""
        if call.script is None:
            client = self.client
            return OnClient(lambda: client.get(call.keys[0]))
        return OnClient(lambda: call.script(keys=call.keys, args=call.args))

    def _ask(self, ask: AskError, call: SlotCall) -> Flow[Any]:
        """Send a call that a migrating slot's node answered ASK to the node it names,
        `ASKING` first; through the cluster client when that node answers MOVED (the slot
        moved on meanwhile).

        The fan-out follows ASK itself because redis-py follows it only to a node of its
        slot map, and a primary just added (`redis-cli --cluster add-node`) is in no slot
        map until it owns a slot: redis-py fails with AttributeError then (redis-py issue
        4015). The script goes as EVAL: the importing node may not have loaded it.

        The importing node answers TRYAGAIN while some of the call's keys are not there: a
        windowed limit's base key never exists, so its call waits (briefly) for the slot
        to be handed over, as `redis-cli --cluster reshard` does right after the keys."""
        node = self._node_at(ask)
        deadline = time.monotonic() + _MIGRATION_WAIT
        while True:
            replies = yield Pipelined(("ASKING",), call.source_command(), node=node)
            reply = replies[1]
            if isinstance(reply, MovedError):  # the slot finished moving meanwhile
                return (yield self._again(call))
            if not isinstance(reply, TryAgainError):
                break
            if time.monotonic() >= deadline:  # several keys, not all of them there yet
                raise EngineUnavailable("a slot is migrating and its keys have not all "
                                        "moved yet; try again")
            yield Pause(_MIGRATION_POLL)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _node_at(self, ask: AskError) -> Any:
        """The node an ASK names, made known to the client when its slot map lacks it."""
        node = self.client.get_node(host=ask.host, port=ask.port)
        if node is None:
            with self._lock:
                node = self._strangers.get(ask.node_addr)
                if node is None:
                    node = ClusterNode(ask.host, ask.port, PRIMARY)  # type: ignore[no-untyped-call]
                    self.client.nodes_manager.create_redis_connections([node])
                    self._strangers[ask.node_addr] = node
        return node

    def _moved(self, source: Any, windows: list[str]) -> Flow[None]:
        """Wait (briefly) until a migrating slot's window keys have left `source`.

        A windowed limit's base key never exists: its counts live in its window keys,
        which stay on the source until the migration moves them. A node answers TRYAGAIN
        while some of a call's keys are there and others not, ASK once none is; run on the
        importing node before the window keys arrived, the call would start the window
        from zero beside the real count. So the call goes on only once the source holds
        none of its window keys (a multi-key EXISTS there answers ASK when all are gone,
        TRYAGAIN when some are); a node never takes back a key of a slot it is migrating,
        so none can return."""
        deadline = time.monotonic() + _MIGRATION_WAIT
        while True:
            [found] = yield Pipelined(("EXISTS", *windows), node=source)
            if isinstance(found, AskError):  # (MovedError too)
                return
            if not isinstance(found, TryAgainError):
                if isinstance(found, Exception):
                    raise found
                if not found:
                    return
            if time.monotonic() >= deadline:
                raise EngineUnavailable("a slot is migrating and its window keys have not "
                                        "moved yet; try again")
            yield Pause(_MIGRATION_POLL)

    # -- run in the calling thread -------------------------------------------------------

    def perform(self, need: Need) -> Any:
        """Do one thing the flow needs, in this thread."""
        if isinstance(need, Exchange):
            return self._exchange(need.jobs, need.calls)
        if isinstance(need, Pipelined):
            wire = wire_of(self.client.get_redis_connection(need.node))
            replies: list[Any] = []
            wire.receive(wire.send(need.commands), len(need.commands), replies)
            return replies
        if isinstance(need, OnClient):
            return need.call()
        time.sleep(need.seconds)
        return None

    def _exchange(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, SlotCall]
                  ) -> dict[int, Any]:
        """Write every node's pipeline, then read every reply, on each node's `Wire`
        (connections kept, not checked out of the node's pool for each call). Errors are
        values: a script's error for its slot, a node's failure for each slot sent to it
        (the other nodes' replies are still read)."""
        replies: dict[int, Any] = {}
        sent: list[tuple[Any, Any, list[int]]] = []  # written, replies not read yet
        try:
            for node, slots in jobs:
                try:
                    wire = wire_of(self.client.get_redis_connection(node))
                    sent.append((wire, wire.send([calls[s].command() for s in slots]),
                                 slots))
                except UNAVAILABLE_ERRORS as exc:
                    replies.update((s, exc) for s in slots)
            while sent:
                wire, connection, slots = sent.pop(0)
                got: list[Any] = []
                try:
                    wire.receive(connection, len(slots), got)
                except UNAVAILABLE_ERRORS as exc:  # the replies read before it count
                    got += [exc] * (len(slots) - len(got))
                replies.update(zip(slots, got, strict=True))
        finally:
            for wire, connection, _ in sent:  # left unread by an error: not reusable
                wire.drop(connection)
        return replies
