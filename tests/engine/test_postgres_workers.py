"""A site with PostgreSQL only, served by three gunicorn workers: 300 racing requests
against a limit of 100 admit exactly 100, whatever the algorithm; and processes racing
on one instant (explicit time, so nothing refills) admit exactly the capacity of every
algorithm the engine decides, and the limit of both windows when they lease (`batch`)."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from ratelimits.engine import Limit
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from tests.engine.conftest import T0
from tests.support.workers import Site

LIMIT = 100
REQUESTS = 300
#: A day: over a race of seconds, a bucket refills a hundredth of a unit.
PERIOD = 86_400


@pytest.fixture
def site(tmp_path, site_database, monkeypatch):
    monkeypatch.setenv("WORKERS_POSTGRES_URL", site_database)
    site = Site(tmp_path, "", settings="tests.support.workers_postgres_settings",
                probe=None)
    yield site
    site.stop()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket", "gcra"])
def test_three_workers_admit_exactly_the_limit(site, site_database, algorithm):
    site.policy(name="race", mode="enforce", algorithm=algorithm, limit=LIMIT,
                period=PERIOD, key="global", path="/hello/")
    site.start(3)
    _every_worker_ready(site, 3)
    answers = site.load("/hello/", REQUESTS, threads=12)
    statuses = Counter(status for _, status, _ in answers)
    assert statuses == {200: LIMIT, 429: REQUESTS - LIMIT}
    assert len({pid for _, status, pid in answers if status == 200}) > 1  # a real race
    # the counters reach the database, where the admin reads them: each worker sends its
    # tally within a second of counting (on a busy machine, when its thread runs)
    engine = PostgresEngine(site_database)
    deadline = time.monotonic() + 60
    try:
        while True:
            totals: Counter[str] = Counter()
            minutes = _minutes(site_database)
            for counts in engine.counters_many([("race", m) for m in minutes]):
                totals.update(counts)
            if totals == {"a": LIMIT, "r": REQUESTS - LIMIT} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert totals == {"a": LIMIT, "r": REQUESTS - LIMIT}
    finally:
        engine.close()


def _every_worker_ready(site: Site, workers: int, timeout: float = 120.0) -> None:
    """Return once each worker has answered (a worker loads Django on its first request,
    seconds on a busy machine: the race must not be a race of start-ups)."""
    deadline = time.monotonic() + timeout
    seen: set[int] = set()

    def ask(_: int) -> int | None:
        try:
            return site.get("/free/")[1]
        except OSError:  # a worker still starting, past the client's timeout: ask again
            return None

    while len(seen) < workers:
        assert time.monotonic() < deadline, f"only workers {seen} answered"
        with ThreadPoolExecutor(workers * 2) as pool:
            seen.update(pid for pid in pool.map(ask, range(workers * 2)) if pid)


def _minutes(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT DISTINCT minute FROM ratelimits_counts_v1 WHERE name = 'race'")]


#: Every algorithm with a capacity of 100 at one instant (a leaky bucket lets one through
#: and queues 99; concurrency holds 100 slots, none released).
CAPACITY = {
    "fixed_window": {},
    "sliding_window": {},
    "sliding_log": {},
    "token_bucket": {"burst": LIMIT},
    "gcra": {"burst": LIMIT},
    "leaky_bucket": {"burst": LIMIT - 1},
    "concurrency": {},
}


def _hammer(url: str, algorithm: str, start, reports, batch: int | None = None) -> None:
    store = PostgresEngine(url, timeout=30)
    # with a batch, each process leases units and spends them in process (`LocalFirst`)
    engine = store if batch is None else LocalFirst(store)
    limit = Limit("one-key", algorithm, LIMIT, PERIOD, name=f"race-{algorithm}",
                  batch=batch, **CAPACITY[algorithm])
    start.wait()
    reports.append(sum(engine.evaluate([limit], now=T0).allowed
                       for _ in range(REQUESTS // 3)))
    engine.close()


def race_at_one_instant(url: str, algorithm: str, batch: int | None = None) -> int:
    """Three processes decide one client at one instant: how many they admitted."""
    made = PostgresEngine(url, version_key="v")  # its tables, before the race
    made.read_version()
    made.close()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    with ctx.Manager() as manager:
        reports = manager.list()
        procs = [ctx.Process(target=_hammer, args=(url, algorithm, start, reports, batch))
                 for _ in range(3)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        return sum(reports)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(CAPACITY))
def test_three_processes_admit_exactly_the_capacity(postgres_url, algorithm):
    assert race_at_one_instant(postgres_url, algorithm) == LIMIT


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_three_processes_leasing_admit_exactly_the_limit(postgres_url, algorithm):
    """Leases of 7 (100 is not a multiple: the last grant is partial) taken by racing
    processes: each unit is charged before it is spent, and at one instant no lease
    ends, so every unit leased is spent: exactly the limit, never more."""
    assert race_at_one_instant(postgres_url, algorithm, batch=7) == LIMIT
