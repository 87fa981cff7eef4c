"""What the policies did: per-minute counts and top offenders, read for the admin,
the management command and the metrics.

The engine records them in the same call that decides a request (see `engine/lua/
batch.lua`); this module only reads, in a bounded number of pipelined round trips: one
for any number of policies' last hour, one for one policy's series, one for its
offenders. Nothing here scans the keyspace.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits.engine.interfaces import Engine
from ratelimits.pipeline import engines
from ratelimits.pipeline.engines import FALLBACK, LATENCY_US, LIMIT_SUM, SAMPLES

MINUTE = 60
HOUR = 3600
#: What the offenders' counts mean, for every place that shows them.
OFFENDERS_NOTE = (
    "Counts are guaranteed minimums: at least that many refusals. A client that entered "
    "a full list is counted from its entry, so its count is a lower bound."
)


@dataclass(frozen=True, slots=True)
class PolicyCounts:
    """Requests seen by one policy over some span.

    `admitted`: passed and charged. `rejected`: refused by this (enforced) policy.
    `would_reject`: a shadow policy would have refused. `spared`: this policy admitted
    but another refused the request, so nothing was charged. An adaptive policy's
    samples besides (`engines.SAMPLES` ...): how many, their latencies and the limits they
    left, summed over every process. `charged`: for a policy with `charge_on`, the
    responses charged after they were answered (those requests are among `admitted`:
    a figure beside the requests, not in `total`). `fallback`: requests its `on_error`
    decided because the store did not answer (counted by each process and sent once the
    store answers again; they are in no other figure).
    """

    admitted: int = 0
    rejected: int = 0
    would_reject: int = 0
    spared: int = 0
    samples: int = 0
    latency_us: int = 0
    limit_sum: int = 0
    charged: int = 0
    fallback: int = 0

    @classmethod
    def of(cls, raw: dict[str, int]) -> PolicyCounts:
        return cls(raw.get("a", 0), raw.get("r", 0), raw.get("w", 0), raw.get("o", 0),
                   raw.get(SAMPLES, 0), raw.get(LATENCY_US, 0), raw.get(LIMIT_SUM, 0),
                   raw.get("c", 0), raw.get(FALLBACK, 0))

    def __add__(self, other: PolicyCounts) -> PolicyCounts:
        return PolicyCounts(*(a + b for a, b in zip(_figures(self), _figures(other), strict=True)))

    @property
    def latency_ms(self) -> float | None:
        """The mean latency of the sampled requests (ms); None without samples."""
        return self.latency_us / self.samples / 1000 if self.samples else None

    @property
    def mean_limit(self) -> float | None:
        """The mean in-flight limit a process had learnt; None without samples."""
        return self.limit_sum / self.samples if self.samples else None

    @property
    def total(self) -> int:
        return self.admitted + self.rejected + self.would_reject + self.spared

    @property
    def refused(self) -> int:
        """Refusals, real or (shadow) would-be: what the policy stands against."""
        return self.rejected + self.would_reject

    @property
    def refused_share(self) -> float | None:
        """The share of requests refused or would-be refused; None with no traffic."""
        return self.refused / self.total if self.total else None


def _figures(counts: PolicyCounts) -> tuple[int, ...]:
    return tuple(getattr(counts, f.name) for f in dataclasses.fields(counts))


def current_minute(now: float | None = None) -> int:
    return int((time.time() if now is None else now) // MINUTE)


def series(
    names: Sequence[str], minutes: int, *, now: float | None = None, engine: Engine | None = None
) -> dict[str, list[PolicyCounts]]:
    """Per-minute counts of each policy over the last `minutes` minutes, oldest first,
    the current (partial) minute last. One pipelined round trip in all."""
    engine = engine or engines.get_engine()
    last = current_minute(now)
    span = range(last - minutes + 1, last + 1)
    raw = engine.counters_many([(name, m) for name in names for m in span])
    out: dict[str, list[PolicyCounts]] = {}
    for i, name in enumerate(names):
        out[name] = [PolicyCounts.of(r) for r in raw[i * minutes : (i + 1) * minutes]]
    return out


def last_hour(
    names: Sequence[str], *, now: float | None = None, engine: Engine | None = None
) -> dict[str, PolicyCounts]:
    """Each policy's totals over the last 60 minutes, in one round trip."""
    per_minute = series(names, 60, now=now, engine=engine)
    return {name: sum(counts, PolicyCounts()) for name, counts in per_minute.items()}


def offenders(
    name: str, n: int = 10, *, now: float | None = None, engine: Engine | None = None
) -> list[tuple[str, int]]:
    """The clients this policy refused (or would have) most in the current and previous
    clock hour, merged, most first. One round trip.

    Each count is guaranteed: the client was refused at least that many times. A client
    that entered a full list (it keeps the busiest `OFFENDERS_CAP` per hour) is counted
    from then on, so its count is a lower bound; rotating identities cannot push one
    above what it earned. See `OFFENDERS_NOTE`."""
    engine = engine or engines.get_engine()
    hour = int((time.time() if now is None else now) // HOUR)
    merged: dict[str, int] = {}
    for listing in engine.offenders_many([(name, hour - 1), (name, hour)], n):
        for who, count in listing:
            merged[who] = merged.get(who, 0) + count
    return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def buckets(counts: Sequence[PolicyCounts], size: int) -> list[PolicyCounts]:
    """Sum consecutive runs of `size` entries (e.g. 1,440 minutes into 10-minute bars)."""
    return [sum(counts[i : i + size], PolicyCounts()) for i in range(0, len(counts), size)]


def names_of(policies: Iterable[Any]) -> list[str]:
    return [p.name for p in policies]
