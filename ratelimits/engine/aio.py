"""The request path of `RedisEngine` on asyncio: no thread, no blocking socket.

`AsyncRedisEngine` wraps a `RedisEngine` (its twin) and decides with `redis.asyncio`:
the same function or script (`contract.encode`/`decode`: the same arguments and the
same reply), the same circuit breaker, the same tally of counts (carried by its calls
like the twin's), the same heartbeat, and the same recovery when the server lost the
library or the script. Everything off the request path (counters, offenders, resets,
giving leases back at exit, closing) is the twin's, reached through attribute access.

A redis.asyncio connection belongs to the event loop that opened it, so the engine keeps
one client per running loop: one for a server's loop, a fresh one for each loop that
`async_to_sync` makes in tests.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio

from ratelimits.engine.cluster import _UNAVAILABLE as CLUSTER_UNAVAILABLE
from ratelimits.engine.contract import lease_source
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.functions import loaded_mode, next_step
from ratelimits.engine.keys import base_key
from ratelimits.engine.lease import Grant, Leftover, decode_lease, encode_lease
from ratelimits.engine.live import live_source
from ratelimits.engine.redis_backend import UNAVAILABLE_ERRORS, RedisEngine, admit, failed
from ratelimits.engine.steps import adrive
from ratelimits.engine.types import Decision, Limit

__all__ = ["AsyncClusterEngine", "AsyncRedisEngine"]


async def _breaking(breaker: Any, call: Any) -> Any:
    """Await `call` behind `breaker`: it fails fast while the breaker is open; a redis
    error becomes an engine error; each engine error counts as a failure."""
    try:
        admit(breaker)
    except EngineUnavailable:
        call.close()  # never awaited: no warning about it
        raise
    try:
        reply = await call
    except redis.RedisError as exc:
        raise failed(exc, breaker) from exc
    except EngineError:
        if breaker is not None:
            breaker.failure()
        raise
    if breaker is not None:
        breaker.success()
    return reply


class AsyncRedisEngine:
    """`evaluate`, `release` and `read_version` of `twin`, awaited on `redis.asyncio`.

    `connect()` opens a `redis.asyncio.Redis` on the twin's server with the twin's
    timeouts; it is called once per event loop.
    """

    def __init__(self, twin: RedisEngine, connect: Callable[[], redis.asyncio.Redis]) -> None:
        self.twin = twin
        self._connect = connect
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> Any:
        """This event loop's client (opened on first use in the loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._connect()
        return client

    async def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        twin = self.twin
        if not limits and not twin.version_key:
            return Decision(allowed=True, results=())
        keys, args, token, carried = twin.call_of(limits, now)
        try:
            reply = await self._run(keys, args, now)
        except EngineError:
            twin.unsent(carried)
            raise
        return twin.decision_of(limits, reply, token)

    async def _run(self, keys: list[str], args: list[Any], now: float | None) -> Any:
        beat = self.twin.heartbeat
        if beat is not None and beat.due():
            return await self._guarded(self._with_beat(keys, args, now))
        return await self._guarded(self._call(keys, args))

    async def _call(self, keys: list[str], args: list[Any]) -> Any:
        """The batch function (or script), loading it when the server lacks it."""
        script = self.twin._script  # the twin's: one mode per server, learnt once
        client = self.client()
        if script.mode != "evalsha":
            try:
                return await client.fcall(script.name, len(keys), *keys, *args)
            except redis.ResponseError as exc:
                step = next_step(exc)
                if step == "evalsha":
                    script.mode = "evalsha"
                elif step == "load":
                    await self._load(client)
                else:
                    raise
            if script.mode == "fcall":  # loaded just now
                return await client.fcall(script.name, len(keys), *keys, *args)
        return await self._evalsha(client, script.script, keys, args)

    async def _load(self, client: Any) -> None:
        script = self.twin._script
        try:
            await client.function_load(script.code)
        except redis.ResponseError as exc:
            script.mode = loaded_mode(exc)
        else:
            script.mode = "fcall"

    @staticmethod
    async def _evalsha(client: Any, script: Any, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA of a redis-py `Script`, loading it after NOSCRIPT (as `Script` does)."""
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            await client.script_load(script.script)
            return await client.evalsha(script.sha, len(keys), *keys, *args)

    async def _with_beat(self, keys: list[str], args: list[Any], now: float | None) -> Any:
        """The call and a heartbeat pipelined in one round trip; the call's reply."""
        twin = self.twin
        beat = twin.heartbeat
        assert beat is not None
        source = live_source()
        client = self.client()
        beat_args = beat.args(now)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*twin._script.command(keys, args))
        pipe.eval(source, 1, beat.key, *beat_args)  # tiny and rare: no SHA to keep
        try:
            reply, count = await pipe.execute(raise_on_error=False)
        except Exception:
            beat.missed()
            raise
        if isinstance(count, Exception):
            beat.missed()
        else:
            beat.learnt(count)
        if isinstance(reply, redis.ResponseError) and next_step(reply) is not None:
            return await self._call(keys, args)  # the call alone recovers and runs
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _guarded(self, call: Any) -> Any:
        """Await `call` behind the twin's circuit breaker, its failures as engine errors."""
        return await _breaking(self.twin.breaker, call)

    async def lease(self, limits: Sequence[Limit], now: float | None = None, *,
                    back: Sequence[Leftover] = ()) -> list[Grant]:
        """The twin's `lease()`, awaited: leases of `batch` units after giving `back`."""
        if not limits and not back:
            return []
        twin = self.twin
        keys, args = encode_lease(twin.prefix, limits, back, now)
        if twin._lease_script is None:  # registering computes the SHA: no round trip
            twin._lease_script = twin.client.register_script(lease_source())
        reply = await self._guarded(self._evalsha(self.client(), twin._lease_script, keys,
                                                  args))
        try:
            return decode_lease(limits, back, reply)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

    async def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET."""
        key = self.twin.version_key
        if not key:
            raise EngineError("this engine was built without a version_key")
        raw = await self._guarded(self.client().get(key))
        return int(raw) if raw is not None else 0

    async def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one round trip)."""
        breaker = self.twin.breaker
        if decision.token is None or (breaker and breaker.state != "closed"):
            return  # the slots expire by themselves after their period
        pipe = self.client().pipeline(transaction=False)
        for limit, members in decision.holding():
            pipe.zrem(base_key(self.twin.prefix, limit), *members)
        try:
            await pipe.execute()
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        # only called for what this class lacks: the twin's methods off the request path
        if name == "twin":
            raise AttributeError(name)
        return getattr(self.twin, name)


