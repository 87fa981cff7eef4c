"""The engine's own connections to one Redis server (`Wire`): redis-py's connections,
checked out of the client's pool once and kept, each command written to the socket and
its reply read by the connection.

`Wire.call` is the request path's round trip on one server; `Wire.send` and
`Wire.receive` split a pipeline in two, so the cluster's fan-out writes every node's
pipeline before it reads any reply. `Polled` makes a connection's socket public, so a
wire can poll and write to it. `AsyncWire` is the same for one event loop's
`redis.asyncio` client.
"""

from __future__ import annotations

import asyncio
import functools
import os
import select
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # Python 3.10: the package redis.asyncio uses there
    from async_timeout import timeout as deadline

from ratelimits.engine.transport import Command, Need, aperform, perform

__all__ = ["AsyncWire", "Polled", "Wire", "polled", "wire_of"]


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
    commands with a reply callback (`PING`, `SCRIPT LOAD` ...), pipelines holding one,
    and every command of a cluster client take the client's own path. Between that and
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
        """Send `need` and read its reply (see `transport.perform`): a command or a
        pipeline on this wire's connections, unless the client's own path would answer
        otherwise (see `answered_raw`)."""
        if not answered_raw(need, self.callbacks):
            return perform(self.client, need)
        if isinstance(need, Command):
            return self.call(need.args)
        connection = self.send(need.commands)
        replies: list[Any] = []
        self.receive(connection, len(need.commands), replies)
        return replies

    def call(self, args: tuple[Any, ...]) -> Any:
        """Send one command that has no reply callback (FCALL, EVALSHA, GET ...) and read
        its reply: `perform(Command(*args))` without asking which path it takes."""
        if self.callbacks is None:
            return perform(self.client, Command(*args))
        connection, sock = self._take()
        try:
            if sock is None or self.pack is None:
                connection.send_command(*args, check_health=False)
            else:
                try:
                    sock.sendall(self.pack(args))
                except (TypeError, OSError) as exc:
                    raise _write_error(exc) from exc
            reply = connection.read_response()
        except redis.ResponseError:
            self.warm.append(connection)  # an error reply: the connection is sound
            raise
        except BaseException:
            self.drop(connection)  # a reply may be left half-read
            raise
        self.warm.append(connection)
        return reply

    def send(self, commands: Sequence[tuple[Any, ...]]) -> Any:
        """Write `commands` in one go, without reading their replies: the connection
        they went on, for `receive` (a pipeline split in two, so that several servers'
        pipelines are all written before any reply is read). Raises what a failed
        write raises, the connection then dropped."""
        connection, sock = self._take()
        try:
            self._write(connection, sock, commands)
        except BaseException:
            self.drop(connection)
            raise
        return connection

    def receive(self, connection: Any, count: int, into: list[Any]) -> None:
        """Read the `count` replies of what `send` wrote on `connection` into `into`,
        an error reply as its value, and keep the connection for the next command. A
        failure half-way (the replies read so far stay in `into`) is raised, the
        connection dropped."""
        try:
            for _ in range(count):
                try:
                    into.append(connection.read_response())
                except redis.ResponseError as exc:
                    into.append(exc)
        except BaseException:
            self.drop(connection)
            raise
        self.warm.append(connection)

    def drop(self, connection: Any) -> None:
        """Disconnect a connection whose replies may be left unread; it is connected
        again before its next command."""
        connection.disconnect()
        self.cold.append(connection)

    def _take(self) -> tuple[Any, Any]:
        """A connection ready for a command, and its socket (None: write through the
        connection). An idle connection whose socket was polled before goes at once,
        polled again (see `_stale`); anything else (no idle connection, a new socket, a
        poll that says stale) is settled by `_ready`."""
        connection: Any = None
        try:
            connection = self.warm.pop()
            sock, poller = self._pollers[connection]
            if sock is connection.socket and not poller.poll(0):
                return connection, sock
        except (LookupError, OSError, ValueError):  # none idle, not polled yet, poll failed
            pass
        return self._ready(connection)

    def _write(self, connection: Any, sock: Any, commands: Sequence[tuple[Any, ...]]
               ) -> None:
        """Write `commands` on `connection` in one go: packed as redis-py packs them and
        written to `sock` where both are known, else by the connection."""
        pack = self.pack
        if sock is None or pack is None:
            connection.send_packed_command(connection.pack_commands(commands),
                                           check_health=False)
            return
        try:
            sock.sendall(b"".join([pack(command) for command in commands]))
        except (TypeError, OSError) as exc:
            raise _write_error(exc) from exc

    def _ready(self, connection: Any) -> tuple[Any, Any]:
        """A connection ready for a command, from `connection` (an idle one the quick
        look of `_take` did not clear, or None), and its socket when it can be polled
        (None: use the connection's own calls): an idle one checked as the pool checks
        its own, else one to connect again (a failure's), else one checked out of the
        client's pool, connected and checked by it."""
        if connection is None:
            try:
                connection = self.cold.pop()
            except IndexError:
                connection = self.client.connection_pool.get_connection()
                return connection, self._polled(connection)
        elif self._stale(connection):
            connection.disconnect()
        else:
            return connection, self._polled(connection)
        try:  # a Sentinel connection asks for the master here
            connection.connect()
        except BaseException:
            self.cold.append(connection)  # still checked out of the pool: kept
            raise
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


