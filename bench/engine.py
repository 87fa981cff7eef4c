"""Section 1: engine decisions per second, one process, one connection, local Redis.

    .venv/bin/python bench/engine.py [--quick]

Every row is one synchronous call after another on one connection, so a row's figure is
the inverse of its latency: client work plus one (or, for peers, several) round trips.
Limits are large (10**9 per minute) so that every call takes the admitting path, which
writes. "hot" is one client key for every call; "random" draws each call's client from
100,000 keys.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, peers
from bench.common import Check, Section, fmt_rate, median, spread, table

BIG = 10**9
KEYS = 100_000


def _ours_cases(engine, algorithms, idents):
    from ratelimits.engine import Limit

    cases = {}
    for algorithm in algorithms:
        def make(algorithm=algorithm, n=1, hot=True):
            names = [f"{algorithm}-{i}" for i in range(n)]
            fixed = [Limit("203.0.113.7", algorithm, BIG, 60, name=nm) for nm in names]
            if hot:
                return lambda: engine.evaluate(fixed)
            pick = random.Random(1).choice

            def call():
                ident = pick(idents)
                return engine.evaluate([Limit(ident, algorithm, BIG, 60, name=nm) for nm in names])

            return call

        for n in (1, 3):
            cases[("ours", algorithm, n, "hot")] = make(n=n, hot=True)
            cases[("ours", algorithm, n, "random")] = make(n=n, hot=False)
    return cases


def _peer_cases(idents):
    peers.configure_django()
    cases = {}
    rng = random.Random(2)

    def both(label, n, allow):
        cases[("peer", label, n, "hot")] = lambda: allow("203.0.113.7")
        cases[("peer", label, n, "random")] = lambda: allow(rng.choice(idents))

    for strategy in peers.LIMITS_STRATEGIES:
        short = strategy.replace("RateLimiter", "")
        both(f"limits {short}", 1, peers.limits_hits(strategy, ["1000000000/minute"]))
        both(f"limits {short}", 3, peers.limits_hits(
            strategy, ["1000000000/minute", "1000000000/hour", "1000000000/day"]))

    # DRF, and ours with its API: the hot client sends exactly its rate (see
    # peers.drf_prefill); the random clients each have a short history.
    for name, module in peers.DRF_MODULES:
        for per_min in (100, 1_000, 10_000):
            clock = peers.FakeClock(60 / per_min * (1 + 1e-6))
            allow, throttle = peers.drf_throttle(f"{per_min}/min", scope=f"b{per_min}",
                                                 clock=clock, module=module)
            peers.drf_prefill(throttle, allow, "203.0.113.7", clock)
            cases[("peer", f"{name} {per_min:,}/min", 1, "hot")] = (
                lambda allow=allow: allow("203.0.113.7"))
        allow_r, _ = peers.drf_throttle("1000/min", scope="brand", module=module)
        cases[("peer", f"{name} 1,000/min", 1, "random")] = (
            lambda allow_r=allow_r: allow_r(rng.choice(idents)))
    for name, module in peers.DJANGO_RATELIMIT_MODULES:
        both(f"{name} 1000/m", 1, peers.django_ratelimit_check("1000/m", module=module))
    both("django-smart-ratelimit check_rate_limit (redis)", 1,
         peers.smart_ratelimit_check(BIG, 60))
    both("django-trafficwatch check, fixed (cache)", 1,
         peers.trafficwatch_check(BIG, 60, "fixed", "fw"))
    both("django-trafficwatch check, redis (Lua)", 1,
         peers.trafficwatch_check(BIG, 60, "redis", "lua"))
    return cases


DRF_HOT = "`compat.drf` vs DRF, 1,000/min, hot (full history)"
DR_RANDOM = "`compat.django_ratelimit` vs django-ratelimit, 1000/m, random clients"
DR_HOT = "`compat.django_ratelimit` vs django-ratelimit, 1000/m, hot (mostly refusals)"


def _compat_pairs() -> list[tuple[str, str, str, str]]:
    """(label, the original's case, ours's case, hot or random) of each compat pair."""
    (drf, _), (drf_ours, _) = peers.DRF_MODULES
    (dr, _), (dr_ours, _) = peers.DJANGO_RATELIMIT_MODULES
    return [
        (DRF_HOT, f"{drf} 1,000/min", f"{drf_ours} 1,000/min", "hot"),
        (DR_RANDOM, f"{dr} 1000/m", f"{dr_ours} 1000/m", "random"),
        (DR_HOT, f"{dr} 1000/m", f"{dr_ours} 1000/m", "hot"),
    ]


def _middle(ratios: list[float]) -> str:
    """The 25th to 75th percentile of `ratios`."""
    q = statistics.quantiles(ratios, n=4)
    return f"{q[0]:.2f}–{q[2]:.2f}×"


def run(quick: bool = False) -> Section:
    from ratelimits.engine import ALGORITHMS, RedisEngine

    rounds, seconds = (2, 0.05) if quick else (5, 0.25)
    common.flush(common.OURS_DB, common.PEERS_DB)
    client = common.redis_client(common.OURS_DB)
    # As the Django app builds it: policy version key and per-minute counters on.
    engine = RedisEngine(client, version_key="rl:version")
    trivial = client.register_script("return 1")
    idents = [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in range(KEYS)]

    cases = {("raw", "EVALSHA `return 1`", 1, "hot"): lambda: trivial(keys=["k"], args=[1])}
    cases.update(_ours_cases(engine, ALGORITHMS, idents))
    cases.update(_peer_cases(idents))
    raw = common.interleaved(cases, rounds, seconds)
    med = {k: median(v) for k, v in raw.items()}
    floor = med[("raw", "EVALSHA `return 1`", 1, "hot")]

    section = Section("1. Engine decisions per second (one process, one connection)")
    section.add(
        f"Median of {rounds} interleaved repetitions (each about {seconds} s of back-to-back "
        "calls). *hot*: one client for every call; *random*: each call's client drawn from "
        f"{KEYS:,} keys. Our engine runs as the Django app builds it (policy version key "
        "and per-minute counters on), limits of 10⁹ per minute so every call admits and "
        "writes. *3 limits*: ours decides three limits (same algorithm, three policies) in "
        "one `evaluate()`, one FCALL; `limits` makes three `hit()` calls. ± is half the "
        "min–max spread of the repetitions."
    )
    rows = [["raw redis-py EVALSHA of `return 1` (one round trip, the floor)",
             fmt_rate(floor), "—", spread(raw[("raw", "EVALSHA `return 1`", 1, "hot")]), "—",
             "1.00×"]]
    for algorithm in ALGORITHMS:
        for n in (1, 3):
            hot, rnd = ("ours", algorithm, n, "hot"), ("ours", algorithm, n, "random")
            rows.append([f"ratelimits `{algorithm}`, {n} limit{'s' if n > 1 else ''}",
                         fmt_rate(med[hot]), fmt_rate(med[rnd]), spread(raw[hot]),
                         spread(raw[rnd]), f"{med[hot] / floor:.2f}×"])
    section.add("### Ours\n\n" + table(
        ["call", "hot /s", "random /s", "± hot", "± random", "hot vs floor"], rows))

    peer_rows = []
    labels = []
    for key in cases:
        if key[0] == "peer" and (key[1], key[2]) not in labels:
            labels.append((key[1], key[2]))
    for label, n in labels:
        hot = med.get(("peer", label, n, "hot"))
        rnd = med.get(("peer", label, n, "random"))
        what = f"{label}, {n} hit{'s' if n > 1 else ''}" if label.startswith("limits") else label
        peer_rows.append([what, fmt_rate(hot), fmt_rate(rnd),
                          "—" if hot is None else f"{hot / floor:.2f}×"])
    section.add(
        "### Peers, same run\n\n"
        "`limits`: `RedisStorage` on db 14, `strategy.hit(item, ...)`. DRF: a "
        "`SimpleRateThrottle` subclass keyed on the IP, on django-redis, a new throttle per "
        "call as DRF does per request; the hot client sends exactly its rate, so its "
        "history list is full (100, 1,000 or 10,000 timestamps, pickled and rewritten on "
        "every call), every call admitted. django-ratelimit: `is_ratelimited(..., key='ip', "
        "increment=True)` on django-redis; its hot client passes 1,000 in the first 0.3 s of "
        "a minute, so most hot calls are refusals (django-ratelimit still increments in "
        "Redis; ours answers a refused client from the process's deny cache), and the "
        "random clients are all admitted. `ratelimits.compat.*`: our classes with DRF's and "
        "django-ratelimit's API, called exactly as the originals (the same throttle "
        "subclass, rates, clock, prefill state and `is_ratelimited` arguments), each scope "
        "or group a policy declared in code (`sliding_log` for DRF, `fixed_window` for "
        "django-ratelimit) decided in one FCALL by the engine the app builds, on db 14. "
        "Both get a new request per call (a copy of one RequestFactory GET), as from a "
        "server. django-smart-ratelimit: its decorator's core "
        "`check_rate_limit(ctx, backend)` on its Redis backend (default sliding window: a "
        "sorted set of every request in the period). django-trafficwatch: its core "
        "`TrafficWatch(backend).check(request, rules)` with the default `fixed` backend "
        "(Django cache incr) and with its `redis` Lua backend. All called directly with a "
        "RequestFactory request, no request cycle.\n\n"
        + table(["call", "hot /s", "random /s", "hot vs floor"], peer_rows)
    )

    # Our compat classes beside the originals: within a few per cent of each other, so
    # timed in pairs (common.paired) for the checks, beside the table's medians.
    pairs = {}
    for label, orig, compat, load in _compat_pairs():
        ratios = common.paired(cases[("peer", orig, 1, load)], cases[("peer", compat, 1, load)],
                               *((4, 0.02) if quick else (40, 0.05)))
        pairs[label] = ratios
    section.add(
        "### Compat classes beside the originals, paired\n\n"
        f"Each round times the original, then ours, for about {0.02 if quick else 0.05} s "
        f"each; {len(next(iter(pairs.values())))} rounds. The two timings of a round share "
        "the machine's state of that moment, so the median of the rounds' ratios is "
        "steadier than the ratio of the medians above, for two cases this close.\n\n"
        + table(["ours vs the original", "median ratio", "middle half of the rounds"],
                [[label, f"{median(r):.2f}×", _middle(r)] for label, r in pairs.items()])
    )

    default = "sliding_window"
    ours1 = med[("ours", default, 1, "hot")]
    ours1_g = med[("ours", "gcra", 1, "hot")]
    ours3 = med[("ours", default, 3, "hot")]
    limits3 = max(med[("peer", f"limits {s.replace('RateLimiter', '')}", 3, "hot")]
                  for s in peers.LIMITS_STRATEGIES)
    limits1 = max(med[("peer", f"limits {s.replace('RateLimiter', '')}", 1, "hot")]
                  for s in peers.LIMITS_STRATEGIES)
    (drf_name, _), _ = peers.DRF_MODULES
    drf = med[("peer", f"{drf_name} 1,000/min", 1, "hot")]
    worst1 = min(med[("ours", a, 1, "hot")] for a in ALGORITHMS)
    section.checks += [
        Check(f"ours, 1 limit (`{default}`, the default) vs raw EVALSHA", ours1 / floor,
              "≥ 0.85×", ours1 / floor >= 0.85),
        Check("ours, 1 limit (`gcra`) vs raw EVALSHA", ours1_g / floor, "≥ 0.85×",
              ours1_g / floor >= 0.85),
        Check("ours, 1 limit, slowest algorithm vs raw EVALSHA", worst1 / floor, "≥ 0.85×",
              worst1 / floor >= 0.85),
        Check(f"ours, 1 limit (`{default}`) vs `limits` one hit (its fastest strategy)",
              ours1 / limits1, "≥ 1.1×", ours1 / limits1 >= 1.1),
        Check(f"ours, 3 limits in one call (`{default}`) vs `limits` three hits (its fastest "
              "strategy)", ours3 / limits3, "≥ 2.5×", ours3 / limits3 >= 2.5),
        Check(f"ours, 1 limit (`{default}`) vs DRF at 1,000/min", ours1 / drf, "reference",
              True),
        Check("ours `compat.drf` vs DRF `SimpleRateThrottle`, 1,000/min, hot (full history), "
              "paired", median(pairs[DRF_HOT]), "≥ 1.0×", median(pairs[DRF_HOT]) >= 1.0),
        Check("ours `compat.django_ratelimit` vs django-ratelimit `is_ratelimited`, 1000/m, "
              "random clients (every call admitted), paired", median(pairs[DR_RANDOM]),
              "≥ 1.0×", median(pairs[DR_RANDOM]) >= 1.0),
        Check("ours `compat.django_ratelimit` vs django-ratelimit, 1000/m, hot (mostly "
              "refusals), paired", median(pairs[DR_HOT]), "reference", True),
    ]
    common.flush(common.OURS_DB, common.PEERS_DB)
    return section


if __name__ == "__main__":
    common.run_section(run)
