"""What a replay found: per-policy figures, and how partial tallies become one report.

A replay counts into a `ShardTally` (plain data, picklable); when the log is split by client
across processes, each process returns its tally and `build_report()` adds them up. One
process is the same path with one tally, so both give the same report, field for field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PolicyReport:
    """What one policy would have done to the log's requests."""

    name: str
    mode: str
    matched: int  # requests the policy applied to (with an identity)
    refused: int  # requests this policy alone refused (or, in shadow, would have)
    peak_second: int  # most matched requests in one second
    peak_minute: int  # most matched requests in any 60 consecutive seconds
    offenders: tuple[tuple[str, int], ...]  # the most refused identities, most first
    unidentified: int = 0  # matching requests with no identity (anonymous, no IP)

    @property
    def refused_share(self) -> float | None:
        return self.refused / self.matched if self.matched else None


@dataclass(frozen=True)
class Report:
    """The outcome of one replay."""

    source: str
    format: str
    lines: int  # every line read, blank ones included
    policies: tuple[PolicyReport, ...]
    requests: int = 0  # lines replayed as requests
    skipped_policies: tuple[tuple[str, str], ...] = ()  # (name, why it was not replayed)
    bad_lines: int = 0
    bad_examples: tuple[int, ...] = ()  # line numbers of the first malformed lines
    no_request: int = 0  # lines without a request a Django view would see ("-", TLS probes)
    out_of_order: int = 0  # lines older than an earlier line: replayed at the later time
    first: float | None = None  # epoch seconds of the first and last request
    last: float | None = None
    seconds: float = 0.0  # wall time of the replay


@dataclass
class SlotTally:
    """One policy's counts in one process."""

    per_sec: dict[int, int] = field(default_factory=dict)  # matched requests per second
    refused: int = 0
    offenders: dict[str, int] = field(default_factory=dict)
    unidentified: int = 0


@dataclass
class ShardTally:
    """One process's counts. The figures about lines are the same in every process of a
    split replay (each reads every line); the policies' counts are its clients' share."""

    format: str
    lines: int
    slots: list[SlotTally]
    requests: int = 0
    bad_lines: int = 0
    bad_examples: tuple[int, ...] = ()
    no_request: int = 0
    out_of_order: int = 0
    first: float | None = None
    last: float | None = None


def peak(per_sec: dict[int, int], window: int) -> int:
    """The most requests in any `window` consecutive seconds."""
    seconds = sorted(per_sec)
    best = total = lo = 0
    for sec in seconds:
        total += per_sec[sec]
        while seconds[lo] <= sec - window:
            total -= per_sec[seconds[lo]]
            lo += 1
        best = max(best, total)
    return best


def _merged(parts: Sequence[SlotTally]) -> SlotTally:
    if len(parts) == 1:
        return parts[0]
    out = SlotTally()
    for part in parts:
        for sec, n in part.per_sec.items():
            out.per_sec[sec] = out.per_sec.get(sec, 0) + n
        for who, n in part.offenders.items():
            out.offenders[who] = out.offenders.get(who, 0) + n
        out.refused += part.refused
        out.unidentified += part.unidentified
    return out


def build_report(
    tallies: Sequence[ShardTally],
    policies: Sequence[tuple[str, str]],
    *,
    source: str,
    top: int,
    skipped: Sequence[tuple[str, str]] = (),
    seconds: float = 0.0,
) -> Report:
    """One report from the tallies of every process; `policies`: (name, mode) in order."""
    head = tallies[0]
    reports = []
    for i, (name, mode) in enumerate(policies):
        slot = _merged([t.slots[i] for t in tallies])
        offenders = sorted(slot.offenders.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        reports.append(
            PolicyReport(
                name=name,
                mode=mode,
                matched=sum(slot.per_sec.values()),
                refused=slot.refused,
                peak_second=max(slot.per_sec.values(), default=0),
                peak_minute=peak(slot.per_sec, 60),
                offenders=tuple(offenders),
                unidentified=slot.unidentified,
            )
        )
    return Report(
        source=source,
        format=head.format,
        lines=head.lines,
        policies=tuple(reports),
        requests=head.requests,
        skipped_policies=tuple(skipped),
        bad_lines=head.bad_lines,
        bad_examples=head.bad_examples,
        no_request=head.no_request,
        out_of_order=head.out_of_order,
        first=head.first,
        last=head.last,
        seconds=seconds,
    )
