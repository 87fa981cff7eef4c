"""A connection that hears what changes in the store that a process must not miss.

**Redis** (`ChangeWatch`) tells a connection when a key it watches is written, through
client-side caching's invalidation messages (`CLIENT TRACKING ... BCAST PREFIX`, Redis 6
and later): the messages come on the pub/sub channel `__redis__:invalidate`, and
`FLUSHDB` and `FLUSHALL` send one that names no key. So the watch hears, with no
publisher of its own that could be skipped or fail after the write:

- the policy version written (an edit, a mode switch, an override: `bump_version`),
- a client's state reset by an operator (`announce_reset` writes the policy's
  `forget` key), and
- the store flushed or restarted empty (the message without keys; a lost connection).

**PostgreSQL** (`ListenWatch`) has no such messages for a table, so the engine sends its
own: the statement that bumps the version or resets a client also runs a `NOTIFY` on the
engine's channel (`channel`), in the write's transaction, so the message leaves at its
commit and never without it; the watch is a session of its own that `LISTEN`s on it. A
restarted server ends the session: a lost connection, as on Redis.

Both watches offer what `interfaces.Watch` declares. The engine knows nothing of threads:
`ratelimits.pipeline.changes` runs the watch in one per process and says what each change
voids there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratelimits.engine.wire import polled

__all__ = ["FLUSHED", "POLICIES", "RESET", "RESET_TTL", "Change", "ChangeWatch", "ListenWatch",
           "channel", "forget_key", "notice", "watch_connection"]

#: The channel Redis sends invalidation messages on to a RESP2 connection.
CHANNEL = b"__redis__:invalidate"

#: What changed: the policies (the version key), one policy's clients (a reset), or
#: everything the store held (a flush).
POLICIES, RESET, FLUSHED = "policies", "reset", "flushed"


@dataclass(frozen=True, slots=True)
class Change:
    """One change heard: its kind, and for a reset the policy's name."""

    kind: str
    name: str = ""


#: Seconds a reset's key is kept: its write is the message, the key only needs a TTL.
RESET_TTL = 60


def forget_prefix(version_key: str) -> str:
    """The prefix of the reset keys: in the version key's hash slot (Redis Cluster), so
    that one node's watch hears both."""
    return "{" + version_key + "}:forget:"


def forget_key(version_key: str, name: str) -> str:
    """The key written when an operator resets a client of policy `name`."""
    return forget_prefix(version_key) + name


def watch_connection(pool: Any) -> Any:
    """A connection of its own to the server of redis-py `pool`, with its settings
    (address, database, credentials, TLS; Sentinel's primary), in RESP2, where
    invalidations come as messages of a subscribed connection."""
    return polled(pool.connection_class)(**{**pool.connection_kwargs, "protocol": 2})


def _readable(sock: Any) -> bool:
    """Whether `sock` (a socket, a file descriptor; None: closed) has something to read
    now."""
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed by another thread meanwhile
        return False


class ChangeWatch:
    """One connection (a redis-py connection whose socket is public, `wire.Polled`)
    that hears writes to the version key and the reset keys, and flushes.

    `open()` connects and asks Redis for the messages; `wait()` waits for one without
    reading it; `read()` reads what has come; `pending()` says, without reading, whether
    something came that `read()` has not read. Raises redis-py's errors.
    """

    def __init__(self, connection: Any, version_key: str) -> None:
        self.connection = connection
        self.version_key = version_key.encode()
        self.forget = forget_prefix(version_key).encode()

    def open(self) -> None:
        """Connect; track the version key and the reset keys, redirected to this
        connection, which then listens on the invalidation channel."""
        conn = self.connection
        conn.connect()
        conn.send_command("CLIENT", "ID")
        own = conn.read_response()
        conn.send_command("CLIENT", "TRACKING", "ON", "REDIRECT", own, "BCAST",
                          "PREFIX", self.version_key, "PREFIX", self.forget)
        conn.read_response()
        conn.send_command("SUBSCRIBE", CHANNEL)
        conn.read_response()

    def wait(self, timeout: float) -> bool:
        """Whether something came within `timeout` seconds (nothing is read)."""
        sock = self.connection.socket
        if sock is None:
            raise ConnectionError("the watch's connection is closed")
        return bool(select.select([sock], [], [], timeout)[0])

    def pending(self) -> bool:
        """Whether something came that was not read yet (an answer at once)."""
        return _readable(self.connection.socket)

    def read(self) -> list[Change]:
        """The changes that came: one message at least (the caller waited for it), then
        whatever else is there already."""
        conn = self.connection
        changes = self._changes(conn.read_response())
        while conn.can_read(timeout=0):
            changes += self._changes(conn.read_response())
        return changes

    def ping(self) -> None:
        """Ask the server for a sign of life; its answer comes as a message (`read`)."""
        self.connection.send_command("PING")

    def close(self) -> None:
        """Close the connection (from any thread: a `wait()` in another one returns;
        redis-py shuts a socket down only in the process that opened it)."""
        self.connection.disconnect()

    def _changes(self, message: Any) -> list[Change]:
        if not isinstance(message, list) or len(message) != 3 or message[0] != b"message":
            return []  # the answer to a ping, a subscription confirmed
        keys = message[2]
        if keys is None:  # FLUSHDB, FLUSHALL
            return [Change(FLUSHED)]
        out = []
        for key in keys:
            if key == self.version_key:
                out.append(Change(POLICIES))
            elif key.startswith(self.forget):
                out.append(Change(RESET, key[len(self.forget):].decode("utf-8", "replace")))
        return out


