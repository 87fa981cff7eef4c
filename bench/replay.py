"""Section: access-log replay throughput (`manage.py ratelimits replay`), one process.

    .venv/bin/python bench/replay.py [--quick]

A synthetic Combined Log Format file (300,000 lines, 1,000 client IPs of which a few
send most of the traffic, a handful of paths, one hour of timestamps) is written to a
temporary directory, then replayed with `ratelimits.ops.replay.replay_file` against three
policies that match every line (sliding_window, gcra in shadow, fixed_window), so each
line is three limits decided in one engine call. The figure is lines per second over the
whole run, reading and parsing the file included; the median of several runs.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

LINES = 300_000
CLIENTS = 1_000
TARGET = 100_000  # lines per second
START = 1_700_000_000  # 2023-11-14 22:13:20 UTC
PATHS = (
    ("GET", "/"),
    ("GET", "/api/items/?page={n}"),
    ("GET", "/api/items/{n}/"),
    ("POST", "/login/"),
    ("GET", "/static/app.css"),
    ("GET", "/search/?q=term{n}"),
)
AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0"


def write_log(path: Path, lines: int, seed: int = 1) -> None:
    """`lines` combined-log lines over one hour, clients drawn with a heavy head."""
    rng = random.Random(seed)
    ips = [f"198.51.{i >> 8}.{i & 255}" for i in range(CLIENTS)]
    weights = [1 / (rank + 1) for rank in range(CLIENTS)]  # Zipf-like: a few heavy hitters
    clients = rng.choices(ips, weights, k=lines)
    users = ("-", "-", "-", "alice", "bob")
    out = []
    for i, ip in enumerate(clients):
        t = time.gmtime(START + i * 3600 // lines)
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", t)
        method, target = rng.choice(PATHS)
        target = target.format(n=rng.randrange(50))
        user = rng.choice(users)
        out.append(
            f'{ip} - {user} [{stamp}] "{method} {target} HTTP/1.1" 200 {rng.randrange(9999)} '
            f'"https://example.com/" "{AGENT}"\n'
        )
    path.write_text("".join(out))


def policies():
    """Three compiled policies on every path, without Django or a database."""
    from ratelimits.engine import Limit
    from ratelimits.pipeline.identity import parse_key
    from ratelimits.pipeline.paths import PathPattern
    from ratelimits.pipeline.resolver import CompiledPolicy

    def compiled(i, name, mode, key, algorithm, limit, period, burst=None):
        return CompiledPolicy(
            id=i,
            name=name,
            mode=mode,
            key=key,
            key_spec=parse_key(key),
            pattern=PathPattern("*"),
            methods=frozenset(),
            scope="",
            on_error="allow",
            priority=0,
            template=Limit(
                "", algorithm, limit, float(period), burst=burst, shadow=mode == "shadow", name=name
            ),
        )

    return [
        compiled(1, "site-per-ip", "enforce", "ip", "sliding_window", 300, 60),
        compiled(2, "burst-per-ip", "shadow", "ip", "gcra", 5, 1, burst=10),
        compiled(3, "hourly-per-client", "enforce", "user_or_ip", "fixed_window", 2000, 3600),
    ]


def run(quick: bool = False) -> Section:
    from ratelimits.ops.replay import replay_file

    lines, runs = (50_000, 3) if quick else (LINES, 5)
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "access.log"
        write_log(log, lines)
        compiled = policies()
        for _ in range(runs):
            start = time.perf_counter()
            report = replay_file(str(log), compiled)
            rates.append(lines / (time.perf_counter() - start))
    assert report.lines == lines and report.requests == lines, report
    rate = median(rates)
    section = Section("6. Access-log replay (`manage.py ratelimits replay`)")
    section.add(
        f"A synthetic combined log of {lines:,} lines ({CLIENTS:,} client IPs, Zipf-like, "
        "six paths, one hour) replayed against three policies that match every line: "
        "`sliding_window` 300/min per IP (enforce), `gcra` 5/s burst 10 per IP (shadow), "
        "`fixed_window` 2,000/hour per user or IP (enforce). Reading, parsing and deciding "
        f"included; median of {runs} runs, ± half the min–max spread."
    )
    rows = [
        [
            p.name,
            p.mode,
            f"{p.matched:,}",
            f"{p.refused:,}",
            f"{p.peak_second:,}",
            f"{p.peak_minute:,}",
        ]
        for p in report.policies
    ]
    section.add(
        table(["lines/s", "±"], [[fmt_rate(rate), spread(rates)]], align="rr")
        + "\n\nWhat the last run found:\n\n"
        + table(
            ["policy", "mode", "matched", "refused", "peak/s", "peak/min"], rows, align="llrrrr"
        )
    )
    section.checks.append(
        Check(
            "replay, 3 matching policies per line",
            round(rate),
            "≥ 100,000 lines/s",
            rate >= TARGET,
            unit=" lines/s",
        )
    )
    return section


if __name__ == "__main__":
    common.run_section(run)
