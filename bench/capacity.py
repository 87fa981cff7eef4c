"""Section 2: server-side capacity, 50 concurrent clients (redis-benchmark).

    .venv/bin/python bench/capacity.py [--quick]

redis-benchmark sends `FCALL <name> <numkeys> <keys> <args>` of our real batch function
(or `EVALSHA <sha> ...` of the same script), exactly as RedisEngine does (server time:
the call sends no time of its own), and of bench/gcra_min.lua, the least a GCRA decision
can cost. `-r 100000` spreads the clients over 100,000 keys.
Each run is checked afterwards: the server's own count of calls must equal the number of
requests sent with none failed, so an error reply can never pass for a decision.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

CLIENTS = 50
KEYSPACE = 100_000
PERIOD_US = 60_000_000
LIMIT = 1_000  # per minute per client: random clients stay far below it, every call admits


def _ours_args(call: list[str], algorithms: list[str], version: bool) -> list[str]:
    """`call` (FCALL <name> or EVALSHA <sha>) with the arguments RedisEngine sends
    (`contract.encode`), redis-benchmark's random client in each key's hash tag; no time
    of its own (server time). The counters are tallied in process, so no call here
    carries any (a busy process carries them about twice a second)."""
    from ratelimits.engine import Limit
    from ratelimits.engine.contract import encode
    from ratelimits.engine.registry import REGISTRY

    limits = [Limit("203.0.113.7", a, LIMIT, PERIOD_US / 1_000_000, name=f"p{i}")
              for i, a in enumerate(algorithms)]
    _, args, _ = encode(limits, prefix="rl:", version_key="rl:version" if version else None,
                        stats=True)
    keys = [f"rl:{{__rand_int__}}:{REGISTRY[a].code}" for a in algorithms]
    if version:  # declared after the limits' keys, as every key a script touches
        keys.append("rl:version")
    argv = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
    return [*call, str(len(keys)), *keys, *argv]


def _benchmark(client, command: list[str], requests: int) -> tuple[float, float]:
    """(requests per second, the server's own microseconds per call); RuntimeError
    unless the server ran every request sent and none failed."""
    client.config_resetstat()
    port = client.connection_pool.connection_kwargs["port"]
    out = subprocess.run(
        ["redis-benchmark", "-h", common.REDIS_HOST, "-p", str(port),
         "-c", str(CLIENTS), "-n", str(requests),
         "-r", str(KEYSPACE), "--csv", *command],
        capture_output=True, text=True, check=True,
    )
    rows = list(csv.reader(io.StringIO(out.stdout)))
    stats = client.info("commandstats")[f"cmdstat_{command[0].lower()}"]
    failed = int(stats.get("failed_calls", 0)) + int(stats.get("rejected_calls", 0))
    if int(stats["calls"]) != requests or failed:
        raise RuntimeError(f"capacity audit failed: {command[0]} {command[1]}: "
                           f"{stats['calls']} calls, {failed} failed, {requests} sent")
    return float(rows[-1][1]), float(stats["usec_per_call"])


APP = "ours, 1 limit (gcra), FCALL, version read (as the app runs it)"
MINIMAL = "minimal GCRA script (bench/gcra_min.lua)"


def run(quick: bool = False) -> Section:
    section = Section("2. Server-side capacity (50 concurrent clients, redis-benchmark)")
    if shutil.which("redis-benchmark") is None:
        section.add("redis-benchmark is not installed: section skipped.")
        return section
    rounds, requests = (1, 20_000) if quick else (3, 150_000)
    from tests.redis_server import RedisProcess

    server = RedisProcess().start()
    try:
        return _measure(section, server, rounds, requests)
    finally:
        server.stop()


def _measure(section: Section, server: Any, rounds: int, requests: int) -> Section:
    import redis

    from ratelimits.engine.scripts import batch_library, batch_source

    client = redis.Redis(host=common.REDIS_HOST, port=server.port)
    function, library = batch_library()
    client.function_load(library, replace=True)
    fcall = ["FCALL", function]
    evalsha = ["EVALSHA", client.script_load(batch_source())]
    minimal = client.script_load((Path(__file__).parent / "gcra_min.lua").read_text())
    trivial = client.script_load("return 1")

    cases = {
        "EVALSHA `return 1` (no work: the server's floor)":
            (False, ["EVALSHA", trivial, "1", "k:{__rand_int__}", "1"]),
        MINIMAL:
            (False, ["EVALSHA", minimal, "1", "g:{__rand_int__}", str(LIMIT), str(PERIOD_US),
                     str(LIMIT), "1"]),
        APP: (True, _ours_args(fcall, ["gcra"], True)),
        "ours, 1 limit (gcra), EVALSHA of the same script (a server without Functions)":
            (True, _ours_args(evalsha, ["gcra"], True)),
        "ours, 1 limit (gcra), FCALL, no version":
            (True, _ours_args(fcall, ["gcra"], False)),
        "ours, 3 limits (gcra, sliding_window, fixed_window), FCALL, version read":
            (True, _ours_args(fcall, ["gcra", "sliding_window", "fixed_window"], True)),
    }
    # One decision through redis-py first: the exact arguments must give a real reply.
    for _, (ours, command) in cases.items():
        argv = [a.replace("__rand_int__", "000000000001") for a in command]
        reply = client.execute_command(*argv)
        if ours and (not isinstance(reply, list) or reply[1] != 1):
            raise RuntimeError(f"batch script refused or failed: {reply!r}")
    client.flushdb()

    results: dict[str, list[float]] = {name: [] for name in cases}
    usecs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (_ours, command) in cases.items():
            rate, usec = _benchmark(client, command, requests)
            results[name].append(rate)
            usecs[name].append(usec)
    med = {name: median(v) for name, v in results.items()}
    usec = {name: median(v) for name, v in usecs.items()}
    base = med[MINIMAL]
    rows = [[name, fmt_rate(med[name]), spread(results[name]), f"{med[name] / base:.2f}×",
             f"{usec[name]:.1f}", f"{usec[name] / usec[MINIMAL]:.2f}×"] for name in cases]
    section.add(
        f"`redis-benchmark -c {CLIENTS} -n {requests:,} -r {KEYSPACE:,} --csv FCALL <name> "
        "<numkeys> <keys> <args>` (or `EVALSHA <sha> ...`) against a redis-server of the "
        "section's own; median "
        f"of {rounds} interleaved runs per row. Our rows send the real batch function (the "
        "library `RedisEngine` loads) or the same script by EVALSHA, with the arguments "
        "`RedisEngine` sends, built by the same `contract.encode` (no time of the call's "
        f"own: the server's `TIME`); {LIMIT:,} per minute per client, so every decision "
        "admits and writes. "
        "The per-minute counters are tallied in each process and carried by one call about "
        "twice a second (one HINCRBY per policy and outcome), so no call here carries any. "
        "Client: redis-benchmark. Both redis-server and redis-benchmark are single-threaded, "
        "one core each of the two. After each run the server's own count of calls must "
        "equal the requests sent, none failed."
    )
    section.add(table(["call", "decisions/s", "±", "vs minimal GCRA",
                       "server µs per call (INFO commandstats)", "µs vs minimal GCRA"], rows))
    section.checks += [
        Check("server µs per decision, ours as the app runs it vs minimal GCRA script",
              usec[APP] / usec[MINIMAL], "≤ 1.2×", usec[APP] / usec[MINIMAL] <= 1.2),
        Check("decisions/s, ours as the app runs it vs minimal GCRA script", med[APP] / base,
              "reference", True),
    ]
    return section


if __name__ == "__main__":
    common.run_section(run)
