"""Shared pieces of the benchmarks: their Redis, timing, medians, Markdown tables, the machine.

Every section measures in rounds: one round runs each case once, and the figure reported
is the median over the rounds. Cases of one table are interleaved that way, so a noisy
neighbour on a shared machine slows every row of a round, and the ratios between rows
(what the targets are about) hold even when the absolute figures drift.

Redis: the benches never touch a Redis they did not start. The first section that needs
one starts a private `redis-server` (the machine's binary, a free loopback port, no
persistence) and every section of the run uses it; it is stopped when the run ends. On
it, database 15 holds our engine and raw scripts, database 14 the Django caches
(django-redis) and the `limits` storage; both are flushed freely, since the server holds
nothing else. `REDIS_PORT`, `OURS_URL` and `PEERS_URL` start it when first read.

The peers' adapters (DRF, django-ratelimit, ...) live in `bench/peers.py`.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_HOST = "127.0.0.1"
OURS_DB = 15
PEERS_DB = 14

_server: Any = None  # the private redis-server of this run (tests/redis_server.py)


#: Set by the process that started the server, for the processes a section spawns.
PORT_VARIABLE = "RATELIMITS_BENCH_REDIS_PORT"


class _Started:
    """The server a parent process started (a spawned worker only connects to it)."""

    def __init__(self, port: int) -> None:
        self.port = port


def redis_server() -> Any:
    """The run's private redis-server, started on first use and stopped at exit."""
    global _server
    if _server is None:
        inherited = os.environ.get(PORT_VARIABLE)
        if inherited:
            _server = _Started(int(inherited))
        else:
            from tests.redis_server import RedisProcess

            _server = RedisProcess().start()
            atexit.register(_server.stop)
            os.environ[PORT_VARIABLE] = str(_server.port)
    return _server


def __getattr__(name: str) -> Any:
    # The port and URLs exist once the private server runs: start it when first read.
    if name == "REDIS_PORT":
        return redis_server().port
    if name == "OURS_URL":
        return f"redis://{REDIS_HOST}:{redis_server().port}/{OURS_DB}"
    if name == "PEERS_URL":
        return f"redis://{REDIS_HOST}:{redis_server().port}/{PEERS_DB}"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PEER_PACKAGES = (
    "django-ratelimits",
    "redis",
    "hiredis",
    "Django",
    "django-redis",
    "djangorestframework",
    "limits",
    "django-ratelimit",
    "django-smart-ratelimit",
    "django-trafficwatch",
    "gunicorn",
)


def redis_client(db: int) -> Any:
    """A client of the run's private server (never the machine's own Redis)."""
    import redis

    return redis.Redis(host=REDIS_HOST, port=redis_server().port, db=db)


def flush(*dbs: int) -> None:
    """Empty databases of the private server; only the two the benches use."""
    for db in dbs:
        if db not in (OURS_DB, PEERS_DB):
            raise ValueError(f"refusing to flush Redis database {db}")
        redis_client(db).flushdb()


# -- results ---------------------------------------------------------------------------


@dataclass
class Check:
    """A ratio (or count) against its target."""

    what: str
    value: float
    target: str
    met: bool
    unit: str = "×"

    def row(self) -> list[str]:
        shown = f"{self.value:.2f}{self.unit}" if self.unit == "×" else f"{self.value:g}{self.unit}"
        if self.target == "reference":
            return [self.what, shown, "—", "(for reference)"]
        return [self.what, shown, self.target, "met" if self.met else "**not met**"]


@dataclass
class Section:
    title: str
    parts: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, text: str) -> None:
        self.parts.append(text.strip("\n"))

    def markdown(self) -> str:
        body = [f"## {self.title}", *self.parts]
        if self.checks:
            body.append(table(["ratio", "measured", "target", ""], [c.row() for c in self.checks]))
        body.append(f"_Section wall time: {self.seconds:.0f} s._")
        return "\n\n".join(body) + "\n"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; `align` is one letter per column (l/r), numbers right by default."""
    if align is None:
        align = "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def run_section(fn: Callable[..., Section], argv: Sequence[str] | None = None) -> Section:
    """Entry point of a section run alone: `--quick` and print its Markdown."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="few, short repetitions")
    opts = parser.parse_args(argv)
    section = timed(fn, quick=opts.quick)
    print(section.markdown())
    return section


def timed(fn: Callable[..., Section], **kwargs: Any) -> Section:
    start = time.perf_counter()
    section = fn(**kwargs)
    section.seconds = time.perf_counter() - start
    return section


# -- timing ----------------------------------------------------------------------------


def calls_per_second(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def interleaved(
    cases: dict[str, Callable[[], Any]], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Calls per second of every case, `rounds` times, cases interleaved in each round.

    The number of calls per case is calibrated once (a short warm-up run) so that one
    measurement lasts about `seconds`; every round then makes the same number of calls.
    """
    sizes: dict[str, int] = {}
    for name, fn in cases.items():
        warm = calls_per_second(fn, 50)
        sizes[name] = max(50, int(warm * seconds))
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            out[name].append(calls_per_second(fn, sizes[name]))
    return out


def paired(
    a: Callable[[], Any], b: Callable[[], Any], rounds: int, seconds: float
) -> list[float]:
    """How many times faster `b` runs than `a`, once per round: each round times `a`, then
    `b`, for about `seconds` each (sizes calibrated once, as `interleaved` does).

    For two cases within a few per cent of each other, the median of these ratios is
    the steadier figure: the two timings of a round share the machine's state of that
    moment, where the medians of two cases' rounds spread over the whole run do not.
    """
    sizes = [max(50, int(calls_per_second(fn, 50) * seconds)) for fn in (a, b)]
    ratios = []
    for _ in range(rounds):
        rate_a = calls_per_second(a, sizes[0])
        ratios.append(calls_per_second(b, sizes[1]) / rate_a)
    return ratios


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> str:
    """min–max of the repetitions, as a percentage of the median."""
    m = median(values)
    if not m:
        return "—"
    return f"±{100 * (max(values) - min(values)) / 2 / m:.0f}%"


# -- the machine -----------------------------------------------------------------------


def wrk() -> str:
    """The wrk binary (Debian's package; `make bench` installs it when missing)."""
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk (make bench does it)")
    return found


def machine() -> list[tuple[str, str]]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rows = [
        ("CPU", f"{model}, {os.cpu_count()} cores ({platform.machine()})"),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
    ]
    try:
        info = redis_client(OURS_DB).info("server")
        rows.append(
            ("Redis server", f"{info['redis_version']} (a private redis-server, TCP loopback)")
        )
    except Exception as exc:  # pragma: no cover - reported, not fatal
        rows.append(("Redis server", f"unreachable: {exc}"))
    try:
        out = subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True)
        rows.append(("redis-benchmark", out.stdout.strip() or "?"))
    except OSError:
        rows.append(("redis-benchmark", "not installed"))
    try:
        out = subprocess.run([wrk(), "--version"], capture_output=True, text=True)
        rows.append(("wrk", (out.stdout or out.stderr).split(" Copyright")[0].strip()))
    except (OSError, RuntimeError):
        rows.append(("wrk", "not installed"))
    for package in PEER_PACKAGES:
        try:
            rows.append((package, importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            rows.append((package, "not installed"))
    return rows
