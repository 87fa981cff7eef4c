"""Key names, unique request tokens and the integer-microsecond clock shared by backends.

Both backends compute in integer microseconds so that the Lua scripts (IEEE doubles) and
the Python code (ints and floats) do identical arithmetic and reach identical decisions.
"""

from __future__ import annotations

import binascii
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from functools import lru_cache

from ratelimits.engine import calendar
from ratelimits.engine.constants import (
    OFFENDER_CHARS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    US,
    WINDOW_SHARDS,
)
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Limit

# The constants are re-exported: they are the figures of this key layout.
__all__ = [
    "CLOCKS",
    "OFFENDERS_CAP",
    "OFFENDERS_TTL",
    "OFFENDER_CHARS",
    "STATS_TTL",
    "US",
    "base_key",
    "cell",
    "client_key",
    "clock_of",
    "guaranteed",
    "lock_key",
    "new_token",
    "offender_errors_key",
    "offenders_key",
    "period_us",
    "reached_keys",
    "state_keys",
    "stats_key",
    "stored_state",
    "to_us",
    "windows",
]


def base_key(prefix: str, limit: Limit) -> str:
    """The key a Redis call declares for `limit`: the client's own key (`client_key`),
    except under a window algorithm, whose counts are packed: a policy's clients are
    spread over `WINDOW_SHARDS` shards by a hash of the client, each shard holds one hash
    per window (`<base key>:<window>`), and the client is a field of it (`cell`). No key
    per client: a small hash stores a client in about 20 bytes where a key of its own
    costs Redis 130."""
    return _cell(prefix, limit.name, limit.key, limit.algorithm)[0]


def cell(prefix: str, limit: Limit) -> tuple[str, str]:
    """`base_key()` and the client's field in its shard's window hashes ('' for the
    algorithms that keep a key per client)."""
    return _cell(prefix, limit.name, limit.key, limit.algorithm)


def client_key(prefix: str, limit: Limit) -> str:
    """`<prefix>{<hash of policy and client>}:<algorithm>`: fixed length, one hash slot.
    The in-process engine keys every client by it; Redis every client of the algorithms
    that keep a state per client."""
    return _cell(prefix, limit.name, limit.key, "")[0] + REGISTRY[limit.algorithm].code


def _digest(name: str, key: str) -> bytes:
    raw = name.encode("utf-8", "surrogatepass") + b"\0" + key.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=12).digest()


#: base64's "+/" as the URL-safe alphabet writes them ("-_"), for `_b64`.
_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def _b64(raw: bytes) -> str:
    """`raw` in URL-safe base64 without padding (binascii in place of the `base64`
    module's two Python-level calls: this runs for each new client)."""
    return binascii.b2a_base64(raw, newline=False).translate(_URL_SAFE).decode("ascii").rstrip("=")


@lru_cache(maxsize=1_024)
def _policy_tag(name: str) -> str:
    return _b64(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=6).digest())


@lru_cache(maxsize=16_384)  # recent clients: a hot client's key is hashed once, not per call
def _cell(prefix: str, name: str, key: str, algorithm: str) -> tuple[str, str]:
    """(key, field) of one client; `algorithm` '' gives the client key without its code."""
    digest = _digest(name, key)
    if algorithm and REGISTRY[algorithm].windowed:
        shard = int.from_bytes(digest[:2], "big") % WINDOW_SHARDS
        tag = f"{_policy_tag(name)}{shard:03x}"
        return f"{prefix}{{{tag}}}:{REGISTRY[algorithm].code}", _b64(digest[2:10])
    code = REGISTRY[algorithm].code if algorithm else ""
    return f"{prefix}{{{_b64(digest)}}}:{code}", ""


def windows(limit: Limit, at_us: int, *, ahead: bool = False) -> list[int]:
    """The numbers of a window algorithm's current and previous windows at `at_us` (and
    the next one, `ahead`): a window's count lives at `<key>:<number>`. A period-long
    window is numbered by how many periods since the epoch; a calendar window by its
    start, in seconds."""
    if not limit.calendar:
        win = at_us // period_us(limit)
        return [win, win - 1, win + 1] if ahead else [win, win - 1]
    start, end = calendar.window(limit.calendar, limit.zone, at_us / US)
    previous, _ = calendar.window(limit.calendar, limit.zone, start - 1)
    return [start, previous, end] if ahead else [start, previous]


