"""A per-process policy under three gunicorn workers: each counts alone, none asks Redis."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis

from ratelimits.engine.heartbeat import BEAT_EVERY
from tests.support.workers import Site

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


def test_three_workers_admit_at_most_ten_each_and_send_redis_nothing(site, private_redis):
    site.policy(name="node", mode="enforce", algorithm="fixed_window", limit=10,
                period=3600, key="global", path="/hello/", counting="per_process")
    site.start(workers=3)
    server = redis.Redis.from_url(private_redis.url)
    before = server.info("commandstats")
    started = time.monotonic()
    answers = site.load("/hello/", 150)
    elapsed = time.monotonic() - started
    admitted = Counter(pid for _, status, pid in answers if status == 200)
    served = Counter(pid for _, _, pid in answers)
    assert set(status for _, status, _ in answers) <= {200, 429}
    assert sum(admitted.values()) <= 30
    for pid, n in served.items():  # each worker: exactly its own ten, then refusals
        assert admitted[pid] == min(10, n)
    after = server.info("commandstats")
    scripts = sum(after.get(f"cmdstat_{name}", {}).get("calls", 0)
                  - before.get(f"cmdstat_{name}", {}).get("calls", 0)
                  for name in ("evalsha", "fcall"))
    # no script call decided it: at most the heartbeats that ride on version reads
    assert scripts <= 3 * (elapsed / BEAT_EVERY + 2)
    # no client state in Redis: the policy's figures (its per-minute counters and
    # offenders, sent with a heartbeat once the burst outlasts a beat) are not a count
    keys = {k.decode() for k in server.keys("*")}
    state = {k for k in keys if not k.startswith("tests-rl:s:node:")}
    assert state <= {"tests-rl:version", "tests-rl:live"}
