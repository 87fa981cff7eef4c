"""The in-process engine's keyspace: values with an expiry on the engine's own clock."""

from __future__ import annotations

import math
from typing import Any


def ttl_us(us: float) -> float:
    """The expiry Redis would set: whole milliseconds, rounded up, at least one."""
    return float(max(1, math.ceil(us / 1000)) * 1000)


class Keyspace:
    """Keys with expiry on the engine's own clock (explicit `now` or wall time)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[Any, float]] = {}
        self.calls = 0

    def get(self, key: str, now: float) -> Any:
        entry = self.data.get(key)
        if entry is None:
            return None
        if now >= entry[1]:
            del self.data[key]
            return None
        return entry[0]

    def set(self, key: str, value: Any, now: float, ttl: float) -> None:
        # ttl_us() inlined: this runs on every charge
        self.data[key] = (value, now + max(1, math.ceil(ttl / 1000)) * 1000)

    def sweep(self, now: float) -> None:
        """Drop expired keys now and then, so idle clients cost nothing."""
        self.calls += 1
        if self.calls % 1024 == 0:
            for key in [k for k, (_, exp) in self.data.items() if now >= exp]:
                del self.data[key]
