"""The engine's own connections (`wire.Wire`): what redis-py's pool guarantees for a
command, kept without the pool: a connection the server closed is reconnected before
use, a reply left half-read never answers the next call, a forked child starts with no
connection of its parent's, and commands answer what `execute_command` answers."""

from __future__ import annotations

import os

import pytest
import redis

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.errors import EngineUnavailable
from ratelimits.engine.transport import Command, Pipelined
from ratelimits.engine.wire import Wire

T0 = 1_800_000_000.0


def _limit() -> Limit:
    return Limit(key="ip:203.0.113.7", limit=100, period=60, algorithm="fixed_window")


def test_a_connection_the_server_closed_is_replaced_before_the_call(redis_client):
    engine = RedisEngine(redis_client, stats=False)
    assert engine.evaluate([_limit()], T0).results[0].remaining == 99
    assert engine.wire.warm  # the connection waits, connected
    # The server drops every other client (an idle timeout, a restart, CLIENT KILL).
    assert redis_client.client_kill_filter(_type="normal", skipme=True) >= 1

    decision = engine.evaluate([_limit()], T0)

    assert decision.allowed and decision.results[0].remaining == 98  # charged once


def test_a_reply_left_unread_never_answers_the_next_call(redis_url):
    client = redis.Redis.from_url(redis_url, socket_timeout=0.2)
    client.flushdb()
    engine = RedisEngine(client, stats=False)
    engine.evaluate([_limit()], T0)  # the library loaded, the connection warm
    # The server pauses longer than the client waits: the call times out and its reply
    # arrives later, on a connection that must not be read again.
    control = redis.Redis.from_url(redis_url)
    control.client_pause(5_000, all=False)  # writes (and scripts) wait
    try:
        with pytest.raises(EngineUnavailable):
            engine.evaluate([_limit()], T0)
    finally:
        control.client_unpause()  # the paused call runs now; its reply goes unread

    other = Limit(key="ip:198.51.100.1", limit=10, period=60, algorithm="fixed_window")
    decision = engine.evaluate([other], T0)

    # this call's own reply: the other client's first request (not the late 98)
    assert decision.results[0].limit.key == other.key
    assert decision.results[0].remaining == 9
    client.close()
    control.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_starts_with_no_connection_of_its_parent(redis_client):
    engine = RedisEngine(redis_client, stats=False)
    engine.evaluate([_limit()], T0)
    assert engine.wire.warm

    pid = os.fork()
    if pid == 0:  # the child: its parent's socket is not its own
        code = 0 if not engine.wire.warm else 1
        try:
            if engine.evaluate([_limit()], T0).results[0].remaining != 98:
                code = 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert engine.evaluate([_limit()], T0).results[0].remaining == 97


def test_commands_answer_what_execute_command_answers(redis_client):
    wire = Wire(redis_client)
    redis_client.set("k", "v")

    assert wire.perform(Command("PING")) is True  # a reply callback: the client's path
    assert wire.perform(Command("GET", "k")) == b"v"  # no callback: raw, as redis-py
    with pytest.raises(redis.ResponseError):
        wire.perform(Command("INCR", "k"))  # an error reply
    assert len(wire.warm) == 1  # ... leaves the connection sound, and reused
    assert wire.perform(Command("GET", "k")) == b"v"
    wire.close()
    assert not wire.warm


def test_pipelines_answer_what_the_clients_pipeline_answers(redis_client):
    """A pipeline of commands answered raw goes on the wire (a release, a heartbeat);
    one with a reply callback takes the client's own pipeline, so its replies are the
    same either way."""
    wire = Wire(redis_client)
    redis_client.delete("wire:p")

    replies = wire.perform(Pipelined(("APPEND", "wire:p", "x"), ("INCR", "wire:p"),
                                     ("GET", "wire:p")))

    assert replies[0] == 1 and replies[2] == b"x"
    assert isinstance(replies[1], redis.ResponseError)  # an error is that command's value
    assert len(wire.warm) == 1  # sent on the wire's own connection
    assert wire.perform(Pipelined(("PING",), ("GET", "wire:p"))) == [True, b"x"]
    wire.close()


