"""Section 2: server-side capacity, 50 concurrent clients (redis-benchmark).

    .venv/bin/python bench/capacity.py [--quick]

redis-benchmark sends `EVALSHA <sha> <numkeys> <keys> <args>` of our real batch script,
exactly as RedisEngine does (server time: now_us is an empty argument, which
redis-benchmark passes through as a zero-length bulk string), and of bench/gcra_min.lua,
the least a GCRA decision can cost. `-r 100000` spreads the clients over 100,000 keys.
Each run is checked afterwards: the per-minute counters our script keeps must add up to
the number of requests sent, so an error reply can never pass for a decision.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

CLIENTS = 50
KEYSPACE = 100_000
PERIOD_US = 60_000_000
LIMIT = 1_000  # per minute per client: random clients stay far below it, every call admits


def _ours_args(sha: str, algorithms: list[str], stats: bool, tag: str) -> list[str]:
    """The arguments RedisEngine sends (`contract.encode`), with redis-benchmark's random
    client in each key's hash tag; now_us stays empty (server time)."""
    from ratelimits.engine import Limit
    from ratelimits.engine.contract import encode
    from ratelimits.engine.registry import REGISTRY

    limits = [Limit("203.0.113.7", a, LIMIT, PERIOD_US / 1_000_000, name=f"{tag}{i}")
              for i, a in enumerate(algorithms)]
    _, args, _ = encode(limits, prefix="rl:", version_key="rl:version" if stats else None,
                        stats=stats)
    keys = [f"rl:{{__rand_int__}}:{REGISTRY[a].code}" for a in algorithms]
    argv = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
    return ["EVALSHA", sha, str(len(keys)), *keys, *argv]


def _benchmark(client, command: list[str], requests: int) -> tuple[float, float]:
    """(requests per second, the server's own microseconds per EVALSHA)."""
    client.config_resetstat()
    out = subprocess.run(
        ["redis-benchmark", "-h", common.REDIS_HOST, "-p", str(common.REDIS_PORT),
         "--dbnum", str(common.OURS_DB), "-c", str(CLIENTS), "-n", str(requests),
         "-r", str(KEYSPACE), "--csv", *command],
        capture_output=True, text=True, check=True,
    )
    rows = list(csv.reader(io.StringIO(out.stdout)))
    usec = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    return float(rows[-1][1]), float(usec)


def _counted(client, tag: str) -> int:
    """Admitted decisions recorded by our script's per-minute counters of policy `tag`0."""
    total = 0
    for key in client.scan_iter(match=f"rl:s:{tag}0:*"):
        total += int(client.hget(key, "a") or 0)
    return total


def run(quick: bool = False) -> Section:
    from ratelimits.engine.redis_backend import batch_source

    section = Section("2. Server-side capacity (50 concurrent clients, redis-benchmark)")
    if shutil.which("redis-benchmark") is None:
        section.add("redis-benchmark is not installed: section skipped.")
        return section
    rounds, requests = (1, 20_000) if quick else (3, 150_000)
    common.flush(common.OURS_DB)
    client = common.redis_client(common.OURS_DB)
    ours = client.script_load(batch_source())
    minimal = client.script_load((Path(__file__).parent / "gcra_min.lua").read_text())
    trivial = client.script_load("return 1")

    cases = {
        "EVALSHA `return 1` (no work: the server's floor)":
            ("", ["EVALSHA", trivial, "1", "k:{__rand_int__}", "1"]),
        "minimal GCRA script (bench/gcra_min.lua)":
            ("", ["EVALSHA", minimal, "1", "g:{__rand_int__}", str(LIMIT), str(PERIOD_US),
                  str(LIMIT), "1"]),
        "ours, 1 limit (gcra), counters + version (as the app runs it)":
            ("c1", _ours_args(ours, ["gcra"], True, "c1-")),
        "ours, 1 limit (gcra), no counters, no version":
            ("", _ours_args(ours, ["gcra"], False, "c1b-")),
        "ours, 3 limits (gcra, sliding_window, fixed_window), counters + version":
            ("c3", _ours_args(ours, ["gcra", "sliding_window", "fixed_window"], True, "c3-")),
    }
    # One decision through redis-py first: the exact arguments must give a real reply.
    for _, (tag, command) in cases.items():
        argv = [a.replace("__rand_int__", "000000000001") for a in command[1:]]
        reply = client.evalsha(*argv)
        if tag and (not isinstance(reply, list) or reply[1] != 1):
            raise RuntimeError(f"batch script refused or failed: {reply!r}")
    common.flush(common.OURS_DB)
    client.script_load(batch_source())

    results: dict[str, list[float]] = {name: [] for name in cases}
    usecs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (_tag, command) in cases.items():
            rate, usec = _benchmark(client, command, requests)
            results[name].append(rate)
            usecs[name].append(usec)
    # Every request must have been decided and admitted by the script, not errored.
    audit = []
    for name, (tag, _command) in cases.items():
        if tag:
            counted = _counted(client, f"{tag}-")
            audit.append(f"{name}: {counted:,} admitted decisions counted for "
                         f"{rounds * requests:,} requests sent")
            if counted != rounds * requests:
                raise RuntimeError(f"capacity audit failed: {audit[-1]}")
    med = {name: median(v) for name, v in results.items()}
    base = med["minimal GCRA script (bench/gcra_min.lua)"]
    rows = [[name, fmt_rate(med[name]), spread(results[name]), f"{med[name] / base:.2f}×",
             f"{median(usecs[name]):.1f}"] for name in cases]
    section.add(
        f"`redis-benchmark -c {CLIENTS} -n {requests:,} -r {KEYSPACE:,} --csv EVALSHA <sha> "
        "<numkeys> <keys> <args>` against the local server; median of "
        f"{rounds} interleaved runs per row. Our rows send the real batch script with the "
        "arguments `RedisEngine` sends, built by the same `contract.encode` (now_us empty = "
        f"server `TIME`); {LIMIT:,} per minute per client, "
        "so every decision admits and writes. Client: redis-benchmark (it passes the empty "
        "now_us argument as a zero-length bulk string; no Python client was needed). Both "
        "redis-server and redis-benchmark are single-threaded, one core each of the two."
    )
    section.add(table(["script", "decisions/s", "±", "vs minimal GCRA",
                       "server µs per call (INFO commandstats)"], rows))
    section.add("Audit (the script's own per-minute counters): " + "; ".join(audit) + ".")
    ours1 = med["ours, 1 limit (gcra), counters + version (as the app runs it)"]
    ours1b = med["ours, 1 limit (gcra), no counters, no version"]
    section.checks += [
        Check("ours, 1 limit (as the app runs it) vs minimal GCRA script", ours1 / base,
              "≥ 0.85×", ours1 / base >= 0.85),
        Check("ours, 1 limit (no counters, no version) vs minimal GCRA script", ours1b / base,
              "≥ 0.85×", ours1b / base >= 0.85),
    ]
    common.flush(common.OURS_DB)
    return section


if __name__ == "__main__":
    common.run_section(run)
