"""Prometheus metrics: real requests through the middleware, read back from the scrape view.

The metrics live in prometheus_client's default registry for the whole test session, so
each test names its policies uniquely (exact counter values) and reads the histogram as
a difference between two scrapes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from ratelimits.conf import build_config, get_config
from ratelimits.pipeline import metrics

SCRAPE = "/ratelimits/metrics/"


def exempt_scrapes(request) -> bool:
    """The recipe of docs/operations/prometheus.md: scrapes are not rate limited, so they
    cost no engine call."""
    return request.path == SCRAPE


def enable(settings, **extra) -> None:
    settings.RATELIMITS = {
        **settings.RATELIMITS,
        "METRICS": True,
        "EXEMPT": "tests.pipeline.test_metrics.exempt_scrapes",
        **extra,
    }


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def scrape(client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the scrape view's output, by (sample name, labels)."""
    response = client.get(SCRAPE)
    assert response.status_code == 200
    # the classic text format when the scraper names none (version 0.0.4)
    assert response["Content-Type"] == choose_encoder("")[1]
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def outcomes(samples, policy: str) -> dict[str, float]:
    """The policy's request counts by outcome, as the scrape shows them."""
    return {
        outcome: samples[
            ("ratelimits_requests_total", frozenset({("policy", policy), ("outcome", outcome)}))
        ]
        for outcome in metrics.OUTCOMES
    }


def engine_calls(samples, backend: str) -> float:
    return samples.get(("ratelimits_engine_seconds_count", frozenset({("backend", backend)})), 0)


def counts(**nonzero: int) -> dict[str, float]:
    return {outcome: nonzero.get(outcome, 0) for outcome in metrics.OUTCOMES}


def test_each_policy_outcome_is_counted_exactly(client, make_policy, settings, any_store):
    enable(settings)
    tight, wide, shadow = unique("tight"), unique("wide"), unique("shadow")
    make_policy(name=tight, limit=1, path="/hello/")
    make_policy(name=wide, limit=10, path="/hello/")
    make_policy(name=shadow, mode="shadow", limit=1, path="/hello/")
    before = scrape(client)

    statuses = [client.get("/hello/").status_code for _ in range(3)]

    assert statuses == [200, 429, 429]
    after = scrape(client)
    # 1: all admit and are charged. 2, 3: `tight` refuses, so `wide` admitted but was not
    # charged (spared) and `shadow`, charged once, would refuse.
    assert outcomes(after, tight) == counts(admitted=1, rejected=2)
    assert outcomes(after, wide) == counts(admitted=1, spared=2)
    assert outcomes(after, shadow) == counts(admitted=1, would_reject=2)
    backend = "memory" if any_store == "memory" else "redis"
    assert engine_calls(after, backend) - engine_calls(before, backend) == 3
    inf = ("ratelimits_engine_seconds_bucket", frozenset({("backend", backend), ("le", "+Inf")}))
    assert after[inf] == engine_calls(after, backend)


def test_shadow_policy_alone_counts_would_reject_and_admits(client, make_policy, settings):
    enable(settings)
    name = unique("observe")
    make_policy(name=name, mode="shadow", limit=2, path="/hello/")

    statuses = [client.get("/hello/").status_code for _ in range(5)]

    assert statuses == [200] * 5
    assert outcomes(scrape(client), name) == counts(admitted=2, would_reject=3)


def test_an_adaptive_policy_is_counted_as_decided_in_process(client, make_policy, settings):
    enable(settings)
    name = unique("busy")
    make_policy(name=name, algorithm="adaptive", limit=4, floor=1, key="global",
                path="/stream/")
    before = scrape(client)
    running = client.get("/stream/")  # in flight until closed: the learnt limit is 1
    refused = client.get("/stream/")
    running.close()
    assert (running.status_code, refused.status_code) == (200, 503)
    after = scrape(client)
    assert outcomes(after, name) == counts(admitted=1, rejected=1)
    assert engine_calls(after, "memory") - engine_calls(before, "memory") == 2
    assert engine_calls(after, "redis") == engine_calls(before, "redis")
    learnt = ("ratelimits_adaptive_limit", frozenset({("policy", name)}))
    assert after[learnt] == 1  # what it learnt from one sample at its floor


def test_latency_buckets_span_sub_millisecond_to_100_ms(client, make_policy, settings):
    enable(settings)
    make_policy(name=unique("any"), path="/hello/")
    client.get("/hello/")
    bounds = {
        dict(labels)["le"]
        for (name, labels) in scrape(client)
        if name == "ratelimits_engine_seconds_bucket"
    }
    assert {"0.0001", "0.001", "0.01", "0.1", "+Inf"} <= bounds


@pytest.mark.slow
def test_an_unreachable_store_counts_unavailable_per_policy(
    client, make_policy, settings, private_redis
):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    enable(settings)
    allow, deny = unique("allow"), unique("deny")
    make_policy(name=allow, limit=5, path="/hello/", on_error="allow")
    make_policy(name=deny, limit=5, path="/hello/", on_error="deny")
    assert client.get("/hello/").status_code == 200
    before = scrape(client)
    private_redis.proc.send_signal(signal.SIGKILL)
    private_redis.proc.wait()

    statuses = [client.get("/hello/").status_code for _ in range(4)]

    assert statuses == [503] * 4
    after = scrape(client)
    assert outcomes(after, allow) == counts(admitted=1, unavailable=4)
    assert outcomes(after, deny) == counts(admitted=1, unavailable=4)
    # failed calls are timed too: the latency the limiter added to those requests
    assert engine_calls(after, "redis") - engine_calls(before, "redis") == 4


