"""Three gunicorn workers register as live; Redis is killed; each admits about limit / 3
with on_error="local", though INSTANCES still says 1."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from ratelimits.engine.heartbeat import BEAT_EVERY
from tests.support.workers import Site

pytestmark = pytest.mark.slow

WORKERS = 3
LIMIT = 30


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


def test_each_worker_takes_a_third_when_redis_dies(site, private_redis):
    site.policy(name="shared", mode="enforce", algorithm="fixed_window", limit=LIMIT,
                period=3600, key="global", path="/hello/", on_error="local")
    site.start(workers=WORKERS)
    # every worker beats within BEAT_EVERY of its first request, and learns all three at
    # its next beat: serve traffic (on a path no policy limits) a little longer than two
    seen: set[int] = set()
    until = time.monotonic() + 2 * BEAT_EVERY + 0.5
    while time.monotonic() < until:
        seen |= {pid for _, _, pid in site.load("/free/", 30)}
    assert len(seen) == WORKERS
    private_redis.stop()
    answers = site.load("/hello/", 200)
    admitted = Counter(pid for _, status, pid in answers if status == 200)
    served = Counter(pid for _, _, pid in answers)
    assert {status for _, status, _ in answers} <= {200, 429}
    for pid, n in served.items():  # each its share of 30: 10, not 30 (INSTANCES=1)
        assert admitted[pid] == min(LIMIT // WORKERS, n), (admitted, served)
    assert sum(admitted.values()) <= LIMIT
