"""Section 7: Redis Cluster beside one Redis, in one run.

    .venv/bin/python bench/cluster.py [--quick]

Starts a private cluster (3 primaries, 3 replicas, from tests/redis_cluster.py) beside
the run's private redis-server; never the machine's own Redis. Measures:

- engine decisions per second from Python, one thread, 1 and 3 limits (sliding_log, large
  limits so every call charges), one Redis and the cluster interleaved in the same rounds;
  with 3 limits the cluster engine's keys sit on three primaries, so each call fans out;
- server capacity of the slot script with `redis-benchmark --cluster` (50 clients spread
  over the primaries), audited by every primary's own command counters;
- how evenly 100,000 clients' keys of one policy spread over the primaries (max/mean);
- commands and nodes per request, counted by the servers themselves;
- a projection, labelled as such, from the servers' µs per decision to what N cores
  (one primary each) would carry. Seven redis-servers share this machine's cores, so the
  run cannot show scaling itself;
- the whole middleware path on the cluster (`REDIS_URL=redis+cluster://`), and the same
  request without it, beside a bare `limits` hit on the same cluster
  (`RedisClusterStorage`), in a child process of its own (its Django settings name the
  cluster): what the middleware adds to a request against what a bare hit costs.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, interleaved, median, spread, table

BIG = 10**9
CLIENTS = 50
KEYSPACE = 100_000
PERIOD = 60.0


def spread_limits(client: Any, n: int) -> list[Any]:
    """`n` limits of one client whose keys sit on `n` different primaries."""
    from ratelimits.engine import Limit
    from ratelimits.engine.keynames import base_key

    chosen: list[Any] = []
    nodes: set[str] = set()
    i = 0
    while len(chosen) < n:
        limit = Limit("203.0.113.7", "sliding_log", BIG, PERIOD, name=f"policy-{i}")
        node = client.get_node_from_key(base_key("rl:", limit)).name
        if node not in nodes:
            nodes.add(node)
            chosen.append(limit)
        i += 1
    return chosen


def _primaries(client: Any) -> list[Any]:
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def _commandstats(servers: list[Any]) -> dict[str, dict[str, int]]:
    """Per command, calls / failed / rejected summed over `servers`."""
    total: dict[str, dict[str, int]] = {}
    for server in servers:
        for name, stats in server.info("commandstats").items():
            row = total.setdefault(name.removeprefix("cmdstat_"), {})
            for field in ("calls", "failed_calls", "rejected_calls"):
                row[field] = row.get(field, 0) + int(stats.get(field, 0))
    return total


def _spread(client: Any) -> tuple[float, dict[str, int]]:
    """How one policy's keys of 100,000 clients fall on the primaries: max/mean, counts."""
    from ratelimits.engine import Limit
    from ratelimits.engine.keynames import base_key

    owner = client.nodes_manager.get_node_from_slot
    counts = Counter(
        owner(client.keyslot(base_key("rl:", Limit(f"ip:198.51.{i // 256}.{i % 256}",
                                                   "gcra", 100, PERIOD, name="per-ip"))))
        .name for i in range(KEYSPACE))
    mean = KEYSPACE / len(client.get_primaries())
    return max(counts.values()) / mean, dict(counts)


