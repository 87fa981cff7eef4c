"""Key names, unique request tokens and the integer-microsecond clock shared by backends.

Both backends compute in integer microseconds so that the Lua scripts (IEEE doubles) and
the Python code (ints and floats) do identical arithmetic and reach identical decisions.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import threading
from collections.abc import Callable
from functools import lru_cache

from ratelimits.engine.constants import (
    OFFENDER_CHARS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    US,
)
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Limit

# The constants are re-exported: they are the figures of this key layout.
__all__ = [
    "OFFENDERS_CAP",
    "OFFENDERS_TTL",
    "OFFENDER_CHARS",
    "STATS_TTL",
    "US",
    "base_key",
    "guaranteed",
    "new_token",
    "offender_errors_key",
    "offenders_key",
    "period_us",
    "state_keys",
    "stats_key",
    "to_us",
]


def base_key(prefix: str, limit: Limit) -> str:
    """`<prefix>{<hash of policy and client>}:<algorithm>`: fixed length, one hash slot."""
    return _base_key(prefix, limit.name, limit.key, limit.algorithm)


@lru_cache(maxsize=16_384)  # recent clients: a hot client's key is hashed once, not per call
def _base_key(prefix: str, name: str, key: str, algorithm: str) -> str:
    raw = name.encode("utf-8", "surrogatepass") + b"\0" + key.encode("utf-8", "surrogatepass")
    digest = base64.urlsafe_b64encode(hashlib.blake2b(raw, digest_size=12).digest())
    return f"{prefix}{{{digest.decode('ascii')}}}:{REGISTRY[algorithm].code}"


def state_keys(prefix: str, limit: Limit, now_us: Callable[[], int]) -> list[str]:
    """Every key holding one client's state under `limit`: the base key, a window
    algorithm's current and previous windows (`now_us` is asked only then), the warm-up's
    state. What `reset()` deletes."""
    key = base_key(prefix, limit)
    keys = [key]
    if REGISTRY[limit.algorithm].windowed:
        win = now_us() // period_us(limit)
        keys += [f"{key}:{win}", f"{key}:{win - 1}"]
    if limit.warmup:
        keys.append(f"{key}:w")
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


def guaranteed(counts: dict[str, int], errors: dict[str, int], n: int) -> list[tuple[str, int]]:
    """The `n` offenders with the highest guaranteed counts (count minus error), highest
    first, ties by the greatest identity (as ZREVRANGE orders them)."""
    ranked = sorted(((who, c - errors.get(who, 0)) for who, c in counts.items()),
                    key=lambda kv: (kv[1], kv[0]), reverse=True)
    return ranked[:n]


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
