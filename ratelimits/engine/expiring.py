"""The in-process engine's store: values with an expiry on the engine's own clock."""

from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import Any

#: Expiry is filed in slots of this many µs: a key leaves memory at most this late
#: (reads never see it after its exact expiry).
GRAIN = 1_000_000


class ExpiringStore:
    """Keys with expiry on the engine's own clock (explicit `now` or wall time).

    Expiry costs O(1) amortised per operation, like a timing wheel: each key is filed in
    the slot (one second wide) where its expiry falls, and a small heap orders the
    slots, not the keys. `sweep(now)` empties only the slots that are due: a key written
    again since then with a later expiry is filed anew, one deleted meanwhile is skipped.
    So a write files a key at most once per expiry it outlives, a hot key sits in one
    slot however often it is written, and idle clients leave without a walk over all keys.
    """

    __slots__ = ("_due", "_slots", "data", "examined", "next_due")

    def __init__(self) -> None:
        #: key -> [value, expiry, the start of the slot it is filed in (µs)]
        self.data: dict[str, list[Any]] = {}
        self._slots: dict[float, list[str]] = {}  # slot start -> its keys
        self._due: list[float] = []  # heap of the slots' starts
        #: When the first slot is due (µs): callers skip `sweep()` before then.
        self.next_due = math.inf
        #: Filed keys `sweep()` has looked at since the start (its whole cost).
        self.examined = 0

    def get(self, key: str, now: float) -> Any:
        entry = self.data.get(key)
        if entry is None:
            return None
        if now >= entry[1]:
            del self.data[key]  # its slot is due: the next sweep skips it
            return None
        return entry[0]

    def entry(self, key: str, now: float) -> list[Any] | None:
        """A key's live entry ([value, expiry, slot]), to change its value in place and
        keep its TTL (a refund); None when absent or expired."""
        entry = self.data.get(key)
        return entry if entry is not None and now < entry[1] else None

    def set(self, key: str, value: Any, now: float, ttl: float) -> None:
        # whole milliseconds, rounded up, at least one: the expiry Redis would set
        expiry = now + max(1, math.ceil(ttl / 1000)) * 1000
        entry = self.data.get(key)
        if entry is None:
            # _file() inlined: a new key per client and window is the common write
            start = expiry - expiry % GRAIN
            self.data[key] = [value, expiry, start]
            keys = self._slots.get(start)
            if keys is None:
                self._new_slot(start, key)
            else:
                keys.append(key)
            return
        entry[0] = value
        entry[1] = expiry
        if expiry < entry[2]:  # expires before its slot starts (rare): file it sooner
            entry[2] = self._file(key, expiry)

    def _file(self, key: str, expiry: float) -> float:
        """File `key` in the slot [start, start + GRAIN) holding `expiry`; its start."""
        start = expiry - expiry % GRAIN
        keys = self._slots.get(start)
        if keys is None:
            self._new_slot(start, key)
        else:
            keys.append(key)
        return start

    def _new_slot(self, start: float, key: str) -> None:
        self._slots[start] = [key]
        heappush(self._due, start)
        self.next_due = self._due[0] + GRAIN

    def sweep(self, now: float) -> None:
        """Drop the keys that have expired, so idle clients cost nothing."""
        due = self._due
        data = self.data
        while due and due[0] + GRAIN <= now:
            start = heappop(due)
            keys = self._slots.pop(start)
            self.examined += len(keys)
            for key in keys:
                entry = data.get(key)
                if entry is None or entry[2] != start:
                    continue  # deleted, or filed elsewhere since
                if now >= entry[1]:
                    del data[key]
                else:  # written again since: filed at its new expiry
                    entry[2] = self._file(key, entry[1])
        self.next_due = due[0] + GRAIN if due else math.inf

    def delete(self, key: str) -> None:
        """Forget `key` now (its slot skips it when due)."""
        self.data.pop(key, None)

    def filed(self) -> int:
        """Keys filed for expiry, stale ones included (what the slots hold)."""
        return sum(len(keys) for keys in self._slots.values())
