"""What one decision costs Redis, counted in instructions: repeatable whatever the
neighbours do, so a change to the Lua scripts is judged by a figure that does not drift.

    .venv/bin/python bench/server_cost.py [--calls 1000]

Starts the machine's `redis-server` under `valgrind --tool=callgrind` (Debian's valgrind
package) on a free loopback port, and counts the server's instructions per call over
`--calls` calls of each row, with the engine the Django app builds (policy version key,
per-minute counters) and the server's clock. The floors are measured by the same server
in the same run: `SET NX` with a TTL (django-ratelimit's whole first request in a
window) and an FCALL of an empty function with the arguments of our one-limit call
(what Redis spends to receive the call and hand it to Lua). Random clients are drawn
from 100,000 addresses, as in section 1: nearly every call meets a client new to its
window. Under callgrind the server runs some 50 times slower; only the counts matter.
"""

from __future__ import annotations

import argparse
import glob
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from tests.redis_server import free_port

CLIENTS = [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in range(100_000)]
MINIMAL = "minimal GCRA script (bench/gcra_min.lua), random clients"
EMPTY = "#!lua name=bench_empty\nredis.register_function('bench_empty', function() return 1 end)"


class CountedServer:
    """A redis-server under callgrind: `count(fn, n)` is its instructions per call of fn."""

    def __init__(self) -> None:
        import redis

        valgrind, binary = shutil.which("valgrind"), shutil.which("redis-server")
        if valgrind is None or binary is None:
            raise SystemExit("needs valgrind and redis-server: apt-get install valgrind")
        self.dir = tempfile.mkdtemp(prefix="server-cost-")
        port = free_port()
        self.proc = subprocess.Popen(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={self.dir}/out",
             binary, "--port", str(port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)
        self.client = redis.Redis(port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.proc.pid)], check=True,
                       capture_output=True)

    def count(self, fn: Callable[[], Any], n: int) -> float:
        fn()  # a script loaded, a connection made: not counted
        self._control("--zero")
        for _ in range(n):
            fn()
        self._control("--dump")
        # each dump is out.<n>, numbered from 1
        last = max(glob.glob(f"{self.dir}/out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        text = Path(last).read_text()
        found = re.search(r"^summary: (\d+)", text, re.M)
        if found is None:
            raise RuntimeError(f"no summary in {last}")
        return int(found.group(1)) / n

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000)
    calls = parser.parse_args().calls

    from ratelimits.engine import ALGORITHMS, Limit, RedisEngine
    from ratelimits.engine.contract import encode

    server = CountedServer()
    try:
        r = server.client
        engine = RedisEngine(r, version_key="rl:version")
        pick = random.Random(1).choice

        def ours(algorithm: str, n: int = 1, hot: bool = False) -> Callable[[], Any]:
            def call() -> Any:
                who = "203.0.113.7" if hot else pick(CLIENTS)
                return engine.evaluate(
                    [Limit(who, algorithm, 10**9, 60, name=f"{algorithm}-{i}") for i in range(n)])
            return call

        r.function_load(EMPTY, replace=True)
        minimal = r.script_load((Path(__file__).parent / "gcra_min.lua").read_text())
        keys, args, _ = encode([Limit("203.0.113.7", "fixed_window", 10**9, 60, name="e")],
                               prefix="rl:", version_key="rl:version")
        rows: list[tuple[str, Callable[[], Any]]] = [
            ("`SET NX` with a TTL (floor: django-ratelimit's first request)",
             lambda: r.set(f"dr:{pick(CLIENTS)}", 1, nx=True, ex=65)),
            ("FCALL of an empty function, our call's arguments (floor)",
             lambda: r.fcall("bench_empty", len(keys), *keys, *args)),
            (MINIMAL, lambda: r.evalsha(minimal, 1, f"g:{pick(CLIENTS)}", 10**9, 60_000_000,
                                        10**9, 1)),
        ]
        rows += [(f"`{a}`, 1 limit, random clients", ours(a)) for a in ALGORITHMS]
        rows += [("`sliding_window`, 3 limits, one client", ours("sliding_window", 3, hot=True)),
                 ("`fixed_window`, one client over its limit",
                  lambda: engine.evaluate([Limit("198.51.100.9", "fixed_window", 1, 60,
                                                 name="over")]))]
        counted = [(label, server.count(fn, calls)) for label, fn in rows]
    finally:
        server.stop()
    set_nx, least = counted[0][1], dict(counted)[MINIMAL]
    print(f"Redis instructions per call, {calls:,} calls a row (callgrind):\n")
    print(table(["call", "instructions", "vs SET NX", "vs minimal GCRA"],
                [[label, f"{n:,.0f}", f"{n / set_nx:.1f}×", f"{n / least:.2f}×"]
                 for label, n in counted]))


if __name__ == "__main__":
    main()
