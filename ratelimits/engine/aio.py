"""The request path of a store engine on asyncio: no thread, no blocking socket.

`AsyncRedisEngine` is the async half (`interfaces.AsyncEngine`) of a `RedisEngine`, its
twin: a decision and a version read take the twin's own pure steps (`RedisEngine.batch`
and `decided`, `version_read`) around one command awaited on `redis.asyncio`, and the
twin's rare flows (the library or script reloaded, a heartbeat, `releasing`)
are awaited with each command they need sent there. So the function or script, its
recovery when the server lost it, the tally of counts carried by the calls and the
heartbeat are the twin's, written once.
Everything off the request path (counters, offenders, resets, giving leases back at
exit, closing) is the twin's: call it there.

A redis.asyncio connection belongs to the event loop that opened it, so the engine keeps
one client per running loop: one for a server's loop, a fresh one for each loop that
`async_to_sync` makes in tests.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio

from ratelimits.engine.breaker import CLOSED
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.cluster_fanout import (
    Exchange,
    Need,
    OnClient,
    SlotCall,
)
from ratelimits.engine.contract import encode_lease
from ratelimits.engine.errors import EngineError
from ratelimits.engine.flows import Flow, arun_flow
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.redis_backend import (
    Chores,
    RedisEngine,
    beating_call,
    granted,
    lease_script,
    version_of,
)
from ratelimits.engine.transport import (
    UNAVAILABLE_ERRORS,
    Pipelined,
    Recovering,
    admit,
    aguarded,
    failed,
)
from ratelimits.engine.types import Decision, Limit
from ratelimits.engine.wire import AsyncWire

__all__ = ["AsyncClusterEngine", "AsyncNodes", "AsyncRedisEngine"]

T = TypeVar("T")


class AsyncRedisEngine:
    """`evaluate`, `read_version`, `release` and `lease` of `twin`, awaited on
    `redis.asyncio`.

    `connect()` opens a `redis.asyncio.Redis` on the twin's server with the twin's
    timeouts; it is called once per event loop.
    """

    def __init__(self, twin: RedisEngine, connect: Callable[[], redis.asyncio.Redis]) -> None:
        self.twin = twin
        self._connect = connect
        self._wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncWire] = (
            weakref.WeakKeyDictionary()
        )

    def wire(self) -> AsyncWire:
        """This event loop's wire, on its client (opened on first use in the loop)."""
        loop = asyncio.get_running_loop()
        wire = self._wires.get(loop)
        if wire is None:
            wire = self._wires[loop] = AsyncWire(self._connect())
        return wire

    def client(self) -> redis.asyncio.Redis:
        """This event loop's client (opened on first use in the loop)."""
        return self.wire().client

    async def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        now = self.twin.when(now)
        twin = self.twin
        if not limits and not twin.version_key:
            return Decision(allowed=True, results=())
        command, token, chores = twin.batch(limits, now)
        try:
            reply = await self._exchange(command, chores, now, twin.script)
        except EngineError as exc:
            twin.unsent(limits, token, chores, exc)
            raise
        return twin.decided(limits, reply, token)

    async def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET, carrying a heartbeat when one is due."""
        now = self.twin.when(now)
        command, chores = self.twin.version_read()
        return version_of(await self._exchange(command, chores, now, None))

    async def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one round trip)."""
        await self._run(self.twin.releasing(decision))

    async def lease(self, limits: Sequence[Limit], now: float | None = None, *,
                    back: Sequence[Leftover] = ()) -> list[Grant]:
        """The twin's `lease()`, awaited: leases of `batch` units after giving `back`."""
        now = self.twin.when(now)
        if not limits and not back:
            return []
        script = lease_script()
        command = script.command(*encode_lease(self.twin.prefix, limits, back, now))
        return granted(limits, back, await self._exchange(command, None, now, script))

    async def _exchange(self, command: tuple[Any, ...], chores: Chores | None,
                       now: float | None, script: Recovering | None) -> Any:
        """The twin's `_exchange()`, awaited on this loop's client."""
        breaker = self.twin.breaker
        if breaker is not None and breaker.state != CLOSED:
            admit(breaker)
        try:
            if chores is None or chores.beat is None:
                try:
                    reply = await self.wire().call(command)
                except redis.ResponseError as exc:
                    if script is None:
                        raise
                    reply = await self._run(script.recovering(exc, command[2:]))
            else:
                reply = await self._run(beating_call(chores.beat, command, now, script))
        except redis.RedisError as exc:
            raise failed(exc, breaker) from exc
        if breaker is not None and not breaker.clear:
            breaker.success()
        return reply

    async def _run(self, flow: Flow[T]) -> T:
        """Await `flow`, each command it needs sent on this loop's client."""
        return await arun_flow(flow, self.wire().perform)


