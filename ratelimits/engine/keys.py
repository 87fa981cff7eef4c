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
from functools import lru_cache

from ratelimits.engine.types import Limit

#: Short per-algorithm suffixes keep keys small (memory per idle key matters at scale).
ALGORITHM_CODES: dict[str, str] = {
    "fixed_window": "fw",
    "sliding_window": "sw",
    "sliding_log": "sl",
    "token_bucket": "tb",
    "leaky_bucket": "lb",
    "gcra": "g",
    "concurrency": "c",
}

US = 1_000_000
#: Per-policy counters are kept this long (seconds): a day plus an hour of slack.
STATS_TTL = 25 * 3600
#: Each policy's top offenders: one list per hour, kept two hours, at most this many.
OFFENDERS_TTL = 2 * 3600
OFFENDERS_CAP = 100
#: An offender is listed under the first this many characters of its identity.
OFFENDER_CHARS = 200


def base_key(prefix: str, limit: Limit) -> str:
    """`<prefix>{<hash of policy and client>}:<algorithm>`: fixed length, one hash slot."""
    return _base_key(prefix, limit.name, limit.key, limit.algorithm)


@lru_cache(maxsize=16_384)  # recent clients: a hot client's key is hashed once, not per call
def _base_key(prefix: str, name: str, key: str, algorithm: str) -> str:
    raw = name.encode("utf-8", "surrogatepass") + b"\0" + key.encode("utf-8", "surrogatepass")
    digest = base64.urlsafe_b64encode(hashlib.blake2b(raw, digest_size=12).digest())
    return f"{prefix}{{{digest.decode('ascii')}}}:{ALGORITHM_CODES[algorithm]}"


#: Algorithms that store one member per admitted unit, named by the request's token.
TOKEN_ALGORITHMS = frozenset({"sliding_log", "concurrency"})


def stats_key(prefix: str, name: str, minute: int) -> str:
    """The per-policy, per-minute counter hash (fields a, r, w, o)."""
    return f"{prefix}s:{name}:{minute}"


def offenders_key(prefix: str, name: str, hour: int) -> str:
    """The sorted set of the clients one policy refused (or would have) in one hour."""
    return f"{prefix}s:{name}:h{hour}"


def period_us(limit: Limit) -> int:
    return max(1, round(limit.period * US))


def burst_of(limit: Limit) -> int:
    """The burst the algorithms use: `limit` when unset, except 0 for the leaky bucket."""
    if limit.burst is not None:
        return limit.burst
    return 0 if limit.algorithm == "leaky_bucket" else limit.limit


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
