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