class AsyncClusterEngine:
    """`evaluate`, `release` and `read_version` of a `ClusterEngine` (its twin), awaited.

    The decision is the twin's own steps (`ClusterEngine.deciding`: the same calls, the
    same cross-slot refunds, the same heartbeat and tally); each fan-out they ask for is
    written to every node's `redis.asyncio` connection at once and read back on the event
    loop. What a cluster answers only while it changes (a redirect during a failover or a
    reshard, a script a restarted node lost, a node out of reach) is settled by the
    twin's rules (`ClusterEngine.settle`) in a worker thread, as is reading the slot map
    again and taking leases. `connect(node_client)` opens a `redis.asyncio.Redis` on the
    server of a node's blocking client; it is called once per node and event loop.
    """

    def __init__(self, twin: Any, connect: Callable[[Any], redis.asyncio.Redis]) -> None:
        self.twin = twin
        self._connect = connect
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def node_client(self, node: Any) -> Any:
        """This event loop's client of `node` (opened on first use in the loop)."""
        loop = asyncio.get_running_loop()
        clients = self._clients.get(loop)
        if clients is None:
            clients = self._clients[loop] = {}
        client = clients.get(node.name)
        if client is None:
            client = clients[node.name] = self._connect(node.redis_connection)
        return client

    async def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits,
        across slots (see `ClusterEngine.evaluate`)."""
        twin = self.twin
        if not limits and not twin.version_key:
            return Decision(allowed=True, results=())
        decision: Decision = await _breaking(twin.breaker, adrive(twin.deciding(limits, now),
                                                                  self.perform))
        return decision

    async def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET (a heartbeat beside it when one is due)."""
        if not self.twin.version_key:
            raise EngineError("this engine was built without a version_key")
        raw = await _breaking(self.twin.breaker,
                              adrive(self.twin.reading_version(now), self.perform))
        return int(raw) if raw is not None else 0

    async def perform(self, need: Any) -> dict[int, Any]:
        """One fan-out of the steps (`cluster.Fanout`): every node's calls pipelined on
        its connection, the nodes at once."""
        twin = self.twin
        if twin._stale:  # a node failed: the slot map is read again first (rare)
            await asyncio.to_thread(twin._refresh)
        jobs, sent_to = twin.route(need.calls)
        replies = await self._exchange(jobs, need.calls)
        if any(isinstance(reply, Exception) for reply in replies.values()):
            return await asyncio.to_thread(twin.settle, replies, need.calls, sent_to,
                                           need.reached)
        return replies

    async def _exchange(self, jobs: list[tuple[Any, list[int]]], calls: dict[int, Any]
                        ) -> dict[int, Any]:
        """Every node's calls in one pipeline, the nodes at once; errors are values (a
        node's failure for each of its slots), as `ClusterEngine._exchange` has them."""

        async def node_calls(node: Any, slots: list[int]) -> list[tuple[int, Any]]:
            pipe = self.node_client(node).pipeline(transaction=False)
            for slot in slots:
                call = calls[slot]
                if call.script is None:
                    pipe.execute_command("GET", call.keys[0])
                else:
                    pipe.execute_command("EVALSHA", call.script.sha, len(call.keys),
                                         *call.keys, *call.args)
            try:
                return list(zip(slots, await pipe.execute(raise_on_error=False),
                                strict=True))
            except CLUSTER_UNAVAILABLE as exc:
                return [(slot, exc) for slot in slots]
            except redis.RedisError as exc:
                raise EngineError(str(exc)) from exc

        replies: dict[int, Any] = {}
        for pairs in await asyncio.gather(*(node_calls(node, slots) for node, slots in jobs)):
            replies.update(pairs)
        return replies

    async def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds: each node's in one
        pipeline, the nodes at once; through the twin, in a thread, when a node redirects
        or fails (a slot not freed expires after its period)."""
        twin = self.twin
        if decision.token is None or (twin.breaker and twin.breaker.state != "closed"):
            return
        client = twin.client
        by_node: dict[str, tuple[Any, list[tuple[str, list[str]]]]] = {}
        for limit, members in decision.holding():
            key = base_key(twin.prefix, limit)
            node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
            by_node.setdefault(node.name, (node, []))[1].append((key, members))

        async def node_release(node: Any, held: list[tuple[str, list[str]]]) -> bool:
            pipe = self.node_client(node).pipeline(transaction=False)
            for key, members in held:
                pipe.zrem(key, *members)
            try:
                replies = await pipe.execute(raise_on_error=False)
            except redis.RedisError:
                return False
            return not any(isinstance(reply, Exception) for reply in replies)

        done = await asyncio.gather(*(node_release(node, held)
                                      for node, held in by_node.values()))
        if not all(done):
            await asyncio.to_thread(twin.release, decision)

    async def lease(self, limits: Sequence[Limit], now: float | None = None, *,
                    back: Sequence[Leftover] = ()) -> list[Grant]:
        """The twin's `lease()`, in a worker thread (one call per `batch` requests)."""
        grants: list[Grant] = await asyncio.to_thread(self.twin.lease, limits, now, back=back)
        return grants

    def __getattr__(self, name: str) -> Any:
        # only called for what this class lacks: the twin's methods off the request path
        if name == "twin":
            raise AttributeError(name)
        return getattr(self.twin, name)
