"""Redis commands as the needs of a flow (`flows`), and the two ways to perform them.

A flow that talks to one Redis server yields a `Command` (one command; its reply, an
error raised) or a `Pipelined` (several commands in one round trip; their replies, an
error of one command as its value). `perform` sends them on a blocking `redis.Redis`,
`aperform` on a `redis.asyncio.Redis`: the same commands, the same replies, so what a
call means (its script loading, its recovery) is written once, in the flow.

`guarded` puts a flow behind the circuit breaker and turns redis-py's errors into the
engine's: `EngineUnavailable` when the store is out of reach, `EngineError` otherwise.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow

__all__ = [
    "UNAVAILABLE_ERRORS",
    "Command",
    "Pipelined",
    "Script",
    "Wire",
    "admit",
    "aperform",
    "failed",
    "guarded",
    "perform",
]

#: Errors that mean "the store is out of reach", as opposed to a bug in what we sent.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.BusyLoadingError,
)

T = TypeVar("T")


class Command:
    """One command (`args`, as for `execute_command`); the flow is sent its reply."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args


class Pipelined:
    """Commands sent in one round trip; the flow is sent their replies, in order, an
    error of one command as its value (a connection's failure is raised)."""

    __slots__ = ("commands",)

    def __init__(self, *commands: tuple[Any, ...]) -> None:
        self.commands = commands


Need = Command | Pipelined


def perform(client: redis.Redis, need: Need) -> Any:
    """Send `need` on a blocking client and read its reply."""
    if isinstance(need, Command):
        return client.execute_command(*need.args)  # type: ignore[no-untyped-call]
    pipe = client.pipeline(transaction=False)
    for command in need.commands:
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]
    return pipe.execute(raise_on_error=False)


class Wire:
    """A blocking client's commands, sent on connections of this wire's own.

    A command goes out on a connection taken from a stack that no lock guards (its pop
    and append are atomic), written and read through the connection's public calls
    (`send_command`, `read_response`), and is answered what `execute_command` answers:
    commands with a reply callback (`PING`, `SCRIPT LOAD` ...) and pipelines take the
    client's own path. Between that and redis-py's pool the difference is what a pool
    does for every command (its lock, its bookkeeping, its observability hooks), about
    half the client's CPU per round trip; what matters is kept: a connection that has
    data waiting or that the server closed is reconnected before use, as the pool does,
    and one whose command failed half-way is disconnected (by redis-py itself) before it
    is used again. The connections are made by the client's pool (its options, its
    Sentinel master) and count towards its `max_connections`; a forked child starts
    with none, as a pool does.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        # None: a cluster client, which routes each command itself, keeps its own path
        self.callbacks: Any = (client.response_callbacks if isinstance(client, redis.Redis)
                               else None)
        #: connections connected when last put back, and those disconnected by a failure
        self.warm: list[Any] = []
        self.cold: list[Any] = []
        _wires.add(self)

    def perform(self, need: Need) -> Any:
        """Send `need` and read its reply (see `perform`)."""
        callbacks = self.callbacks
        if type(need) is not Command or callbacks is None or need.args[0] in callbacks:
            return perform(self.client, need)
        connection, connected = self._take()
        try:
            if not connected:
                connection.connect()  # a Sentinel connection asks for the master here
            connection.send_command(*need.args, check_health=False)
            reply = connection.read_response()
        except redis.ResponseError:
            self.warm.append(connection)  # an error reply: the connection is sound
            raise
        except BaseException:
            connection.disconnect()  # a reply may be left half-read
            self.cold.append(connection)
            raise
        self.warm.append(connection)
        return reply

    def _take(self) -> tuple[Any, bool]:
        """A connection and whether it is connected: a warm one if one is idle (checked
        as the pool checks its own), else one to connect (a failure's, or a new one of
        the client's pool)."""
        try:
            connection = self.warm.pop()
        except IndexError:
            try:
                return self.cold.pop(), False
            except IndexError:
                return self.client.connection_pool.make_connection(), False
        try:
            stale = connection.can_read()  # data left over
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            stale = True  # closed by the server (a restart, its idle timeout)
        if stale:
            connection.disconnect()
            return connection, False
        return connection, True

    def close(self) -> None:
        """Disconnect the idle connections (the client's pool keeps its own)."""
        while self.warm:
            self.warm.pop().disconnect()

    def forget(self) -> None:
        """Drop the connections without touching their sockets: a forked child's copies
        belong to the parent."""
        self.warm, self.cold = [], []


#: Every wire of this process, so a forked child drops its parent's connections.
_wires: weakref.WeakSet[Wire] = weakref.WeakSet()


def _forked() -> None:
    for wire in list(_wires):
        wire.forget()


os.register_at_fork(after_in_child=_forked)


async def aperform(client: redis.asyncio.Redis, need: Need) -> Any:
    """`perform` on an asyncio client: the reply awaited on the event loop."""
    if isinstance(need, Command):
        return await client.execute_command(*need.args)  # type: ignore[no-untyped-call]
    pipe = client.pipeline(transaction=False)
    for command in need.commands:
        pipe.execute_command(*command)
    return await pipe.execute(raise_on_error=False)


class Script:
    """A Lua script run by EVALSHA and loaded when the server lacks it (NOSCRIPT), as
    redis-py's `Script` does; its SHA is computed here, without a round trip."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVALSHA of `keys` and `args`, for a pipeline."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def call(self, keys: Sequence[Any], args: Sequence[Any]) -> Flow[Any]:
        """Run the script; after NOSCRIPT (a restart, a SCRIPT FLUSH), load it and again."""
        try:
            return (yield Command(*self.command(keys, args)))
        except NoScriptError:
            pass
        yield Command("SCRIPT LOAD", self.source)
        return (yield Command(*self.command(keys, args)))


def admit(breaker: CircuitBreaker | None) -> None:
    """Raise EngineUnavailable at once while `breaker` is open: no socket is touched."""
    if breaker is not None and not breaker.allow():
        raise EngineUnavailable("circuit open after repeated store failures")


def guarded(breaker: CircuitBreaker | None, flow: Flow[T]) -> Flow[T]:
    """`flow` behind `breaker`: it fails fast while the breaker is open; its redis errors
    become engine errors, and tell the breaker, as its success does."""
    admit(breaker)
    try:
        reply = yield from flow
    except redis.RedisError as exc:
        raise failed(exc, breaker) from exc
    if breaker is not None:
        breaker.success()
    return reply


def failed(exc: redis.RedisError, breaker: CircuitBreaker | None) -> EngineError:
    """The engine error a failed store call raises (the breaker told): EngineUnavailable
    when the store is out of reach, EngineError for an error of the call itself."""
    if breaker is not None:
        breaker.failure()
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return EngineUnavailable(str(exc) or type(exc).__name__)
    return EngineError(str(exc))
