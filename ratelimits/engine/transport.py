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

import functools
import hashlib
import os
import select
import weakref
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
    "Polled",
    "Recovering",
    "Script",
    "Wire",
    "admit",
    "aguarded",
    "aperform",
    "engine_error",
    "error_code",
    "failed",
    "guard",
    "guarded",
    "perform",
    "polled",
    "wire_of",
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


class Polled:
    """A redis-py connection that keeps the socket it talks on public (`socket`), so a
    `Wire` can poll it and write to it: a mixin in front of the connection class of a
    limiter's pool (`polled`). The socket is taken where the connection opens it
    (`_connect`, the hook redis-py's own connection classes extend for TLS and unix
    sockets) and let go when it closes."""

    socket: Any = None

    def _connect(self) -> Any:
        sock = super()._connect()  # type: ignore[misc]
        self.socket = sock
        return sock

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self.socket = None
        super().disconnect(*args, **kwargs)  # type: ignore[misc]


@functools.cache
def polled(connection_class: type) -> type:
    """`connection_class` (redis-py's, or a subclass of a cache's) with `Polled` in front,
    under the same name."""
    if issubclass(connection_class, Polled):
        return connection_class
    return type(connection_class.__name__, (Polled, connection_class), {})


class Wire:
    """A blocking client's commands, sent on connections this wire keeps.

    A command goes out on a connection taken from a stack that no lock guards (its pop
    and append are atomic), packed as the connection would pack it (hiredis's
    `pack_command`, which redis-py uses when hiredis is installed; else the
    connection's `send_command`) and written to its socket, its reply read by the
    connection (`read_response`), and is answered what `execute_command` answers:
    commands with a reply callback (`PING`, `SCRIPT LOAD` ...) and pipelines take the
    client's own path, and so does every command of a cluster client. Between that and
    checking a connection out of redis-py's pool for each command, the difference is
    what the pool does each time (its lock, its bookkeeping, its observability hooks),
    about half the client's CPU per round trip. What matters is kept: the connections
    are checked out of the client's pool (its options, its Sentinel master, its
    `max_connections`) and checked back in when the wire is closed or dropped; one the
    server closed is reconnected before use, as the pool checks its own; one whose
    command failed half-way is disconnected before it is used again; a forked child
    starts with none, as a pool does.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        # None: a cluster client, which routes each command itself, keeps its own path
        self.callbacks: Any = (client.response_callbacks if isinstance(client, redis.Redis)
                               else None)
        #: connections connected when last put back, and those disconnected by a failure:
        #: all checked out of the client's pool, and checked back in by `close()`
        self.warm: list[Any] = []
        self.cold: list[Any] = []
        #: each kept connection's socket and its poller (see `_stale`)
        self._pollers: dict[Any, tuple[Any, Any]] = {}
        #: hiredis's packer where redis-py would pack with it (the same bytes, without
        #: the connection's layers around it); None: the connection packs
        self.pack: Any = (_PACK if self.callbacks is not None and
                          client.connection_pool.connection_kwargs.get("command_packer") is None
                          else None)
        if self.callbacks is not None:  # the pool held weakly: it holds this wire
            weakref.finalize(self, _check_in_later, weakref.ref(client.connection_pool),
                             self.warm, self.cold)
        _wires.add(self)

    def perform(self, need: Need) -> Any:
        """Send `need` and read its reply (see `perform`)."""
        callbacks = self.callbacks
        if (type(need) is not Command or callbacks is None or need.args[0] in callbacks
                or " " in need.args[0]):
            return perform(self.client, need)
        return self.call(need.args)

    def call(self, args: tuple[Any, ...]) -> Any:
        """Send one command that has no reply callback (FCALL, EVALSHA, GET ...) and read
        its reply: `perform(Command(*args))` without asking which path it takes.

        An idle connection whose socket was polled before goes at once: polled again
        (see `_fresh`), the command packed as redis-py packs it and written to that
        socket, the reply read by the connection. Anything else (no idle connection,
        a new socket, a poll that says stale) is settled by `_ready` first."""
        if self.callbacks is None:
            return perform(self.client, Command(*args))
        connection: Any = None
        try:
            connection = self.warm.pop()
            sock, poller = self._pollers[connection]
            if sock is not connection.socket or poller.poll(0):
                sock = None  # another socket, or the server closed this one
        except (LookupError, OSError, ValueError):  # none idle, not polled yet, poll failed
            sock = None
        if sock is None:
            connection, sock = self._ready(connection)
        try:
            if sock is None or self.pack is None:
                connection.send_command(*args, check_health=False)
            else:  # what goes wrong raised as redis-py's `send_packed_command` raises it
                try:
                    sock.sendall(self.pack(args))
                except TypeError as exc:  # a value redis-py cannot send either
                    raise redis.DataError(str(exc)) from exc
                except TimeoutError as exc:  # (socket.timeout)
                    raise redis.TimeoutError("Timeout writing to socket") from exc
                except OSError as exc:
                    raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc
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

    def _ready(self, connection: Any) -> tuple[Any, Any]:
        """A connection ready for a command, from `connection` (an idle one the quick
        look of `call` did not clear, or None), and its socket when it can be polled
        (None: use the connection's own calls): an idle one checked as the pool checks
        its own, else one to connect again (a failure's), else one checked out of the
        client's pool, connected and checked by it."""
        if connection is None:
            try:
                connection = self.cold.pop()
            except IndexError:
                connection = self.client.connection_pool.get_connection()
            else:
                connection.connect()  # a Sentinel connection asks for the master here
        elif self._stale(connection):
            connection.disconnect()
            connection.connect()
        return connection, self._polled(connection)

    def _polled(self, connection: Any) -> Any:
        """The connection's socket, with a poller kept for it (None: none to poll)."""
        sock = connection.socket if isinstance(connection, Polled) else None
        if sock is None or _POLL is None:
            return None
        poller = _POLL()
        try:
            poller.register(sock, select.POLLIN)
        except (OSError, ValueError, TypeError):
            return None
        self._pollers[connection] = (sock, poller)
        return sock

    def _stale(self, connection: Any) -> bool:
        """Whether an idle connection must not carry a command: the server closed it (a
        restart, its idle timeout), or data no call asked for waits on it.

        One poll(2) of its socket, which reads as ready in both cases: redis-py's
        `can_read()`, asked where there is no socket to poll, answers the same for
        several times the cost (the socket's timeout changed twice, a read that fails,
        an exception). No reply waits in the parser's buffer: a call that stopped
        half-way disconnects its connection (see `call`).
        """
        if self._polled(connection) is not None:
            try:
                return bool(self._pollers[connection][1].poll(0))
            except (OSError, ValueError, TypeError):
                return True
        try:
            return bool(connection.can_read())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return True

    def close(self) -> None:
        """Check the idle connections back into the client's pool."""
        if self.callbacks is not None:
            _check_in(self.client.connection_pool, self.warm, self.cold)
        self._pollers.clear()

    def forget(self) -> None:
        """Drop the connections without touching their sockets: a forked child's copies
        belong to the parent (the child's pool starts afresh too)."""
        self.warm.clear()
        self.cold.clear()
        self._pollers.clear()


#: poll(2), where the platform has it (not on Windows)
_POLL = getattr(select, "poll", None)


def _hiredis_packer() -> Any:
    """hiredis's `pack_command` when redis-py packs commands with it (hiredis installed,
    a redis-py that has its hiredis serializer), else None."""
    try:
        import hiredis
        from redis.connection import HiredisRespSerializer  # noqa: F401  (its presence)
        from redis.utils import HIREDIS_AVAILABLE
    except ImportError:
        return None
    return hiredis.pack_command if HIREDIS_AVAILABLE else None


_PACK = _hiredis_packer()


#: The attribute of a connection pool that holds its wire (see `wire_of`).
_WIRE = "_ratelimits_wire"


def wire_of(client: redis.Redis) -> Wire:
    """The wire of `client`'s connection pool, made on first use and shared by every
    engine on that pool: the connections it keeps never outnumber the calls that were
    in flight at once on the pool, however many engines are built on it."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # a cluster client: its own routing
        return Wire(client)
    wire: Wire | None = getattr(pool, _WIRE, None)
    if wire is None:  # two threads racing here make two wires: the loser's engine
        # keeps its own, checked in when that engine closes
        wire = Wire(client)
        setattr(pool, _WIRE, wire)
    return wire


def _check_in(pool: Any, *stacks: list[Any]) -> None:
    """Give a wire's connections back to `pool` (also when the wire is dropped)."""
    for stack in stacks:
        while stack:
            try:
                connection = stack.pop()
            except IndexError:  # another thread took the last one
                break
            pool.release(connection)


def _check_in_later(pool: weakref.ref[Any], *stacks: list[Any]) -> None:
    """`_check_in` when a wire is dropped, if its pool still exists."""
    alive = pool()
    if alive is not None:
        _check_in(alive, *stacks)


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