def test_engines_on_one_pool_share_its_connections_and_give_them_back(redis_url):
    """However many engines a client serves, the wire keeps no more connections than
    were in use at once, within the pool's max_connections, and closing gives them back."""
    client = redis.Redis.from_url(redis_url, max_connections=3)
    client.flushdb()
    engines = [RedisEngine(client, stats=False) for _ in range(50)]
    for engine in engines:
        assert engine.evaluate([_limit()], T0).allowed
    assert engines[0].wire is engines[-1].wire
    assert len(engines[0].wire.warm) == 1

    engines[0].close()

    assert not engines[0].wire.warm
    pool = client.connection_pool
    # every connection is back in the pool: it can hand out all it may make
    taken = [pool.get_connection() for _ in range(3)]
    for connection in taken:
        pool.release(connection)
    client.close()


def test_a_client_dropped_takes_its_pool_and_wire_with_it(redis_url):
    import gc
    import weakref

    client = redis.Redis.from_url(redis_url)
    engine = RedisEngine(client, stats=False)
    engine.evaluate([_limit()], T0)
    engine.close()
    pool = weakref.ref(client.connection_pool)
    wire = weakref.ref(engine.wire)
    client.close()
    del client, engine
    gc.collect()

    assert pool() is None and wire() is None  # nothing keeps them alive


def test_a_pipeline_split_in_two_answers_each_command_in_order(redis_client):
    """`send` writes, `receive` reads: several servers' pipelines can all be written before
    any reply is read (the cluster's fan-out). An error reply is that command's value,
    and the connection carries the next call."""
    redis_client.delete("wire:a", "wire:b")
    first, second = Wire(redis_client), Wire(redis_client)
    one = first.send([("SET", "wire:a", "x"), ("INCR", "wire:a"), ("GET", "wire:a")])
    two = second.send([("INCR", "wire:b")])
    got_two: list[object] = []
    second.receive(two, 1, got_two)
    got_one: list[object] = []
    first.receive(one, 3, got_one)

    assert got_two == [1]
    assert got_one[0] == b"OK" and got_one[2] == b"x"
    assert isinstance(got_one[1], redis.ResponseError)  # not an integer
    assert first.warm == [one]  # sound: kept for the next command
    assert first.call(("INCR", "wire:b")) == 2


def test_a_failed_receive_keeps_the_replies_read_and_drops_the_connection(private_redis):
    client = redis.Redis.from_url(private_redis.url, socket_timeout=0.3)
    wire = Wire(client)
    control = redis.Redis.from_url(private_redis.url)
    control.client_pause(2_000, all=False)  # writes wait; reads answer
    try:
        connection = wire.send([("GET", "wire:k"), ("SET", "wire:k", "1")])
        got: list[object] = []
        with pytest.raises(redis.TimeoutError):
            wire.receive(connection, 2, got)
    finally:
        control.client_unpause()

    assert got == [None]  # the GET's reply, read before the SET timed out
    assert wire.cold == [connection] and not wire.warm  # its late reply is never read
    assert wire.call(("INCR", "wire:other")) == 1  # connected again, its own reply
    client.close()
    control.close()


def test_a_connection_that_cannot_reconnect_is_kept_for_the_next_try(private_redis):
    """A server down for a while fails each call; the connection that could not reconnect
    stays the wire's, so a pool of one connection serves again once the server is back."""
    pool = redis.ConnectionPool.from_url(private_redis.url, max_connections=1,
                                         socket_timeout=0.5)
    wire = Wire(redis.Redis(connection_pool=pool))
    assert wire.call(("INCR", "wire:n")) == 1
    port = private_redis.port
    private_redis.stop()
    for _ in range(3):
        with pytest.raises(redis.ConnectionError):
            wire.call(("INCR", "wire:n"))
    private_redis.port = port
    private_redis.start()

    assert wire.call(("INCR", "wire:n")) == 1  # a new server: a new count
    pool.disconnect()