# -- PostgreSQL ------------------------------------------------------------------------

#: PostgreSQL's longest name (NAMEDATALEN - 1 bytes): a longer channel is refused by
#: `pg_notify` and cut short by `LISTEN`.
LONGEST_CHANNEL = 63
CHANNEL_PREFIX = "ratelimits_v1:"


def channel(version_key: str) -> str:
    """The PostgreSQL channel on which the changes of the limits under `version_key` are
    announced: the engine's, one per key prefix (two sites sharing a database never hear
    each other). A key too long for a name is replaced by its digest."""
    name = CHANNEL_PREFIX + version_key
    if len(name.encode()) > LONGEST_CHANNEL:
        name = CHANNEL_PREFIX + hashlib.sha256(version_key.encode()).hexdigest()[:40]
    return name


def notice(kind: str, name: str = "") -> str:
    """The payload of a NOTIFY that says `Change(kind, name)` (`ListenWatch` reads it)."""
    return f"{kind}:{name}" if name else kind


def _heard(payload: str) -> Change | None:
    kind, _, name = payload.partition(":")
    if kind == POLICIES:
        return Change(POLICIES)
    if kind == RESET and name:
        return Change(RESET, name)
    return None  # a payload of a later version of the engine: nothing to act on here


class ListenWatch:
    """A PostgreSQL session of its own (psycopg 3, autocommit) that `LISTEN`s on the
    engine's `channel`, opened by `connect` (a function returning a psycopg connection).

    Once `open()` has run the statement, the session is read through libpq without
    blocking: `wait()` selects on its socket, `read()` consumes what came (a
    notification, the answer to a `ping()`) and `pending()` looks without reading. A
    session ended by the server (a restart, `pg_terminate_backend`) raises
    `ConnectionError` from `read()` or `wait()`.
    """

    def __init__(self, connect: Callable[[], Any], channel: str) -> None:
        self.connect = connect
        self.channel = channel
        self._conn: Any = None
        self._fd = -1
        #: The process that opened the session: the only one that may end it.
        self._pid = 0
        #: Notifications psycopg read itself while `open()` ran its statement.
        self._early: list[str] = []
        #: Held while libpq's connection is used, so that `close()` from another thread
        #: never frees it under a `read()`.
        self._lock = threading.Lock()

    def open(self) -> None:
        """Connect and listen (raises psycopg's errors)."""
        from psycopg import sql

        conn = self.connect()
        self._conn, self._pid = conn, os.getpid()
        conn.add_notify_handler(self._early_notify)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self._fd = conn.pgconn.socket

    def _early_notify(self, notify: Any) -> None:
        if notify.channel == self.channel:
            self._early.append(notify.payload)

    def wait(self, timeout: float) -> bool:
        """Whether something came within `timeout` seconds (nothing is read)."""
        if self._early:
            return True
        fd = self._fd
        if fd < 0:
            raise ConnectionError("the watch's connection is closed")
        return bool(select.select([fd], [], [], timeout)[0])

    def pending(self) -> bool:
        """Whether something came that was not read yet (an answer at once)."""
        return bool(self._early) or _readable(self._fd if self._fd >= 0 else None)

    def read(self) -> list[Change]:
        """The changes that came; the answer to a ping is read and says none. Raises
        `ConnectionError` when the session is over."""
        import psycopg
        from psycopg import pq

        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                raise ConnectionError("the watch's connection is closed")
            pgconn = conn.pgconn
            try:
                pgconn.consume_input()
            except psycopg.OperationalError as exc:
                raise ConnectionError(f"the watch's session ended: {exc}") from exc
            while not pgconn.is_busy() and pgconn.get_result() is not None:
                pass  # the answer to a ping, read whole (else the rest comes later)
            payloads, self._early = self._early, []
            while (notify := pgconn.notifies()) is not None:
                if notify.relname.decode("utf-8", "replace") == self.channel:
                    payloads.append(notify.extra.decode("utf-8", "replace"))
            if pgconn.status != pq.ConnStatus.OK:
                raise ConnectionError("the watch's session ended: "
                                      + pgconn.get_error_message())
        return [change for change in map(_heard, payloads) if change is not None]

    def ping(self) -> None:
        """Ask the server for a sign of life (`SELECT 1`, not waited for: its answer
        makes the socket readable, and `read()` reads it)."""
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                raise ConnectionError("the watch's connection is closed")
            conn.pgconn.send_query(b"SELECT 1")

    def close(self) -> None:
        """End the session (from any thread: a `wait()` in another one returns). In a
        forked child, only forget it: the socket is its parent's too."""
        with self._lock:
            conn, self._conn = self._conn, None
            fd, self._fd = self._fd, -1
            if self._pid != os.getpid():
                return
            if fd >= 0:
                # a socket closed under select() wakes nobody: shut its reading side
                # down first (nothing is sent; the server still gets its goodbye)
                with contextlib.suppress(OSError):
                    own = socket.socket(fileno=os.dup(fd))
                    try:
                        own.shutdown(socket.SHUT_RD)
                    finally:
                        own.close()
            if conn is not None:
                with contextlib.suppress(Exception):  # a broken session may fail to close
                    conn.close()