class AsyncNodes:
    """The cluster's nodes on asyncio: one `redis.asyncio.Redis` per node and event loop,
    opened by `connect(node's blocking client)`, its commands sent on its wire
    (`AsyncWire`), and a fan-out's needs performed on them. A connection belongs to the
    loop that opened it, hence one set per loop."""

    def __init__(self, connect: Callable[[Any], redis.asyncio.Redis]) -> None:
        self._connect = connect
        self._wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                dict[str, AsyncWire]] = (
            weakref.WeakKeyDictionary()
        )

    def wire(self, node: Any) -> AsyncWire:
        """This event loop's wire to `node`, on its client (opened on first use in the
        loop)."""
        loop = asyncio.get_running_loop()
        wires = self._wires.get(loop)
        if wires is None:
            wires = self._wires[loop] = {}
        wire = wires.get(node.name)
        if wire is None:
            wire = wires[node.name] = AsyncWire(self._connect(node.redis_connection))
        return wire

    async def perform(self, need: Need) -> Any:
        """Do one thing the flow needs, awaited: the nodes' pipelines on this loop's
        clients, a call of the blocking cluster client in a worker thread."""
        if isinstance(need, Exchange):
            return await self._exchange(need.jobs, need.calls)
        if isinstance(need, Pipelined):
            return await self._pipeline(need.node, need.commands)
        if isinstance(need, OnClient):
            return await asyncio.to_thread(need.call)
        await asyncio.sleep(need.seconds)
        return None

    async def _pipeline(self, node: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        return await self.wire(node).pipeline(commands)

    async def _exchange(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, SlotCall]
                        ) -> dict[int, Any]:
        """Every node's calls in one pipeline, the nodes at once; errors are values (a
        node's failure for each of its slots), as `SlotFanout.perform` has them."""

        async def node_calls(node: Any, slots: list[int]) -> list[tuple[int, Any]]:
            try:
                got = await self._pipeline(node, [calls[slot].command() for slot in slots])
            except UNAVAILABLE_ERRORS as exc:
                return [(slot, exc) for slot in slots]
            return list(zip(slots, got, strict=True))

        if len(jobs) == 1:  # one node, the usual case: awaited in place, no task made
            return dict(await node_calls(*jobs[0]))
        replies: dict[int, Any] = {}
        for pairs in await asyncio.gather(*(node_calls(node, slots) for node, slots in jobs)):
            replies.update(pairs)
        return replies


class AsyncClusterEngine:
    """`evaluate`, `read_version`, `release` and `lease` of a `ClusterEngine` (its twin),
    awaited.

    They are the twin's own flows (`ClusterEngine.deciding`, `reading_version`,
    `leasing`: the same calls, the same cross-slot refunds, the same heartbeat and
    tally), and their fan-outs the twin's (`cluster_fanout.SlotFanout.run`): every
    node's calls written to its `redis.asyncio` connection at once and read back on the
    event loop, a redirect or a lost script settled there too. Only what the blocking
    cluster client does (following MOVED, reading the slot map again) runs in a worker
    thread. `connect(node_client)` opens a `redis.asyncio.Redis` on the server of a
    node's blocking client; it is called once per node and event loop.
    """

    def __init__(self, twin: ClusterEngine,
                 connect: Callable[[Any], redis.asyncio.Redis]) -> None:
        self.twin = twin
        self.nodes = AsyncNodes(connect)

    async def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits,
        across slots (see `ClusterEngine.evaluate`)."""
        now = self.twin.when(now)
        twin = self.twin
        if not limits and not twin.version_key:
            return Decision(allowed=True, results=())
        return await aguarded(twin.breaker, arun_flow(twin.deciding(limits, now),
                                                       self.nodes.perform))

    async def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET (a heartbeat beside it when one is due)."""
        now = self.twin.when(now)
        if not self.twin.version_key:
            raise EngineError("this engine was built without a version_key")
        raw = await aguarded(self.twin.breaker,
                              arun_flow(self.twin.reading_version(now), self.nodes.perform))
        return int(raw) if raw is not None else 0

    async def release(self, decision: Decision) -> None:
        """The twin's `release()`, awaited: each slot's call, the nodes at once."""
        if decision.token is not None:
            await aguarded(self.twin.breaker,
                           arun_flow(self.twin.releasing(decision), self.nodes.perform))

    async def lease(self, limits: Sequence[Limit], now: float | None = None, *,
                    back: Sequence[Leftover] = ()) -> list[Grant]:
        """The twin's `lease()`, awaited: leases of `batch` units after giving `back`."""
        now = self.twin.when(now)
        grants, _ = await arun_flow(self.twin.leasing(limits, now, back), self.nodes.perform)
        return grants
