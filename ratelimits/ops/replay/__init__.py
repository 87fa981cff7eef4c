"""Replay an access log against policies: what would they have refused, and whom?

Each request of the log is decided as the middleware would decide it, at the log's own
time, on a fresh in-process engine (`replayer`); `formats` reads the log and `report`
holds what was found. `manage.py ratelimits replay` loads and compiles the policies and
prints the `Report`.

A large log file is split by client across processes (`replay_file(jobs=...)`): clients
are decided independently, each process reads every line (so the clock and the figures
about lines are the whole log's) and decides its share of the clients; the tallies add
up to the report one process would give. A small log, standard input, or policies that
tie clients together (a `global` or `query:` key, or keys of different kinds) are
replayed in one process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ratelimits.ops.replay.formats import FORMATS, JSON_KEYS, LogError, open_log
from ratelimits.ops.replay.replayer import Replayer, split_kind, unreplayable
from ratelimits.ops.replay.report import PolicyReport, Report, ShardTally, build_report
from ratelimits.pipeline.compiled import CompiledPolicy

__all__ = [
    "FORMATS",
    "JSON_KEYS",
    "LogError",
    "PolicyReport",
    "Replayer",
    "Report",
    "jobs_for",
    "replay_file",
    "replay_lines",
    "unreplayable",
]

#: Smaller files are replayed in one process: below this, starting and merging a second
#: process costs about what it saves.
SPLIT_MIN_BYTES = 4 << 20
#: Every process reads the whole log, so past a few the reading dominates.
MAX_JOBS = 4


def replay_lines(
    lines: Iterable[str],
    policies: Sequence[CompiledPolicy],
    *,
    ipv6_prefix: int = 64,
    source: str = "<log>",
    top: int = 10,
    **options: Any,
) -> Report:
    """Replay text lines in this process; `options`: `fmt`, `skip_bad`, `progress`."""
    started = time.perf_counter()
    replayer = Replayer(policies, ipv6_prefix=ipv6_prefix)
    tally = replayer.run(lines, source=source, **options)
    return build_report(
        [tally],
        replayer.names,
        source=source,
        top=top,
        skipped=replayer.skipped,
        seconds=time.perf_counter() - started,
    )


def idle_cpus() -> int:
    """The CPUs this process may use, less those busy right now (at least 1): a split
    only pays when its processes get a CPU each; on a busy machine they would take turns,
    and every process reads the whole log."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, cpus - _busy_cpus()))


def _busy_cpus() -> int:
    """Other tasks running at this instant (Linux: /proc/loadavg's running count, less
    this process); elsewhere the last minute's load average. The instant matters: the
    minute's average still counts a replay that just finished."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        return max(0, running - 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return round(os.getloadavg()[0])
    except (AttributeError, OSError):  # no load average here
        return 0


def jobs_for(path: str, policies: Sequence[CompiledPolicy], jobs: int | None = None) -> int:
    """How many processes replay `path`: 1 for stdin, a small file, policies that cannot
    be split by client, or where processes cannot be forked; else `jobs` (default: the
    idle CPUs, at most `MAX_JOBS`)."""
    if jobs is not None and jobs < 1:
        raise ValueError("jobs must be 1 or more")
    wanted = min(idle_cpus(), MAX_JOBS) if jobs is None else jobs
    if wanted == 1 or path == "-" or split_kind(policies) is None:
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1  # a spawned process would set Django up again: more than it saves
    if jobs is None and os.path.getsize(path) < SPLIT_MIN_BYTES:
        return 1
    return wanted


def _replay_shard(
    path: str,
    policies: Sequence[CompiledPolicy],
    shard: tuple[int, int] | None,
    ipv6_prefix: int,
    progress: Callable[[int, int | None], None] | None,
    options: dict[str, Any],
) -> ShardTally:
    with open_log(path) as (text, position, size):
        tick = None if progress is None else (lambda: progress(position(), size))
        replayer = Replayer(policies, ipv6_prefix=ipv6_prefix, shard=shard)
        return replayer.run(text, source=path, progress=tick, **options)


def _child(conn: Any, *args: Any) -> None:
    try:
        conn.send((True, _replay_shard(*args)))
    except BaseException as exc:  # handed to the parent, which raises it
        conn.send((False, exc))
    finally:
        conn.close()


def replay_file(
    path: str,
    policies: Sequence[CompiledPolicy],
    *,
    ipv6_prefix: int = 64,
    top: int = 10,
    progress: Callable[[int, int | None], None] | None = None,
    jobs: int | None = None,
    **options: Any,
) -> Report:
    """Replay a log file (plain or gzip; "-" for stdin); `progress(bytes_read, size)`;
    `jobs` as `jobs_for()`; `options`: `fmt`, `skip_bad`."""
    started = time.perf_counter()
    n = jobs_for(path, policies, jobs)
    if n == 1:
        tallies = [_replay_shard(path, policies, None, ipv6_prefix, progress, options)]
    else:
        tallies = _replay_split(path, policies, n, ipv6_prefix, progress, options)
    probe = Replayer(policies)  # the replayed policies' names and the skipped ones
    return build_report(
        tallies,
        probe.names,
        source=path,
        top=top,
        skipped=probe.skipped,
        seconds=time.perf_counter() - started,
    )


def _replay_split(
    path: str,
    policies: Sequence[CompiledPolicy],
    n: int,
    ipv6_prefix: int,
    progress: Callable[[int, int | None], None] | None,
    options: dict[str, Any],
) -> list[ShardTally]:
    """Processes 1..n-1 are forked children; this process replays share 0 (and reports
    progress) meanwhile."""
    ctx = multiprocessing.get_context("fork")
    children = []
    try:
        for k in range(1, n):
            here, there = ctx.Pipe(duplex=False)
            child = ctx.Process(
                target=_child,
                args=(there, path, policies, (k, n), ipv6_prefix, None, options),
                daemon=True,
            )
            child.start()
            there.close()
            children.append((child, here))
        tallies = [_replay_shard(path, policies, (0, n), ipv6_prefix, progress, options)]
        for child, conn in children:
            try:
                ok, value = conn.recv()
            except EOFError:
                raise RuntimeError(
                    f"a replay process ended without a result (exit code {child.exitcode})"
                ) from None
            if not ok:
                raise value
            tallies.append(value)
        return tallies
    finally:
        for child, conn in children:
            conn.close()
            if child.is_alive():
                child.kill()
            child.join()
