"""The gunicorn.conf.py of docs/operations/prometheus.md (operations_gunicorn_conf.py), under
a real gunicorn with PROMETHEUS_MULTIPROC_DIR: one scrape shows the sum of every worker,
and a worker that dies keeps its counts in the sum while `child_exit` drops its live
gauge."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.workers import Site

CONF = Path(__file__).with_name("operations_gunicorn_conf.py")
SETTINGS = "tests.docs_examples.operations_metrics_site"
WSGI = "django.core.wsgi:get_wsgi_application()"


def scrape(site: Site) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, body = site.text("/ratelimits/metrics/")
    assert status == 200, body
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def count(samples, policy: str, outcome: str) -> float:
    labels = frozenset({("policy", policy), ("outcome", outcome)})
    return samples.get(("ratelimits_requests_total", labels), 0.0)


def learnt_in(samples, pid: int) -> bool:
    """Whether the scrape shows the adaptive policy's gauge for worker `pid`."""
    labels = frozenset({("policy", "hello-adaptive"), ("pid", str(pid))})
    return ("ratelimits_adaptive_limit", labels) in samples


def test_one_scrape_sums_the_workers_and_a_dead_worker_keeps_its_counts(
    tmp_path, private_redis
):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS)
    try:
        site.policy(name="hello-ip", mode="enforce", algorithm="fixed_window", limit=5,
                    period=3600, key="ip", path="/hello/")
        # an adaptive policy's gauge is per live worker: what `child_exit` cleans up
        site.policy(name="hello-adaptive", mode="enforce", algorithm="adaptive", limit=8,
                    floor=2, period=60, key="global", path="/hello/")
        metrics = tmp_path / "metrics"
        metrics.mkdir()  # empty at each start
        site.env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
        site.env["MEET_DIR"] = str(tmp_path / "meet")
        (tmp_path / "meet").mkdir()
        site.start(2, 1, WSGI, "-c", str(CONF))  # -w 2 overrides the file's workers

        # two requests held in the view until both workers are in it: each worker counts
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(site.get, ["/hello/?meet=2"] * 2))
        assert len({pid for _, pid in answers}) == 2, answers
        while len(answers) < 8:
            answers.append(site.get("/hello/"))
        statuses = [status for status, _ in answers]
        assert statuses == [200] * 5 + [429] * (len(answers) - 5)

        before = scrape(site)  # answered by one worker, for both
        assert count(before, "hello-ip", "admitted") == 5
        assert count(before, "hello-ip", "rejected") == len(answers) - 5

        learnt = [pid for status, pid in answers if status == 200]
        victim = learnt[0]
        assert learnt_in(before, victim)
        gauge = metrics / f"gauge_liveall_{victim}.db"
        assert gauge.exists()

        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while gauge.exists():  # the arbiter reaps the worker and calls child_exit
            assert time.monotonic() < deadline, "child_exit did not run"
            time.sleep(0.05)

        after = scrape(site)
        assert not learnt_in(after, victim)
        assert count(after, "hello-ip", "admitted") == 5  # counters never go backwards
        assert count(after, "hello-ip", "rejected") == len(answers) - 5
    finally:
        site.stop()
