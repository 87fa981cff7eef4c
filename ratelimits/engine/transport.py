"""Redis commands as the needs of a flow (`flows`), and the two ways to perform them.

A flow that talks to one Redis server yields a `Command` (one command; its reply, an
error raised) or a `Pipelined` (several commands in one round trip; their replies, an
error of one command as its value). `perform` sends them on a blocking `redis.Redis`,
`aperform` on a `redis.asyncio.Redis`: the same commands, the same replies, so what a
call means (its script loading, its recovery) is written once, in the flow.

What a store error means is decided here once, for every engine (`engine_error`):
`EngineUnavailable` when the store is out of reach, `EngineError` otherwise. `guarded`
is the one circuit-breaker wrapper: the single server's rare flows, the cluster's
fan-outs and its leases go through it (`aguarded` awaits it); the single server's
decision, one command, asks the same breaker inline (`RedisEngine._exchange`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import redis
import redis.asyncio
from redis.exceptions import ClusterDownError, NoScriptError, RedisClusterException

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.errors import CircuitOpen, EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow, arun_flow

__all__ = [
    "STORE_ERRORS",
    "UNAVAILABLE_ERRORS",
    "Command",
    "Pipelined",
    "Recovering",
    "Script",
    "admit",
    "aguarded",
    "aperform",
    "engine_error",
    "error_code",
    "failed",
    "guard",
    "guarded",
    "perform",
]

#: Errors that mean "the store is out of reach", as opposed to a bug in what we sent. A
#: cluster client's own failures (no node reachable, no slot owner) are not RedisErrors
#: and mean the same; so does CLUSTERDOWN (and MASTERDOWN): a node answers it while a
#: slot has no owner it can reach, and for two seconds after a primary restarts.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.BusyLoadingError,
    RedisClusterException,
    ClusterDownError,
)
#: Error codes (a reply's first word) that mean the same when redis-py has no class for
#: them: BUSY, a script running past the server's busy threshold (every call waits for
#: it, as Redis and Valkey both say, each in its own words after the code).
UNAVAILABLE_CODES = frozenset({"BUSY"})
#: Everything a store call may fail with: redis-py's errors, and the cluster client's.
STORE_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)

T = TypeVar("T")


class Command:
    """One command (`args`, as for `execute_command`); the flow is sent its reply."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args


class Pipelined:
    """Commands sent in one round trip; the flow is sent their replies, in order, an
    error of one command as its value (a connection's failure is raised). `node`: the
    cluster node they go to (see `cluster_fanout`); None on a single server."""

    __slots__ = ("commands", "node")

    def __init__(self, *commands: tuple[Any, ...], node: Any = None) -> None:
        self.commands = commands
        self.node = node


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
        except NoScriptError as exc:
            error = exc
        return (yield from self.recovering(error, (len(keys), *keys, *args)))

    def recovering(self, error: Exception, body: tuple[Any, ...]) -> Flow[Any]:
        """After an EVALSHA of `body` (numkeys, keys, args) failed with `error`: the
        script loaded and the call made again when the server lacked it (NOSCRIPT);
        `error` raised otherwise."""
        if not isinstance(error, NoScriptError):
            raise error
        yield Command("SCRIPT LOAD", self.source)
        return (yield Command("EVALSHA", self.sha, *body))


class Recovering(Protocol):
    """A script whose call, failed because the server lacked it, is made again (see
    `Script.recovering`, `functions.StoredScript.recovering`)."""

    def recovering(self, error: Exception, body: tuple[Any, ...]) -> Flow[Any]: ...


def admit(breaker: CircuitBreaker | None) -> None:
    """Raise EngineUnavailable at once while `breaker` is open: no socket is touched."""
    if breaker is not None and not breaker.allow():
        raise CircuitOpen("circuit open after repeated store failures")


def guarded(breaker: CircuitBreaker | None, flow: Flow[T]) -> Flow[T]:
    """`flow` behind `breaker`, the one wrapper of every engine's calls (single node,
    cluster fan-out, leases): it fails fast while the breaker is open; its store errors
    become engine errors (`failed`), and each engine error, as its success, tells the
    breaker."""
    admit(breaker)
    try:
        reply = yield from flow
    except STORE_ERRORS as exc:
        raise failed(exc, breaker) from exc
    except EngineError:
        if breaker is not None:
            breaker.failure()
        raise
    if breaker is not None:
        breaker.success()
    return reply


async def aguarded(breaker: CircuitBreaker | None, call: Coroutine[Any, Any, T]) -> T:
    """`guarded` for a coroutine (an awaited flow, `flows.arun_flow`): the same wrapper,
    the coroutine its one need."""
    try:
        return await arun_flow(guarded(breaker, _awaiting(call)), _itself)
    finally:
        call.close()  # never awaited when the breaker refused it: no warning about it


def _awaiting(call: Coroutine[Any, Any, T]) -> Flow[T]:
    result: T = yield call
    return result


def _itself(call: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
    return call


def guard(run: Callable[[], T]) -> T:
    """`run()`, its store errors raised as engine errors (`engine_error`): a call that
    no breaker watches (a reset, a figure read, a flush)."""
    try:
        return run()
    except STORE_ERRORS as exc:
        raise engine_error(exc) from exc


def failed(exc: BaseException, breaker: CircuitBreaker | None) -> EngineError:
    """The engine error a failed store call raises (`engine_error`), the breaker told."""
    if breaker is not None:
        breaker.failure()
    return engine_error(exc)


def engine_error(exc: BaseException) -> EngineError:
    """What a store error means to the engine's callers, the one mapping of all its
    calls: EngineUnavailable when the store is out of reach (`UNAVAILABLE_ERRORS`),
    EngineError for an error of the call itself."""
    if isinstance(exc, UNAVAILABLE_ERRORS) or error_code(exc) in UNAVAILABLE_CODES:
        return EngineUnavailable(str(exc) or type(exc).__name__)
    return EngineError(str(exc))


def error_code(exc: BaseException) -> str:
    """The code of a server's error reply, its first word ("BUSY", "NOSCRIPT"): what
    servers of the protocol agree on, where their wording after it differs. "" for an
    error that is not a reply, or one whose code redis-py took off (it gave a class)."""
    if type(exc) is not redis.ResponseError:
        return ""
    code = getattr(exc, "status_code", None)  # redis-py 6 and later keep it
    if code:
        return str(code)
    word = str(exc).split(" ", 1)[0]
    return word if word.isupper() else ""
