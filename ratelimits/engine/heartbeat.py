"""How many processes share the store: a heartbeat piggy-backed on calls already made.

Each process that decides requests registers itself in one sorted set, `<prefix>live`,
scored by the time of its last beat, and reads back how many processes beat within
`LIVE_TTL`. A beat rides along with a call the process makes anyway (an evaluation or a
version read), at most every `BEAT_EVERY` seconds, never on its own. A process that
stops beating drops out after `LIVE_TTL`. The pipeline's `on_error="local"` divides a
shared limit by the last count learnt. `beating` is the beat riding on one server's call,
as a flow (`flows`): the engine and its asyncio twin run the same one.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ratelimits.engine.flows import Flow
from ratelimits.engine.transport import Pipelined, Script

__all__ = [
    "BEAT_EVERY",
    "LIVE_TTL",
    "Heartbeat",
    "beating",
    "live_key",
    "live_script",
    "live_source",
]

#: Seconds between two beats of one process (a beat rides on the first call after).
BEAT_EVERY = 2.0
#: Seconds after its last beat that a process stops counting as live.
LIVE_TTL = 10.0


def live_key(prefix: str) -> str:
    """The sorted set of live processes under `prefix`."""
    return f"{prefix}live"


@lru_cache(maxsize=1)
def live_source() -> str:
    """The heartbeat script (see lua/live.lua)."""
    return (resources.files("ratelimits.engine") / "lua" / "live.lua").read_text("utf-8")


@lru_cache(maxsize=1)
def live_script() -> Script:
    """The heartbeat script, run by EVALSHA."""
    return Script(live_source())


class Heartbeat:
    """One process's beat: when the next one is due, who it is, what it learnt.

    `due()` claims the beat for one caller (another thread's call goes without it), so a
    burst of calls carries one beat, not one each. Thread-safe.
    """

    def __init__(self, key: str, *, every: float = BEAT_EVERY, ttl: float = LIVE_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key = key
        self.every = every
        self.ttl = ttl
        self.clock = clock
        #: Live processes at the last beat (this one included); None before the first.
        self.count: int | None = None
        #: no beat is due before this time of `clock` (a call made sooner need not ask
        #: `due()`); a forked child's is in the past, so that it beats at once
        self.next_at = -float("inf")
        self._lock = threading.Lock()
        self._pid = 0
        self._member = ""
        _beats.add(self)

    def due(self) -> bool:
        """Whether this call should carry a beat; claims it when so."""
        now = self.clock()
        if now < self.next_at and self._pid == os.getpid():  # a forked child beats at once
            return False
        with self._lock:
            if now < self.next_at and self._pid == os.getpid():
                return False
            self.next_at = now + self.every
            return True

    def member(self) -> str:
        """This process's name in the set: host, pid and a random part, new after a fork."""
        pid = os.getpid()
        if pid != self._pid:
            self._member = f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}"
            self._pid = pid
        return self._member

    def args(self, now: float | None = None) -> list[Any]:
        """The script's ARGV for one beat at `now` (seconds; None: the server's clock)."""
        return [self.member(), self.ttl, "" if now is None else repr(float(now))]

    def learnt(self, reply: Any) -> int:
        """Keep the count a beat read back."""
        self.count = int(reply)
        return self.count

    def missed(self) -> None:
        """The call carrying the beat failed: beat again with the next call."""
        self.next_at = -float("inf")


#: Every heartbeat of this process, so that a forked child's beats at its first call.
_beats: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


def _forked() -> None:
    for beat in list(_beats):
        beat._lock = threading.Lock()  # another thread of the parent may have held it
        beat.next_at = -float("inf")


os.register_at_fork(after_in_child=_forked)


def beating(beat: Heartbeat, command: tuple[Any, ...], now: float | None) -> Flow[Any]:
    """`command` and a beat pipelined in one round trip; `command`'s reply, an error of
    the command as its value (for the caller to recover from or raise).

    The beat's count is learnt; a beat the server had no script for is loaded and sent
    again alone (the first beat after a restart or a SCRIPT FLUSH); a beat that failed
    is tried again with the next call.
    """
    script = live_script()
    keys, args = [beat.key], beat.args(now)
    try:
        reply, count = yield Pipelined(command, script.command(keys, args))
    except Exception:
        beat.missed()
        raise
    if isinstance(count, NoScriptError):
        try:
            count = yield from script.call(keys, args)
        except redis.RedisError as exc:
            count = exc
    if isinstance(count, Exception):
        beat.missed()
    else:
        beat.learnt(count)
    return reply
