"""Section 13: PostgreSQL beside Redis, decisions per second, one process, one connection.

    .venv/bin/python bench/postgres.py [--quick]

The same calls on both engines, interleaved in one run: `evaluate()` of one limit and of
three (three policies of one algorithm, one call either way: Redis's FCALL, PostgreSQL's
`ratelimits_decide_v1`), each as the Django app builds the engine (policy version key
and tallied counters on), limits of 10⁹ per minute so every call admits and writes.
PostgreSQL is the machine's (`POSTGRES_URL`, default postgresql://postgres@127.0.0.1:5432/
postgres), in a database of the run's own, dropped at the end; Redis is the run's
private server.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

BIG = 10**9
KEYS = 100_000
SERVER = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _cases(engine, label, algorithms, idents):
    from ratelimits.engine import Limit

    cases = {}
    for algorithm in algorithms:
        for n in (1, 3):
            names = [f"{algorithm}-{i}" for i in range(n)]
            fixed = [Limit("203.0.113.7", algorithm, BIG, 60, name=nm) for nm in names]
            pick = random.Random(n).choice
            cases[(label, algorithm, n, "hot")] = lambda fixed=fixed: engine.evaluate(fixed)
            cases[(label, algorithm, n, "random")] = (
                lambda names=names, algorithm=algorithm, pick=pick: engine.evaluate(
                    [Limit(pick(idents), algorithm, BIG, 60, name=nm) for nm in names]))
    return cases


def run(quick: bool = False) -> Section:
    import psycopg

    from ratelimits.engine import ALGORITHMS, RedisEngine
    from ratelimits.engine.postgres import PostgresEngine

    rounds, seconds = (2, 0.1) if quick else (5, 0.25)
    common.flush(common.OURS_DB)
    redis_engine = RedisEngine(common.redis_client(common.OURS_DB), version_key="rl:version")
    name = f"ratelimits_bench_{os.getpid()}"
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    pg = PostgresEngine(SERVER.rsplit("/", 1)[0] + "/" + name, version_key="rl:version",
                        timeout=5)
    try:
        idents = [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in range(KEYS)]
        cases = {**_cases(redis_engine, "redis", ALGORITHMS, idents),
                 **_cases(pg, "postgres", ALGORITHMS, idents)}
        raw = common.interleaved(cases, rounds, seconds)
    finally:
        pg.close()
        redis_engine.close()
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    med = {k: median(v) for k, v in raw.items()}

    section = Section("13. PostgreSQL beside Redis (one process, one connection)")
    section.add(
        f"Median of {rounds} interleaved repetitions (each about {seconds} s of back-to-back "
        "calls), Redis and PostgreSQL in the same run, on this machine's servers. *hot*: "
        f"one client for every call; *random*: each call's client drawn from {KEYS:,} keys. "
        "Both engines as the Django app builds them, limits of 10⁹ per minute so every "
        "call admits and writes; *3 limits*: three policies in one call. ± is half the "
        "min–max spread of the repetitions.")
    rows = []
    ratios = []
    for algorithm in ALGORITHMS:
        for n in (1, 3):
            r_hot, p_hot = ("redis", algorithm, n, "hot"), ("postgres", algorithm, n, "hot")
            r_rnd, p_rnd = (("redis", algorithm, n, "random"),
                            ("postgres", algorithm, n, "random"))
            ratios.append(med[p_hot] / med[r_hot])
            rows.append([f"`{algorithm}`, {n} limit{'s' if n > 1 else ''}",
                         fmt_rate(med[r_hot]), fmt_rate(med[p_hot]),
                         fmt_rate(med[r_rnd]), fmt_rate(med[p_rnd]),
                         spread(raw[p_hot]), f"{med[p_hot] / med[r_hot]:.2f}×"])
    section.add(table(["call", "Redis hot /s", "PostgreSQL hot /s", "Redis random /s",
                       "PostgreSQL random /s", "± PostgreSQL hot", "PostgreSQL / Redis"],
                      rows))
    section.checks.append(Check("PostgreSQL / Redis decisions per second (median of rows)",
                                median(ratios), "reference", True))
    return section


if __name__ == "__main__":
    common.run_section(run)