def _per_request(client: Any, engine: Any, limits: list[Any], calls: int) -> tuple[float, int]:
    """Script calls the primaries ran per request (the tally's flush included), and how
    many primaries one request reached."""
    servers = _primaries(client)
    engine.flush()
    for server in servers:
        server.config_resetstat()
    for _ in range(calls):
        engine.evaluate(limits)
    engine.flush()
    ran = [int(s.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
           for s in servers]
    return sum(ran) / calls, sum(1 for n in ran if n >= calls)


def _cluster_benchmark(port: int, command: list[str], requests: int) -> float:
    out = subprocess.run(
        ["redis-benchmark", "--cluster", "-h", "127.0.0.1", "-p", str(port), "-c", str(CLIENTS),
         "-n", str(requests), "-r", str(KEYSPACE), "--csv", *command],
        capture_output=True, text=True, check=True,
    )
    rows = list(csv.reader(io.StringIO(out.stdout)))
    return float(rows[-1][1])


def _slot_command(sha: str, algorithm: str) -> list[str]:
    """EVALSHA of the slot script with the arguments ClusterEngine sends; `{tag}` is
    redis-benchmark's per-node hash tag, `__rand_int__` spreads the clients."""
    from ratelimits.engine import Limit
    from ratelimits.engine.contract import encode
    from ratelimits.engine.registry import REGISTRY

    limit = Limit("203.0.113.7", algorithm, 1_000, PERIOD, name="bench")
    _, args, _ = encode([limit], prefix="rl:", stats=False)
    key = f"rl:{{tag}}:__rand_int__:{REGISTRY[algorithm].code}"
    argv = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
    return ["EVALSHA", sha, "1", key, *argv]


def run(quick: bool = False) -> Section:
    import redis
    import redis.cluster

    from ratelimits.engine import RedisEngine
    from ratelimits.engine.cluster import ClusterEngine
    from ratelimits.engine.scripts import slot_source
    from tests.redis_cluster import RedisCluster

    section = Section("7. Redis Cluster beside one Redis (3 primaries, 3 replicas)")
    rounds, seconds, requests = (1, 0.3, 20_000) if quick else (5, 1.0, 200_000)
    cluster = RedisCluster().start()
    try:
        common.flush(common.OURS_DB)
        single = RedisEngine(redis.Redis.from_url(common.OURS_URL))
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        engine = ClusterEngine(client)

        # -- decisions per second from Python --------------------------------------
        trios = {n: spread_limits(client, n) for n in (1, 3)}
        cases = {}
        for n, limits in trios.items():
            cases[("one", n)] = lambda limits=limits: single.evaluate(limits)
            cases[("cluster", n)] = lambda limits=limits: engine.evaluate(limits)
        rates = interleaved(cases, rounds, seconds)
        rows, checks = [], []
        for n in (1, 3):
            one, many = median(rates[("one", n)]), median(rates[("cluster", n)])
            rows.append([str(n), fmt_rate(one), spread(rates[("one", n)]), fmt_rate(many),
                         spread(rates[("cluster", n)]), f"{many / one:.2f}×"])
            checks.append(Check(f"cluster vs one Redis, {n} limit{'s' * (n > 1)}, "
                                "decisions/s from Python", many / one, "reference", True))
        section.add(
            f"One thread, synchronous `evaluate()` calls, sliding_log limits of {BIG:,} per "
            f"minute (every call charges); median of {rounds} interleaved rounds of about "
            f"{seconds:g} s per case. With 3 limits the cluster's keys sit on 3 primaries: "
            "the engine writes the three nodes' calls before reading any reply."
        )
        section.add(table(["limits", "one Redis /s", "±", "cluster /s", "±", "cluster/one"],
                          rows))

        # -- commands and nodes per request -----------------------------------------
        per = [(n, *_per_request(client, engine, trios[n], 2_000)) for n in (1, 3)]
        section.add(
            "Round trips per request: script calls counted by the primaries "
            "(`cmdstat_evalsha`) over 2,000 requests, the in-process tally's flush "
            "included; primaries reached: those that ran at least one call per request. "
            "Each reached node gets its calls in one pipeline, every pipeline written before "
            "any reply is read, so a request waits about one round trip however many nodes "
            "it reaches.\n\n"
            + table(["limits", "script calls per request", "primaries reached"],
                    [[str(n), f"{c:.3f}", str(nodes)] for n, c, nodes in per])
        )

        # -- how evenly the keys spread ----------------------------------------------
        ratio, counts = _spread(client)
        section.add(
            f"{KEYSPACE:,} clients' keys of one policy over the primaries: "
            + ", ".join(f"{c:,}" for c in sorted(counts.values()))
            + f" (max/mean {ratio:.3f})."
        )
        checks.append(Check("key spread over primaries, max/mean", ratio, "≤ 1.10",
                            ratio <= 1.10))

        # -- server capacity, redis-benchmark --cluster -----------------------------
        if shutil.which("redis-benchmark") is None:
            section.add("redis-benchmark is not installed: capacity skipped.")
        else:
            servers = _primaries(client)
            for server in servers:
                sha = server.script_load(slot_source())
            algorithms = ("gcra", "sliding_log")
            caps: dict[str, list[float]] = {a: [] for a in algorithms}
            usec: dict[str, list[float]] = {a: [] for a in algorithms}
            for _ in range(1 if quick else 3):
                for algorithm in algorithms:
                    for server in servers:
                        server.config_resetstat()
                    caps[algorithm].append(_cluster_benchmark(
                        cluster.ports[0], _slot_command(sha, algorithm), requests))
                    stats = _commandstats(servers)["evalsha"]
                    if stats["calls"] != requests or stats["failed_calls"] or \
                            stats["rejected_calls"]:
                        raise RuntimeError(f"cluster capacity audit failed: {stats} for "
                                           f"{requests} requests")
                    per_node = [float(s.info("commandstats")["cmdstat_evalsha"]
                                      ["usec_per_call"]) for s in servers]
                    usec[algorithm].append(sum(per_node) / len(per_node))
            cap_rows = []
            for algorithm in algorithms:
                us = median(usec[algorithm])
                cap_rows.append([algorithm, fmt_rate(median(caps[algorithm])),
                                 spread(caps[algorithm]), f"{us:.1f}",
                                 fmt_rate(1e6 / us), fmt_rate(8 * 1e6 / us),
                                 fmt_rate(32 * 1e6 / us)])
            section.add(
                f"`redis-benchmark --cluster -c {CLIENTS} -n {requests:,} -r {KEYSPACE:,} "
                "--csv EVALSHA <slot.lua> 1 rl:{tag}:__rand_int__:<code> <args>`: the slot "
                "script with the arguments `ClusterEngine` sends (server time, 1,000 per "
                "minute per client: every call admits and writes), spread by redis-benchmark "
                "over the 3 primaries. Audit: the primaries' `cmdstat_evalsha` calls add up "
                "to the requests sent, none failed or rejected.\n\n"
                "**Projection, not a measurement:** the last three columns divide one second "
                "by the servers' own µs per decision (INFO commandstats, mean of the "
                "primaries): what one core per primary would carry if the network and the "
                "clients kept up. On this machine redis-benchmark and three primaries share "
                "two cores, so the measured column cannot grow with the node count."
            )
            section.add(table(
                ["script (1 limit)", "measured decisions/s", "±", "server µs per decision",
                 "projected, 1 primary on 1 core /s", "8 primaries, a core each /s",
                 "32 primaries /s"], cap_rows))
        # -- the whole middleware path on the cluster, beside `limits` ---------------------
        measured = _middleware_rates(cluster.url, quick)
        path, calls = measured["rates"], measured["calls"]
        ours, bare, theirs = (median(path[name]) for name in (MIDDLEWARE, BARE, LIMITS))
        added = 1e6 / ours - 1e6 / bare  # µs the middleware adds to a request
        section.add(
            "The whole request path on the cluster, one process, one thread: "
            "`RateLimitMiddleware` around a view returning a short `HttpResponse`, a "
            "RequestFactory GET, one enforced `fixed_window` policy of 10⁹ per minute on key "
            "`ip`, `REDIS_URL` naming the cluster; the same GET and view without the "
            "middleware (what a request costs with no limiter); beside `limits`' `hit()` of "
            "`1000000/minute` on `RedisClusterStorage` of the same cluster, its faster "
            f"strategy (fixed or sliding window counter), no request object at all. Median "
            f"of {len(path[MIDDLEWARE])} interleaved rounds. *The middleware's cost* is the "
            "first row's µs less the second's: what the limiter adds to a request, beside "
            "what a bare hit costs.\n\n"
            + table(["case", "per second", "±", "µs per call"],
                    [[name, fmt_rate(median(v)), spread(v), f"{1e6 / median(v):.1f}"]
                     for name, v in path.items()])
            + f"\n\nThe middleware's cost per request: {added:.1f} µs; a bare `limits` hit: "
            f"{1e6 / theirs:.1f} µs. Function calls (Python and C, counted with "
            f"`sys.setprofile` as in section 12): the middleware {calls['middleware']:.0f} "
            f"beyond the bare request, a bare `limits` hit {calls['limits']:.0f}."
        )
        checks.append(Check("whole middleware path on the cluster vs a bare `limits` hit "
                            "on it", ours / theirs, "reference", True))
        checks.append(Check("bare `limits` hit vs the middleware's cost per request, on the "
                            "cluster", 1e6 / theirs / added, "≥ 1.0×",
                            1e6 / theirs >= added))
        section.checks += checks
        engine.close()
        client.close()
    finally:
        cluster.stop()
        common.flush(common.OURS_DB)
    return section


MIDDLEWARE = "middleware, 1 enforced policy, decided on the cluster"
BARE = "the same GET and view, no middleware"
LIMITS = "`limits` bare hit on the cluster, its faster strategy"


def _middleware_rates(cluster_url: str, quick: bool) -> dict[str, Any]:
    """Per second, per round: the middleware path and a `limits` hit on the cluster
    (`rates`); the calls each makes (`calls`: the middleware's beyond the bare request)."""
    child = subprocess.run(
        [sys.executable, __file__, "--middleware-child", cluster_url,
         *(["--quick"] if quick else [])],
        capture_output=True, text=True, env=dict(os.environ), check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"cluster middleware bench failed:\n{child.stderr}")
    got: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return got


def _middleware_child(cluster_url: str, quick: bool) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench", DEBUG=False, USE_TZ=True, ALLOWED_HOSTS=["*"],
        # a file, not ":memory:": a snapshot rebuilt in another thread sees the policy
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                               "NAME": str(Path(tempfile.mkdtemp()) / "bench.sqlite3")}},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "ratelimits"],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        RATELIMITS={"KEY_PREFIX": "bench-rl:", "REDIS_URL": cluster_url},
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from django.http import HttpResponse
    from django.test import RequestFactory
    from limits import parse, strategies
    from limits.storage import RedisClusterStorage

    from ratelimits.middleware import RateLimitMiddleware
    from ratelimits.models import Policy

    call_command("migrate", verbosity=0)
    with transaction.atomic():
        Policy.objects.create(name="bench", mode="enforce", algorithm="fixed_window",
                              limit=10**9, period=60, key="ip", path="*")
    rf = RequestFactory()
    def view(request: Any) -> HttpResponse:
        return HttpResponse("hello")

    middleware = RateLimitMiddleware(view)
    assert middleware(rf.get("/hello/")).status_code == 200
    storage = RedisClusterStorage(cluster_url.replace("valkey+", "redis+", 1))
    item = parse("1000000/minute")
    fixed = strategies.FixedWindowRateLimiter(storage)
    sliding = strategies.SlidingWindowCounterRateLimiter(storage)

    def ours() -> None:
        assert middleware(rf.get("/hello/")).status_code == 200

    def bare() -> None:
        assert view(rf.get("/hello/")).status_code == 200

    cases = {
        MIDDLEWARE: ours,
        BARE: bare,
        "limits fixed": lambda: fixed.hit(item, "203.0.113.7"),
        "limits sliding": lambda: sliding.hit(item, "203.0.113.7"),
    }
    rounds, seconds = (3, 0.2) if quick else (7, 0.5)
    rates = interleaved(cases, rounds, seconds)
    fixed_rates, sliding_rates = rates.pop("limits fixed"), rates.pop("limits sliding")
    faster = "limits fixed" if median(fixed_rates) >= median(sliding_rates) else "limits sliding"
    rates[LIMITS] = fixed_rates if faster == "limits fixed" else sliding_rates
    calls = {name: _calls(cases[name]) for name in (MIDDLEWARE, BARE, faster)}
    print(json.dumps({"rates": rates, "calls": {
        "middleware": calls[MIDDLEWARE] - calls[BARE], "limits": calls[faster]}}))


def _calls(case: Any, n: int = 200) -> float:
    """Function calls (Python and C, as section 12 counts them) per call of `case`."""
    count = 0

    def counted(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(counted)
    try:
        for _ in range(n):
            case()
    finally:
        sys.setprofile(None)
    return count / n


if __name__ == "__main__":
    if "--middleware-child" in sys.argv:
        _middleware_child(sys.argv[sys.argv.index("--middleware-child") + 1],
                          "--quick" in sys.argv)
    else:
        common.run_section(run)
