"""The asyncio engine's own connections (`wire.AsyncWire`): what `redis.asyncio`'s pool
guarantees for a command, kept without the pool: a connection the server closed is
connected again before use, a reply left unread by a cancelled or timed-out call never
answers the next one, an error reply leaves the connection in use, and a connection
that could not connect again stays the wire's."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.aio import AsyncRedisEngine
from ratelimits.engine.deployments import async_twin_client
from ratelimits.engine.errors import EngineUnavailable
from ratelimits.engine.transport import Command, Pipelined
from ratelimits.engine.wire import AsyncWire

T0 = 1_800_000_000.0


def _limit(key: str = "ip:203.0.113.7", limit: int = 100) -> Limit:
    return Limit(key=key, limit=limit, period=60, algorithm="fixed_window")


def test_a_connection_the_server_closed_is_connected_again_before_the_call(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    engine = AsyncRedisEngine(RedisEngine(client, stats=False),
                              lambda: async_twin_client(client))

    async def main():
        assert (await engine.evaluate([_limit()], T0)).results[0].remaining == 99
        assert engine.wire().idle  # the connection waits, connected
        # The server drops every other client (an idle timeout, a restart, CLIENT KILL).
        with redis.Redis.from_url(redis_url) as control:
            assert control.client_kill_filter(_type="normal", skipme=True) >= 1
        # the loop turns between two requests, and reads the server's close meanwhile
        await asyncio.sleep(0.05)
        return await engine.evaluate([_limit()], T0)

    decision = asyncio.run(main())

    assert decision.allowed and decision.results[0].remaining == 98  # charged once


@pytest.mark.parametrize("ended_by", ["cancelled", "socket timeout"])
def test_a_reply_left_unread_never_answers_the_next_call(redis_url, ended_by):
    """The server pauses longer than the call is let run, cancelled by its caller
    (`asyncio.timeout`, a client gone) or by the client's socket timeout: the paused
    call's reply arrives later, on a connection that must not be read again."""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.3)
    client.flushdb()
    engine = AsyncRedisEngine(RedisEngine(client, stats=False),
                              lambda: async_twin_client(client))
    other = _limit("ip:198.51.100.1", 10)

    async def main():
        await engine.evaluate([_limit()], T0)  # the library loaded, the connection idle
        with redis.Redis.from_url(redis_url) as control:
            control.client_pause(2_000, all=False)  # writes (and scripts) wait
            try:
                if ended_by == "cancelled":
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(0.1):
                            await engine.evaluate([_limit()], T0)
                else:
                    with pytest.raises(EngineUnavailable):
                        await engine.evaluate([_limit()], T0)
            finally:
                control.client_unpause()  # the paused call runs now; its reply unread
        return await engine.evaluate([other], T0)

    decision = asyncio.run(main())

    # this call's own reply: the other client's first request (not the late 98)
    assert decision.results[0].limit.key == other.key
    assert decision.results[0].remaining == 9
    client.close()


def test_commands_answer_what_execute_command_answers(redis_url):
    async def main():
        client = redis.asyncio.Redis.from_url(redis_url)
        wire = AsyncWire(client)
        await client.delete("wire:n", "wire:p")
        await client.set("wire:k", "v")
        # a reply callback: the client's path
        assert await wire.perform(Command("PING")) is True
        assert await wire.call(("GET", "wire:k")) == b"v"  # no callback: raw, as redis-py
        kept = list(wire.idle)
        with pytest.raises(redis.ResponseError):
            await wire.call(("INCR", "wire:k"))  # an error reply
        assert wire.idle == kept  # ... leaves the connection sound, and in use
        assert await wire.call(("GET", "wire:k")) == b"v"
        # a pipeline answered raw goes on the wire, one with a reply callback does not
        replies = await wire.perform(Pipelined(("APPEND", "wire:p", "x"), ("INCR", "wire:p"),
                                               ("GET", "wire:p")))
        assert replies[0] == 1 and replies[2] == b"x"
        assert isinstance(replies[1], redis.ResponseError)  # that command's value
        assert wire.idle == kept
        assert await wire.perform(Pipelined(("PING",), ("GET", "wire:p"))) == [True, b"x"]
        assert await wire.perform(Command("GET", "wire:p")) == b"x"
        # tasks at once each take a connection; the wire keeps those, no more
        counts = await asyncio.gather(*(wire.call(("INCR", "wire:n")) for _ in range(4)))
        assert sorted(counts) == [1, 2, 3, 4]
        assert 1 <= len(wire.idle) <= 4
        held = len(wire.idle)
        for _ in range(10):
            await wire.call(("INCR", "wire:n"))
        assert len(wire.idle) == held
        await client.aclose()

    asyncio.run(main())


def test_a_connection_that_cannot_connect_again_is_kept_for_the_next_try(private_redis):
    """A server down for a while fails each call; the connection that could not connect
    again stays the wire's, so a pool of one connection serves again once the server is
    back."""

    async def main():
        pool = redis.asyncio.ConnectionPool.from_url(private_redis.url, max_connections=1,
                                                     socket_timeout=0.5)
        wire = AsyncWire(redis.asyncio.Redis(connection_pool=pool))
        assert await wire.call(("INCR", "wire:n")) == 1
        port = private_redis.port
        private_redis.stop()
        for _ in range(3):
            with pytest.raises(redis.ConnectionError):
                await wire.call(("INCR", "wire:n"))
        private_redis.port = port
        private_redis.start()
        assert await wire.call(("INCR", "wire:n")) == 1  # a new server: a new count
        await pool.disconnect()

    asyncio.run(main())
