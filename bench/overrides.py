"""Section 8: what 10,000 overrides cost the request path.

    .venv/bin/python bench/overrides.py [--quick]

`RateLimitMiddleware` around a trivial view, one enforced policy, the engine's Redis call
answered by a canned reply (so the figures are our Python only, as in
`bench/request_path.py`). Two snapshots of the same policy, swapped in every round: one
without overrides, one with 10,000 (5,000 exact addresses and 5,000 networks of 15
prefix lengths, /16 to /30). Requests come from a client no override matches (the
longest-prefix search tries every prefix length), from one with an exact override and
from one inside a network. The measurement runs in a process of its own (Django is
configured there), on a private redis-server.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Check, Section, table  # noqa: E402

EXACT, NETWORKS = 5_000, 5_000
CLIENTS = {"no override matches": "192.0.2.1", "an exact override": "10.0.19.135",
           "inside a network": "172.16.0.77"}


def _overrides(policy: Any) -> list[Any]:
    from ratelimits.models import Override

    rows = [Override(policy=policy, match=f"ip:10.0.{i // 256}.{i % 256}", limit=10**9)
            for i in range(EXACT)]
    for i in range(NETWORKS):
        length, k = 16 + i % 15, i // 15  # /16 ... /30, the k-th network of that length
        base = ((172 << 24) | (16 << 16)) + (k << (32 - length))
        network = f"{base >> 24}.{base >> 16 & 255}.{base >> 8 & 255}.{base & 255}/{length}"
        rows.append(Override(policy=policy, match=f"ip:{network}", limit=10**9))
    assert len({o.match for o in rows}) == EXACT + NETWORKS
    return rows


def measure(rounds: int, n: int) -> dict[str, Any]:
    """Runs in its own process: µs per request, per case, median of the rounds."""
    import time

    from bench.request_path import _setup
    from tests.redis_server import RedisProcess

    server = RedisProcess().start()
    try:
        _setup(server.url)
        from django.http import HttpResponse
        from django.test import RequestFactory

        from ratelimits.middleware import RateLimitMiddleware
        from ratelimits.models import Override, Policy
        from ratelimits.pipeline import decision
        from ratelimits.pipeline.engines import get_engine
        from ratelimits.pipeline.resolver import load_snapshot, resolver

        decision.DB_CHECK_EVERY = float("inf")  # the bench swaps snapshots itself
        policy = Policy.objects.create(name="bench", mode="enforce", algorithm="fixed_window",
                                       limit=10**9, period=60, key="ip", path="*")
        middleware = RateLimitMiddleware(lambda request: HttpResponse("hello"))
        rf = RequestFactory()
        assert middleware(rf.get("/hello/")).status_code == 200
        version = resolver.snapshot().version
        plain = load_snapshot(version)
        Override.objects.bulk_create(_overrides(policy))
        count = Override.objects.count()
        loaded = time.perf_counter()
        with_overrides = load_snapshot(version)
        load_ms = (time.perf_counter() - loaded) * 1000
        store = get_engine().store
        # every command answered with a decision's reply: so no heartbeat may ride along
        # (its pipeline would get that reply, fail, and log every request from then on)
        store.perform = lambda need: [version, 1, 0, 1, 10**9 - 1, 60_000_000, 0, 0, b"a"]
        store.heartbeat = None

        def request(ip: str) -> Any:
            return lambda: middleware(rf.get("/hello/", REMOTE_ADDR=ip))

        cases = {("none", who): (plain, request(ip)) for who, ip in CLIENTS.items()}
        cases |= {("10,000", who): (with_overrides, request(ip)) for who, ip in CLIENTS.items()}
        out: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
        for _ in range(rounds):
            for key, (snap, fn) in cases.items():
                resolver._snapshot = snap
                fn()
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                out[key].append((time.perf_counter() - start) / n * 1e6)
        med = {f"{a}|{b}": statistics.median(v) for (a, b), v in out.items()}
        return {"us": med, "overrides": count, "load_ms": load_ms}
    finally:
        server.stop()


def run(quick: bool = False) -> Section:
    rounds, n = (3, 2_000) if quick else (9, 10_000)
    result = subprocess.run(
        [sys.executable, __file__, "--measure", str(rounds), str(n)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    data = json.loads(result.stdout.strip().splitlines()[-1])
    us = data["us"]
    section = Section("8. Overrides on the request path")
    section.add(
        f"One enforced policy, `RateLimitMiddleware` around a trivial view, the engine's "
        f"reply canned (our Python only); the policy without overrides and with "
        f"{data['overrides']:,} (5,000 exact addresses and 5,000 networks of 15 prefix "
        f"lengths, /16 to /30), the two snapshots swapped in each of {rounds} rounds of {n:,} "
        f"requests; medians. Building the snapshot with them took {data['load_ms']:.0f} ms "
        "(once per policy edit, per process)."
    )
    rows, worst = [], 0.0
    for who in CLIENTS:
        none, many = us[f"none|{who}"], us[f"10,000|{who}"]
        worst = max(worst, many - none)
        rows.append([who, f"{none:.1f}", f"{many:.1f}", f"{many - none:+.1f}"])
    section.add(table(["client", "µs, no overrides", "µs, 10,000 overrides", "difference"],
                      rows, "lrrr"))
    section.checks.append(Check("request path, 10,000 overrides minus none (worst client)",
                                round(worst, 1), "≤ 5 µs", worst <= 5, unit=" µs"))
    return section


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        print(json.dumps(measure(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        from bench import common

        common.run_section(run)
