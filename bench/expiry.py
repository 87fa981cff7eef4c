"""In-process engine: deciding many distinct clients that come and go.

    .venv/bin/python bench/expiry.py [--clients N] [--period SECONDS]

Each of N distinct clients sends one request (fixed_window, 10 per period, 60 s unless
told) at 2,000 new clients per second of explicit time, through `MemoryEngine.decide()`
as a log replay does; so up to 2,000 x period clients hold live state at any moment and
the rest have expired. Prints
the time to decide them all, decisions per second, and the keys the store still holds at
the end (what expiry leaves in memory). Then the same number of requests, built the
same way, from one client, measured in the same run: the ratio says what distinct,
expiring clients cost over one hot client.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ratelimits.engine import Limit, MemoryEngine

START = 1_800_000_000.0
RATE = 2_000  # new clients per second of explicit time


def run(clients: int, period: int, distinct: bool) -> tuple[float, int]:
    engine = MemoryEngine()
    template = Limit("", "fixed_window", 10, period, name="p")
    prepare, decide = engine.prepare, engine.decide
    started = time.perf_counter()
    for i in range(clients):
        # the same work per request in both runs; only the client differs
        key = f"c{i}" if distinct else f"c{i % 1}"
        decide([prepare(replace(template, key=key))], START + i / RATE)
    elapsed = time.perf_counter() - started
    return elapsed, len(engine._store.data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--period", type=int, default=60)
    args = parser.parse_args()
    n, period = args.clients, args.period
    many, held = run(n, period, distinct=True)
    one, _ = run(n, period, distinct=False)
    print(f"period {period} s; {n:,} distinct clients: {many:.2f} s ({n / many:,.0f} decisions/s), "
          f"{held:,} keys held at the end")
    print(f"{n:,} requests of one client: {one:.2f} s ({n / one:,.0f} decisions/s)")
    print(f"distinct / one client time: {many / one:.2f}×")


if __name__ == "__main__":
    main()