def test_scrapes_are_requests_like_any_other_unless_exempt(client, make_policy, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "METRICS": True}
    name = unique("everything")
    make_policy(name=name, limit=1, key="global", path="*")

    assert client.get(SCRAPE).status_code == 200
    assert client.get(SCRAPE).status_code == 429

    enable(settings)
    assert outcomes(scrape(client), name) == counts(admitted=1, rejected=1)


def test_off_by_default_404_and_nothing_recorded(client, make_policy, settings):
    assert get_config()["METRICS"] is False
    name = unique("quiet")
    make_policy(name=name, path="/hello/")
    enable(settings)
    before = scrape(client)
    settings.RATELIMITS = {**settings.RATELIMITS, "METRICS": False}

    assert client.get(SCRAPE).status_code == 404
    assert client.get("/hello/").status_code == 200

    enable(settings)
    after = scrape(client)
    assert not any(dict(labels).get("policy") == name for _, labels in after)
    assert engine_calls(after, "redis") == engine_calls(before, "redis")


def test_missing_package_warns_404s_and_records_nothing(client, make_policy, settings, monkeypatch):
    name = unique("missing")
    make_policy(name=name, path="/hello/")
    enable(settings)
    before = scrape(client)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    settings.RATELIMITS = {**settings.RATELIMITS}  # a new config: decided again

    (warning,) = [m for m in run_checks() if m.id == "ratelimits.W003"]
    assert 'pip install "django-ratelimits[prometheus]"' in warning.hint
    assert client.get(SCRAPE).status_code == 404
    assert client.get("/hello/").status_code == 200

    monkeypatch.delitem(sys.modules, "prometheus_client")
    settings.RATELIMITS = {**settings.RATELIMITS}
    after = scrape(client)
    assert not any(dict(labels).get("policy") == name for _, labels in after)
    assert engine_calls(after, "redis") == engine_calls(before, "redis")


def test_no_warning_when_installed_or_off():
    with override_settings(RATELIMITS={"METRICS": True}):
        assert not [m for m in run_checks() if m.id == "ratelimits.W003"]
    assert not [m for m in run_checks() if m.id == "ratelimits.W003"]


def test_metrics_setting_must_be_a_boolean():
    with pytest.raises(ImproperlyConfigured, match="METRICS"):
        build_config({"METRICS": "yes"})


def test_openmetrics_when_the_scraper_asks(client, settings):
    enable(settings)
    response = client.get(SCRAPE, headers={"Accept": "application/openmetrics-text"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert b"# EOF" in response.content
    assert client.post(SCRAPE).status_code == 405


def test_a_metrics_failure_is_logged_once_and_never_breaks_a_request(
    client, make_policy, settings, monkeypatch, caplog
):
    enable(settings)
    make_policy(name=unique("broken"), path="/hello/")
    assert metrics.recorder_for(get_config()) is not None
    # an outcome the recorder has no label for: every decision fails to record
    monkeypatch.setattr(metrics, "INDEX", {})
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        statuses = [client.get("/hello/").status_code for _ in range(3)]

    assert statuses == [200, 200, 429]
    logged = [r for r in caplog.records if "recording metrics failed" in r.getMessage()]
    assert len(logged) == 1


WORKER = """
import sys, types
import django
from django.conf import settings

settings.configure(RATELIMITS={"METRICS": True})
django.setup()
from ratelimits.conf import get_config
from ratelimits.engine import Limit, MemoryEngine
from ratelimits.pipeline import metrics

name, requests = sys.argv[1], int(sys.argv[2])
recorder = metrics.recorder_for(get_config())
# each increment written to this worker's files, not kept for a scrape it may not answer
assert isinstance(recorder, metrics.MultiprocessRecorder)
engine = MemoryEngine()
policy = types.SimpleNamespace(name=name)
limit = Limit("client", "fixed_window", 2, 60, name=name)
for _ in range(requests):
    decision = engine.evaluate([limit], now=1_800_000_000.0)
    recorder.decided(engine, 0.0002, [(policy, "client")], decision)
"""


def test_one_scrape_sums_every_worker_in_multiprocess_mode(client, settings, monkeypatch,
                                                           tmp_path):
    """Three real worker processes record into PROMETHEUS_MULTIPROC_DIR and exit; one
    scrape (from yet another process) shows their sum, as behind gunicorn."""
    import subprocess

    name = unique("workers")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, name, str(n)], env=env)
        for n in (3, 4, 5)
    ]
    assert [w.wait(timeout=60) for w in workers] == [0, 0, 0]
    assert len(list(tmp_path.glob("counter_*.db"))) == 3  # one file per worker

    enable(settings)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = scrape(client)
    # Each worker admitted 2 and refused the rest of its own requests.
    assert outcomes(samples, name) == counts(admitted=6, rejected=1 + 2 + 3)
    assert engine_calls(samples, "memory") == 12
    assert samples[("ratelimits_engine_seconds_bucket",
                    frozenset({("backend", "memory"), ("le", "0.00025")}))] == 12


def test_a_missing_multiprocess_directory_is_a_clear_503(client, settings, monkeypatch,
                                                         tmp_path, caplog):
    enable(settings)
    missing = tmp_path / "not-created"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(missing))
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        response = client.get(SCRAPE)
    assert response.status_code == 503
    text = response.content.decode()
    assert str(missing) in text and "not a directory" in text and "Traceback" not in text
    assert any("PROMETHEUS_MULTIPROC_DIR" in r.getMessage() for r in caplog.records)