def reached_keys(prefix: str, limit: Limit, at_us: int, *, exact: bool,
                 lease: bool = False) -> tuple[str, ...]:
    """Every key beyond its base key that a script deciding `limit` at `at_us` may touch:
    a window algorithm's window hashes, the warm-up's state, the lockout's. A call passes
    them all in KEYS, as a strict server (ElastiCache Serverless, Dragonfly) refuses a
    script any key it was not given.

    `exact`: the call sends `at_us` and the script decides at it: the windows it reads
    then. Else the script reads its server's clock, which may be on either side of a
    window's edge from this one: the windows one period either side go too (a calendar
    window's script picks between the two its call carries, see `calendar.bounds`).
    `lease`: the lease script's windows, each with the one before it (a reset of the
    client clears it)."""
    current: tuple[int, ...] = ()
    if REGISTRY[limit.algorithm].windowed:
        if limit.calendar:
            start, end, _ = calendar.bounds(limit.calendar, limit.zone, at_us)
            current = (start // US,) if exact else (start // US, end // US)
        else:
            win = at_us // period_us(limit)
            current = (win,) if exact else (win - 1, win, win + 1)
    return _reached(prefix, limit.name, limit.key, limit.algorithm, current,
                    bool(limit.warmup), bool(limit.lockout), lease)


@lru_cache(maxsize=16_384)  # a call's keys are named once per client and window
def _reached(prefix: str, name: str, key: str, algorithm: str, current: tuple[int, ...],
             warm: bool, lock: bool, lease: bool) -> tuple[str, ...]:
    base, field = _cell(prefix, name, key, algorithm)
    if lease or REGISTRY[algorithm].reads_previous:
        current = tuple(sorted({w for c in current for w in (c - 1, c)}))
    out = [f"{base}:{w}" for w in current]
    if warm:
        out.append(f"{base}:w")
    if lock:
        out.append(lock_key(base, field))
    return tuple(out)


def lock_key(key: str, field: str = "") -> str:
    """Where a lockout keeps until when (µs) it holds the client of `key` (and `field`,
    in a window algorithm's shard)."""
    return f"{key}:x{field}"


def stored_state(
    prefix: str, limit: Limit, now_us: Callable[[], int]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Where Redis holds one client's state under `limit`: keys of its own (its key, the
    warm-up's state, the lockout's), and (hash, field) cells of a window algorithm's
    current and previous windows (`now_us` is asked only then). What `reset()` deletes."""
    key, field = cell(prefix, limit)
    own = [lock_key(key, field)] if limit.lockout else []
    if not REGISTRY[limit.algorithm].windowed:
        return [key, f"{key}:w", *own] if limit.warmup else [key, *own], []
    return own, [(f"{key}:{win}", field) for win in windows(limit, now_us())]


def state_keys(prefix: str, limit: Limit, now_us: Callable[[], int]) -> list[str]:
    """Every key of the in-process engine holding one client's state under `limit`: its
    key, a window algorithm's current and previous windows (`now_us` is asked only then),
    the warm-up's state, the lockout's. What `MemoryEngine.reset()` deletes."""
    key = client_key(prefix, limit)
    keys = [key]
    if REGISTRY[limit.algorithm].windowed:
        keys += (f"{key}:{win}" for win in windows(limit, now_us()))
    if limit.warmup:
        keys.append(f"{key}:w")
    if limit.lockout:
        keys.append(lock_key(key))
    return keys


def stats_key(prefix: str, name: str, minute: int) -> str:
    """The per-policy, per-minute counter hash (fields a, r, w, o)."""
    return f"{prefix}s:{name}:{minute}"


def offenders_key(prefix: str, name: str, hour: int) -> str:
    """The sorted set of the clients one policy refused (or would have) in one hour."""
    return f"{prefix}s:{name}:h{hour}"


def offender_errors_key(prefix: str, name: str, hour: int) -> str:
    """Beside the offenders of one hour: the count each entrant of a full list inherited
    (its error), for members that have one."""
    return f"{offenders_key(prefix, name, hour)}:e"


def offender_keys(prefix: str, name: str, hour: int) -> tuple[str, str]:
    """The offenders of one policy in one hour, and their errors, on one server."""
    return offenders_key(prefix, name, hour), offender_errors_key(prefix, name, hour)


def figure_keys(prefix: str, name: str, now: float,
                offenders: Callable[[str, str, int], tuple[str, ...]] = offender_keys
                ) -> list[str]:
    """Every key that may still hold a figure of policy `name` at `now` (seconds): its
    per-minute counters and its offenders for as long as each is kept, named rather than
    scanned for. `offenders` names a layout's offender keys of one hour."""
    minute, hour = int(now // 60), int(now // 3600)
    keys = [stats_key(prefix, name, m) for m in range(minute - STATS_TTL // 60 - 1, minute + 2)]
    for h in range(hour - OFFENDERS_TTL // 3600 - 1, hour + 2):
        keys += offenders(prefix, name, h)
    return keys


def guaranteed(counts: dict[str, int], errors: dict[str, int], n: int) -> list[tuple[str, int]]:
    """The `n` offenders with the highest guaranteed counts (count minus error), highest
    first, ties by the greatest identity (as ZREVRANGE orders them)."""
    ranked = sorted(((who, c - errors.get(who, 0)) for who, c in counts.items()),
                    key=lambda kv: (kv[1], kv[0]), reverse=True)
    return ranked[:n]


#: Where a store's scripts take the time of a call that gives none: "store", the
#: server's clock (`TIME`: one clock for every process, whatever theirs say), or
#: "client", this process's, sent with each call (for a server that refuses `TIME` in
#: scripts; the processes' clocks must then agree, see "Managed services with script
#: restrictions" in docs/reliability.md).
CLOCKS = ("store", "client")


def _as_given(now: float | None) -> float | None:
    return now


def _or_this_clock(now: float | None) -> float | None:
    return time.time() if now is None else now


def clock_of(clock: str) -> Callable[[float | None], float | None]:
    """The time a store engine sends with a call given `now` under `clock` (`CLOCKS`):
    `now` itself, or, when None, nothing ("store") or this process's clock ("client")."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(map(repr, CLOCKS))}, got {clock!r}")
    return _or_this_clock if clock == "client" else _as_given


def period_us(limit: Limit) -> int:
    return max(1, round(limit.period * US))


def to_us(now: float) -> int:
    return round(now * US)


_prefix = os.urandom(5).hex()
_counter = itertools.count()
_pid = os.getpid()
_lock = threading.Lock()


def new_token() -> str:
    """A token unique across processes and hosts: names sliding-log and concurrency entries."""
    global _prefix, _counter, _pid
    if os.getpid() != _pid:  # a forked worker must not reuse its parent's sequence
        with _lock:
            if os.getpid() != _pid:
                _prefix, _counter, _pid = os.urandom(5).hex(), itertools.count(), os.getpid()
    return f"{_prefix}{next(_counter):x}"
