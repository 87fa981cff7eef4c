"""A connection that hears what changes in the store that a process must not miss.

Redis tells a connection when a key it watches is written, through client-side caching's
invalidation messages (`CLIENT TRACKING ... BCAST PREFIX`, Redis 6 and later): the
messages come on the pub/sub channel `__redis__:invalidate`, and `FLUSHDB` and
`FLUSHALL` send one that names no key. So the watch hears, with no publisher of its own
that could be skipped or fail after the write:

- the policy version written (an edit, a mode switch, an override: `bump_version`),
- a client's state reset by an operator (`announce_reset` writes the policy's
  `forget` key), and
- the store flushed or restarted empty (the message without keys; a lost connection).

The engine knows nothing of threads: `ratelimits.pipeline.changes` runs the watch in
one per process and says what each change voids there.
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import Any

from ratelimits.engine.transport import polled

__all__ = ["FLUSHED", "POLICIES", "RESET", "RESET_TTL", "Change", "ChangeWatch", "forget_key",
           "watch_connection"]

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


class ChangeWatch:
    """One connection (a redis-py connection whose socket is public, `transport.Polled`)
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
        sock = self.connection.socket
        if sock is None:
            return False
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):  # closed by another thread meanwhile
            return False

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
