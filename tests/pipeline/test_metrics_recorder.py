"""The in-process recorder, read at scrape time: exact after any number of decisions, with
threads racing to record and to scrape, and the very page prometheus_client's own Counter
and Histogram would give for the same decisions.

Each test has a registry of its own, so counts are exact from zero.
"""

from __future__ import annotations

import re
import sys
import threading
import types

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics import disable_created_metrics, enable_created_metrics
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from ratelimits.engine import Limit, MemoryEngine, RedisEngine
from ratelimits.engine.types import Decision
from ratelimits.pipeline import metrics

T0 = 1_800_000_000.0  # the engine's clock, passed explicitly


def samples(registry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def counted(got, policy: str) -> dict[str, float]:
    return {
        outcome: got[("ratelimits_requests_total",
                      frozenset({("policy", policy), ("outcome", outcome)}))]
        for outcome in metrics.OUTCOMES
    }


def counts(**nonzero: int) -> dict[str, float]:
    return {outcome: nonzero.get(outcome, 0) for outcome in metrics.OUTCOMES}


def bucket(got, backend: str, le: str) -> float:
    return got[("ratelimits_engine_seconds_bucket", frozenset({("backend", backend), ("le", le)}))]


def series(got, backend: str, suffix: str) -> float:
    return got[(f"ratelimits_engine_seconds_{suffix}", frozenset({("backend", backend)}))]


def policy(name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name)


def decisions(name: str, limit: int, n: int) -> list[Decision]:
    """What a real in-process engine answers to `n` requests against `limit` per minute."""
    engine = MemoryEngine()
    wanted = [Limit("client", "fixed_window", limit, 60, name=name)]
    return [engine.evaluate(wanted, now=T0) for _ in range(n)]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_a_scrape_after_n_decisions_shows_exactly_n(registry, redis_client):
    recorder = metrics.InProcessRecorder(registry)
    memory, redis = MemoryEngine(), RedisEngine(redis_client)
    # on a bound (`le` is inclusive), just past one, past the last: three buckets
    latencies = [0.00005, 0.00005000001, 0.3]
    answers = decisions("tight", 3, 10)
    for i, decision in enumerate(answers):
        recorder.decided(memory, latencies[i % 3], [(policy("tight"), "client")], decision)
    recorder.decided(redis, 0.002, [(policy("tight"), "client")], answers[-1])
    recorder.unavailable(redis, 0.1, [policy("tight"), policy("other")])

    got = samples(registry)

    assert counted(got, "tight") == counts(admitted=3, rejected=8, unavailable=1)
    assert counted(got, "other") == counts(unavailable=1)
    assert [bucket(got, "memory", le) for le in ("5e-05", "0.0001", "0.25", "+Inf")] == [
        4, 7, 7, 10]
    assert series(got, "memory", "count") == 10
    assert series(got, "memory", "sum") == pytest.approx(4 * 0.00005 + 3 * 0.00005000001
                                                         + 3 * 0.3)
    assert [bucket(got, "redis", le) for le in ("0.001", "0.0025", "0.1", "+Inf")] == [
        0, 1, 2, 2]
    assert series(got, "redis", "count") == 2
    assert series(got, "redis", "sum") == pytest.approx(0.102)


def test_racing_threads_lose_no_increment_and_every_scrape_is_whole(registry):
    """Real threads record as a gthread worker's do, while another scrapes; the switch
    interval is at its shortest so the threads interleave as much as they can."""
    recorder = metrics.InProcessRecorder(registry)
    admitted, rejected = decisions("racing", 1, 2)
    engines = (MemoryEngine(), RedisEngine.__new__(RedisEngine))  # only their class is read
    threads, each = 8, 3000
    start = threading.Barrier(threads + 1)
    done = threading.Event()
    torn: list[dict] = []

    def record(worker: int) -> None:
        mine = policy(f"p{worker % 2}")
        start.wait()
        for i in range(each):
            answer = admitted if i % 3 else rejected
            recorder.decided(engines[i % 2], 0.0003, [(mine, "client")], answer)

    def scrape() -> None:
        start.wait()
        while not done.is_set():
            got = samples(registry)
            decided = sum(v for (name, _), v in got.items() if name.endswith("requests_total"))
            timed = sum(v for (name, _), v in got.items()
                        if name == "ratelimits_engine_seconds_count")
            if decided != timed:  # one decision's increments seen by halves
                torn.append(got)

    workers = [threading.Thread(target=record, args=(w,)) for w in range(threads)]
    scraper = threading.Thread(target=scrape)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in [*workers, scraper]:
            t.start()
        for t in workers:
            t.join()
        done.set()
        scraper.join()
    finally:
        sys.setswitchinterval(interval)

    assert torn == []
    got = samples(registry)
    per_policy = threads // 2 * each
    for name in ("p0", "p1"):
        assert counted(got, name) == counts(admitted=per_policy * 2 // 3,
                                            rejected=per_policy // 3)
    for backend in ("memory", "redis"):
        calls = threads * each // 2
        assert series(got, backend, "count") == calls
        assert bucket(got, backend, "0.00025") == 0
        assert bucket(got, backend, "0.0005") == calls


def created_times_blanked(page: bytes) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", page.decode())


@pytest.mark.parametrize("created", [True, False], ids=["created", "no-created"])
def test_the_page_is_what_prometheus_clients_own_metrics_give(registry, created):
    """Names, labels, bucket bounds, values, `_created` samples (or none, when switched off),
    in both exposition formats: the same as the recorder on prometheus_client's own Counter
    and Histogram (the one multiprocess mode uses) gives for the same calls."""
    own = CollectorRegistry()
    if not created:
        disable_created_metrics()
    try:
        ours, theirs = metrics.InProcessRecorder(registry), metrics.MultiprocessRecorder(own)
        memory, redis = MemoryEngine(), RedisEngine.__new__(RedisEngine)
        for recorder in (ours, theirs):
            for i, decision in enumerate(decisions("same", 2, 5)):
                latency = 0.0000123 * 7**i  # from the first bucket to past the last
                recorder.decided(memory, latency, [(policy("same"), "client")], decision)
            recorder.unavailable(redis, 0.5, [policy("same"), policy("down")])
            recorder.learnt("same", 3)

        for encode in (generate_latest, openmetrics_latest):
            page = encode(registry)
            assert (b"_created" in page) is created
            assert created_times_blanked(page) == created_times_blanked(encode(own))
    finally:
        enable_created_metrics()


def test_the_names_are_reserved_in_the_registry(registry):
    metrics.InProcessRecorder(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter(*metrics.REQUESTS, ["policy", "outcome"], registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram(*metrics.ENGINE_SECONDS, ["backend"], registry=registry)


def test_without_a_multiprocess_directory_the_recorder_counts_in_process(registry):
    assert metrics.multiprocess_dir() is None
    assert isinstance(metrics.new_recorder(registry), metrics.InProcessRecorder)
