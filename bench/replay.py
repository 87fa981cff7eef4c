"""Section: access-log replay throughput (`manage.py ratelimits replay`).

    .venv/bin/python bench/replay.py [--quick]
    .venv/bin/python bench/replay.py --write-log access.log   (only write the log)

A synthetic Combined Log Format file (300,000 lines, 1,000 client IPs of which a few
send most of the traffic, a handful of paths, one hour of timestamps; the same file on
every run: fixed seed) is written to a temporary directory, then measured three ways:

1. End to end, as a user times it: `python manage.py ratelimits replay access.log`, the
   demo project's settings and a throwaway SQLite database holding one policy that
   matches every line (sliding_window 300/min per IP); wall time of the whole process,
   start-up, Django set-up and imports included. The default (the log split by client
   across the idle CPUs), `--jobs 2` and `--jobs 1` run in interleaved rounds.
2. In process: `replay_file` against three policies that match every line
   (sliding_window, gcra in shadow, fixed_window: each line is three limits decided in
   one engine call), reading and parsing included; one process (the policies' keys are
   of different kinds, so the log is not split).
3. What a split costs a small log: `replay_file` of 20,000 lines, one process or two.

Figures are medians of several runs.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

LINES = 300_000
CLIENTS = 1_000
TARGET = 100_000  # lines per second, in process, three policies
COMMAND_TARGET = 200_000  # lines per second, end to end, one policy
SMALL = 20_000  # lines of the small log
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
    """`lines` combined-log lines over one hour, clients drawn with a heavy head; the same
    file for the same arguments."""
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
    from ratelimits.matching.keykinds import parse_key
    from ratelimits.matching.paths import PathPattern
    from ratelimits.pipeline.compiled import CompiledPolicy

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


def _demo_env(tmp: str) -> dict[str, str]:
    skip = ("REDIS_URL", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env["DEMO_DB"] = str(Path(tmp) / "demo.sqlite3")
    return env


def _prepare_demo(env: dict[str, str]) -> None:
    """A throwaway demo database with one policy that matches every line."""
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=common.ROOT,
                   env=env, check=True)
    code = (
        "from ratelimits.models import Policy\n"
        "Policy.objects.create(name='site-per-ip', mode='enforce', "
        "algorithm='sliding_window', limit=300, period=60, key='ip', path='*')\n"
    )
    subprocess.run([python, "manage.py", "shell", "-c", code], cwd=common.ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)


def command_seconds(log: Path, env: dict[str, str], *extra: str) -> float:
    """Wall time of `python manage.py ratelimits replay <log>`, process start included."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "manage.py", "ratelimits", "replay", str(log), *extra],
        cwd=common.ROOT, env=env, check=True, capture_output=True, text=True,
    )
    seconds = time.perf_counter() - start
    assert "site-per-ip" in out.stdout, out.stdout
    return seconds


def run(quick: bool = False) -> Section:
    from ratelimits.ops.replay import SPLIT_MIN_BYTES, replay_file

    lines, runs = (50_000, 3) if quick else (LINES, 5)
    default = "ratelimits replay access.log"
    split, single = f"{default} --jobs 2", f"{default} --jobs 1"
    command: dict[str, list[float]] = {default: [], split: [], single: []}
    rates: list[float] = []
    small: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "access.log"
        write_log(log, lines)
        env = _demo_env(tmp)
        _prepare_demo(env)
        for _ in range(runs):  # interleaved: a busy neighbour slows every row alike
            command[default].append(lines / command_seconds(log, env))
            command[split].append(lines / command_seconds(log, env, "--jobs", "2"))
            command[single].append(lines / command_seconds(log, env, "--jobs", "1"))
        compiled = policies()
        for _ in range(runs):
            start = time.perf_counter()
            report = replay_file(str(log), compiled)
            rates.append(lines / (time.perf_counter() - start))
        short = Path(tmp) / "short.log"
        write_log(short, SMALL)
        per_ip = [compiled[0]]  # one per-IP policy: the log may be split
        for _ in range(runs):
            for jobs in small:
                start = time.perf_counter()
                replay_file(str(short), per_ip, jobs=jobs)
                small[jobs].append(time.perf_counter() - start)
    assert report.lines == lines and report.requests == lines, report
    rate = median(rates)
    end_to_end = median(command[default])
    section = Section("6. Access-log replay (`manage.py ratelimits replay`)")
    section.add(
        f"End to end, as a user times it: `time python manage.py ...` on a synthetic "
        f"combined log of {lines:,} lines ({CLIENTS:,} client IPs, Zipf-like, six paths, "
        "one hour; fixed seed), one policy matching every line (`sliding_window` 300/min "
        "per IP), the demo project's settings; wall time of the whole process, start-up "
        f"and Django set-up included; median of {runs} interleaved runs, ± half the "
        "min–max spread. By default the log is split by client across the idle CPUs "
        f"(here {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end).\n\n"
        + table(
            ["command", "lines/s", "±"],
            [[f"`{name}`", fmt_rate(median(r)), spread(r)] for name, r in command.items()],
            align="lrr",
        )
        + f"\n\n`--jobs 2` against `--jobs 1`: "
        f"{median(command[split]) / median(command[single]):.2f}×."
    )
    section.add(
        f"In process: the same log replayed with `replay_file` against three policies that "
        "match every line: `sliding_window` 300/min per IP (enforce), `gcra` 5/s burst 10 "
        "per IP (shadow), `fixed_window` 2,000/hour per user or IP (enforce). Reading, "
        f"parsing and deciding included; one process (the keys are of different kinds, so "
        f"the log is not split); median of {runs} runs."
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
    one_ms, two_ms = (1000 * median(small[j]) for j in (1, 2))
    section.add(
        f"What a split costs a small log ({SMALL:,} lines, one per-IP policy; unless asked, "
        f"a file under {SPLIT_MIN_BYTES >> 20} MB is replayed in one process): one process "
        f"{one_ms:.0f} ms, split across two {two_ms:.0f} ms ({two_ms / one_ms:.2f}×)."
    )
    section.checks.append(
        Check(
            "replay end to end, 1 policy, process start included",
            round(end_to_end),
            "≥ 200,000 lines/s",
            end_to_end >= COMMAND_TARGET,
            unit=" lines/s",
        )
    )
    section.checks.append(
        Check(
            "replay in process, 3 matching policies per line",
            round(rate),
            "≥ 100,000 lines/s",
            rate >= TARGET,
            unit=" lines/s",
        )
    )
    return section


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-log"] and len(sys.argv) == 3:
        # The example log of docs/operations/replay.md: `bench/replay.py --write-log access.log`.
        write_log(Path(sys.argv[2]), LINES)
    else:
        common.run_section(run)
