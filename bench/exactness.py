"""Section 5: exactness under a race, 8 processes on one key, limit 200 per hour.

    .venv/bin/python bench/exactness.py [--quick]

Eight spawned processes (each with its own connections) wait on a barrier, then make
ATTEMPTS decisions each for one shared client as fast as they can; the admitted ones are
summed. An exact limiter admits 200; the over-admission factor is admitted / 200.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, peers
from bench.common import Check, Section, table

PROCESSES = 8
ATTEMPTS = 150
LIMIT = 200
HOUR = 3600
IN_FLIGHT = 4  # the second concurrency check: slots held and released in a loop


def _ours(algorithm: str, run: str):
    from ratelimits.engine import Limit, RedisEngine

    engine = RedisEngine(common.redis_client(common.OURS_DB), stats=False)
    burst = LIMIT if algorithm in ("token_bucket", "gcra") else None
    if algorithm == "leaky_bucket":
        burst = LIMIT - 1  # a queue of 199 behind the one that passes: 200 admitted
    limit = Limit("203.0.113.7", algorithm, LIMIT, HOUR, burst=burst, name=f"x-{run}")
    return lambda: engine.evaluate([limit]).allowed


def _peer(name: str, run: str):
    peers.configure_django()
    ip = "203.0.113.7"
    if name in DRF:
        allow, _ = peers.drf_throttle("200/hour", scope=f"x{run}", module=DRF[name])
    elif name in DJANGO_RATELIMIT:
        allow = peers.django_ratelimit_check("200/h", group=f"x{run}",
                                             module=DJANGO_RATELIMIT[name])
    elif name.startswith("limits "):
        from limits import parse

        limiter = peers.limits_strategy(name.split()[1] + "RateLimiter")
        item = parse("200/hour")
        space = f"x{run}-{name.split()[1]}"  # strategies store different types under one key
        return lambda: limiter.hit(item, space, ip)
    elif name == "django-smart-ratelimit (redis, sliding window)":
        allow = peers.smart_ratelimit_check(LIMIT, HOUR, prefix=f"x{run}")
    elif name.startswith("django-trafficwatch"):
        backend = "fixed" if "fixed" in name else "redis"
        # each backend its own rule name: the two store different types under one name
        allow = peers.trafficwatch_check(LIMIT, HOUR, backend, name=f"x{run}-{backend}")
    else:
        raise ValueError(name)
    return lambda: allow(ip)


def _in_flight_check(run: str):
    """Acquire a concurrency slot, hold it briefly, release; track the true in-flight max."""
    from ratelimits.engine import Limit, RedisEngine

    client = common.redis_client(common.OURS_DB)
    engine = RedisEngine(client, stats=False)
    limit = Limit("203.0.113.7", "concurrency", IN_FLIGHT, 60, name=f"c-{run}")
    gauge, peak = f"bench:gauge:{run}", f"bench:peak:{run}"

    def attempt() -> bool:
        decision = engine.evaluate([limit])
        if not decision.allowed:
            return False
        now = client.incr(gauge)
        client.eval("if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or 0) then "
                    "redis.call('SET', KEYS[1], ARGV[1]) end", 1, peak, now)
        time.sleep(0.0005)
        client.decr(gauge)
        engine.release(decision)
        return True

    return attempt


def _worker(scenarios, barrier, results) -> None:
    for kind, name, run in scenarios:
        try:
            if kind == "ours":
                fn = _ours(name, run)
            elif kind == "inflight":
                fn = _in_flight_check(run)
            else:
                fn = _peer(name, run)
            barrier.wait(60)
            admitted = sum(1 for _ in range(ATTEMPTS) if fn())
            results.put((name, admitted))
        except Exception as exc:  # reported in the table; the other scenarios still run
            results.put((name, f"{type(exc).__name__}: {exc}"))
        barrier.wait(60)


#: DRF's throttle and django-ratelimit, each beside ours with its API (name: module).
DRF = {f"{label} 200/hour": module for label, module in peers.DRF_MODULES}
DJANGO_RATELIMIT = {f"{label} 200/h": module for label, module in peers.DJANGO_RATELIMIT_MODULES}
#: The originals, which may over-admit, and ours with their API, which must not.
ORIGINALS, COMPAT = zip(*(DRF, DJANGO_RATELIMIT), strict=True)
PEERS = (
    *DRF,
    *DJANGO_RATELIMIT,
    "limits MovingWindow",
    "limits FixedWindow",
    "limits SlidingWindowCounter",
    "django-smart-ratelimit (redis, sliding window)",
    "django-trafficwatch (fixed, cache)",
    "django-trafficwatch (redis, Lua)",
)


def _checks(counts: dict[str, int], peak: int) -> list[Check]:
    """The counts that must be exact (ours, the compat layers' included), and the
    originals' counts beside the compat layers'."""
    checks = []
    exact = ("sliding_log", "fixed_window", "token_bucket", "gcra")
    for name in exact:
        got = counts.get(name, -1)
        checks.append(Check(f"`{name}` admitted", got, "= 200", got == LIMIT, unit=""))
    got = counts.get("concurrency", -1)
    checks.append(Check("`concurrency` admitted (200 slots)", got, "= 200", got == LIMIT,
                        unit=""))
    checks.append(Check(f"`concurrency` peak in flight (limit {IN_FLIGHT})", peak,
                        f"≤ {IN_FLIGHT}", peak <= IN_FLIGHT, unit=""))
    for original, ours in zip(ORIGINALS, COMPAT, strict=True):
        got = counts.get(ours, -1)
        checks.append(Check(f"{ours} admitted", got, "= 200", got == LIMIT, unit=""))
        checks.append(Check(f"{original} admitted (the original, beside it)",
                            counts.get(original, -1), "reference", True, unit=""))
    return checks


def run(quick: bool = False) -> Section:
    from ratelimits.engine import ALGORITHMS

    common.flush(common.OURS_DB, common.PEERS_DB)
    run_id = uuid.uuid4().hex[:8]
    scenarios = [("ours", a, run_id) for a in ALGORITHMS]
    scenarios.append(("inflight", "concurrency (in flight)", run_id))
    scenarios += [("peer", p, run_id) for p in PEERS]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(scenarios, barrier, results))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    counts: dict[str, int] = {}
    errors: dict[str, str] = {}
    for _ in range(PROCESSES * len(scenarios)):
        name, admitted = results.get(timeout=300)
        if isinstance(admitted, str):
            errors[name] = admitted
        else:
            counts[name] = counts.get(name, 0) + admitted
    for p in procs:
        p.join()
    peak = int(common.redis_client(common.OURS_DB).get(f"bench:peak:{run_id}") or 0)

    rows = []
    for kind, name, _ in scenarios:
        if kind == "inflight":
            continue
        label = f"ratelimits `{name}`" if kind == "ours" else name
        note = ""
        if name in ("token_bucket", "gcra"):
            note = "burst 200"
        elif name == "leaky_bucket":
            note = "burst (queue) 199: admitted with a delay"
        elif name == "concurrency":
            note = "200 in flight, never released"
        if name in errors:
            rows.append([label, note, f"failed: {errors[name][:80]}", "—"])
            continue
        rows.append([label, note, f"{counts[name]:,}", f"{counts[name] / LIMIT:.2f}×"])
    section = Section("5. Exactness: 8 processes, one client, 200 per hour")
    section.add(
        f"{PROCESSES} spawned processes × {ATTEMPTS} attempts ({PROCESSES * ATTEMPTS:,} in "
        "all) on one client key, released together by a barrier, as fast as they can; each "
        "process has its own connections. Limit 200 per hour. Over-admission = admitted / "
        "200. `sliding_window` admits 200 because the previous window is empty here. "
        "`ratelimits.compat.*`: our classes with DRF's and django-ratelimit's API, called "
        "as the originals beside them (each process its own Django and SQLite database, "
        "the declared policy on the shared Redis)."
    )
    section.add(table(["limiter", "note", "admitted", "over-admission"], rows, "llrr"))
    section.add(
        f"Concurrency, held and released: limit {IN_FLIGHT} in flight, each admitted "
        "request holds its slot 0.5 ms, then releases it; the peak number of requests "
        f"really in flight (an independent Redis counter) was **{peak}**, "
        f"{counts.get('concurrency (in flight)', 0):,} requests admitted in all."
    )
    section.checks += _checks(counts, peak)
    common.flush(common.OURS_DB, common.PEERS_DB)
    return section


if __name__ == "__main__":
    common.run_section(run)