class AsyncWire:
    """`Wire.call` (and a pipeline) for one event loop's `redis.asyncio` client: the
    commands of the asyncio request path sent on connections this wire keeps.

    A connection is checked out of the client's pool once and kept; each command is
    packed as a blocking client packs it (hiredis's `pack_command` where installed),
    written with `send_packed_command` and its reply read with `read_response`, the
    connection's own public calls. What the client's `execute_command` adds each time
    (the pool's lock and bookkeeping, its observability hooks, the retry wrapper, a
    Python packer) is skipped. The client's `socket_timeout` bounds each whole round
    trip (one `asyncio.timeout`), not the write and the read apart: a connection the
    wire keeps has none of its own, since redis.asyncio makes a task of every write it
    must time (`wait_for`), three turns of the loop per command. What the pool's
    checkout checks is kept: an idle connection is asked `can_read()` (before redis-py
    8, `can_read_destructive()`) before use, and one the server closed (a restart, its
    idle timeout) or that holds data no call asked for is connected again. A command
    that fails, times out or is cancelled half-way leaves its connection disconnected by
    redis-py (a reply may be unread), and the wire connects it again before its next
    command. `perform` sends commands with a reply callback on the client's own path.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.callbacks = client.response_callbacks
        #: seconds a round trip may take (the client's socket timeout; None: no bound)
        self.timeout: float | None = self.pool.connection_kwargs.get("socket_timeout")
        #: connections checked out of the client's pool and not in use
        self.idle: list[Any] = []

    async def perform(self, need: Need) -> Any:
        """`Wire.perform`, awaited (see `transport.aperform`)."""
        if not answered_raw(need, self.callbacks):
            return await aperform(self.client, need)
        if isinstance(need, Command):
            return await self.call(need.args)
        return await self.pipeline(need.commands)

    async def call(self, args: tuple[Any, ...]) -> Any:
        """Send one command that has no reply callback (FCALL, EVALSHA, GET ...) and await
        its reply: `Wire.call`, awaited."""
        return await self._timed((args,), None)

    async def pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send `commands` in one write and await their replies, an error reply as that
        command's value (a pipeline's `execute(raise_on_error=False)`, raw replies as
        `Wire.receive` reads them)."""
        replies: list[Any] = []
        await self._timed(commands, replies)
        return replies

    async def _timed(self, commands: Sequence[tuple[Any, ...]], into: list[Any] | None
                     ) -> Any:
        """`_exchange` within the wire's timeout, which raises what redis-py raises when
        a reply is late (the connection is then disconnected, see the class)."""
        timeout = self.timeout
        if timeout is None:
            return await self._exchange(commands, into)
        try:
            async with deadline(timeout):
                return await self._exchange(commands, into)
        except asyncio.TimeoutError as exc:  # the wire's own: one from outside passes
            raise redis.TimeoutError(f"No reply from Redis within {timeout} s") from exc

    async def _exchange(self, commands: Sequence[tuple[Any, ...]], into: list[Any] | None
                        ) -> Any:
        """Write `commands` on a connection and read their replies: into `into`, an error
        reply as its command's value, or (None: one command) the reply, an error raised."""
        connection = await self._take()
        try:
            if _PACK is None:
                packed = connection.pack_commands(commands)
            elif len(commands) == 1:
                packed = _PACK(commands[0])
            else:
                packed = b"".join([_PACK(command) for command in commands])
            await connection.send_packed_command(packed, check_health=False)
            if into is None:
                return await connection.read_response()
            for _ in commands:
                try:
                    into.append(await connection.read_response())
                except redis.ResponseError as exc:
                    into.append(exc)
            return None
        finally:
            # sound after its replies or an error reply; after any other failure, a
            # cancellation too, disconnected by redis-py and connected again by `_take`
            self.idle.append(connection)

    async def _take(self) -> Any:
        """A connection ready for a command: an idle one, checked as the pool checks its
        own (connected again if it was disconnected, closed by the server or holds
        unread data), else one checked out of the pool (the wire's timeout its own)."""
        try:
            connection = self.idle.pop()
        except IndexError:
            connection = await self.pool.get_connection()  # type: ignore[no-untyped-call]
            if self.timeout is not None:
                connection.socket_timeout = None  # see the class: `_timed` bounds it
            return connection
        try:
            if connection.is_connected:
                try:
                    if not await getattr(connection, _CAN_READ)():
                        return connection
                except redis.ConnectionError:
                    pass
                await connection.disconnect()
            await connection.connect()
        except BaseException:
            self.idle.append(connection)  # still checked out of the pool: kept
            raise
        return connection


#: An asyncio connection's check for a closed socket or unread data, as its pool asks it:
#: `can_read` from redis-py 8 on, which deprecates the older name.
_CAN_READ = ("can_read" if hasattr(redis.asyncio.connection.AbstractConnection, "can_read")
             else "can_read_destructive")


def answered_raw(need: Need, callbacks: Any) -> bool:
    """Whether the client's own path answers every command of `need` with the raw reply,
    as a wire reads it: a client with reply callbacks (None: a cluster client, which
    routes each command itself), none for these commands, each named in one word (the
    client splits "SCRIPT LOAD" in two before packing it)."""
    if callbacks is None:
        return False
    commands = (need.args,) if isinstance(need, Command) else need.commands
    for command in commands:
        name = command[0]
        if name in callbacks or " " in name:
            return False
    return True


def _write_error(exc: Exception) -> redis.RedisError:
    """What a failed write raises, as redis-py's `send_packed_command` raises it."""
    if isinstance(exc, TypeError):  # a value redis-py cannot send either
        return redis.DataError(str(exc))
    if isinstance(exc, TimeoutError):  # (socket.timeout)
        return redis.TimeoutError("Timeout writing to socket")
    return redis.ConnectionError(f"Error while writing to socket: {exc}")


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
