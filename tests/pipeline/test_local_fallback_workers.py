"""`on_error="local"` on a leased policy (`batch`) under real gunicorn workers, Redis paused:
each worker decides alone with its share of the limit, whatever the batch, and no request
meets an error of ours."""

from __future__ import annotations

import math
import signal
import time
from collections import Counter

import pytest
import redis

from ratelimits.engine.heartbeat import BEAT_EVERY, live_key
from tests.settings import RATELIMITS
from tests.support.workers import Site

pytestmark = pytest.mark.slow

WORKERS = 4
LIMIT = 30
BATCH = 10  # above a worker's share while it is cut off: ceil(30 / 4) = 8
PERIOD = 3600


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


def test_a_batch_above_the_share_keeps_the_local_bound_when_redis_pauses(site, private_redis):
    site.policy(name="leased", mode="enforce", algorithm="fixed_window", limit=LIMIT,
                period=PERIOD, key="global", path="/hello/", on_error="local", batch=BATCH)
    site.start(workers=WORKERS)
    # serve traffic on a path no policy limits until all four workers have beaten, then a
    # beat longer: each learns, at its next beat, that four share the limit (a beat rides
    # on the policy version's read, made at most once a second)
    live = redis.Redis.from_url(private_redis.url)
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while live.zcard(live_key(RATELIMITS["KEY_PREFIX"])) < WORKERS:
        assert time.monotonic() < deadline, "the workers never all beat"
        seen |= {pid for _, _, pid in site.load("/free/", 40)}
    live.close()
    until = time.monotonic() + BEAT_EVERY + 1.5
    while time.monotonic() < until:
        seen |= {pid for _, _, pid in site.load("/free/", 40)}
    assert len(seen) == WORKERS
    private_redis.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
    try:
        started = time.time()
        answers = site.load("/hello/", 300)
        ended = time.time()
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    site.stop()
    statuses = Counter(status for _, status, _ in answers)
    assert set(statuses) <= {200, 429}, statuses
    admitted = Counter(pid for _, status, pid in answers if status == 200)
    # no lease was taken before the pause: every admission is a worker's own decision, at
    # most its share per window (the load may cross one window boundary)
    share = math.ceil(LIMIT / WORKERS)
    windows = math.floor(ended / PERIOD) - math.floor(started / PERIOD) + 1
    assert max(admitted.values()) <= share * windows, admitted
    assert sum(admitted.values()) <= share * WORKERS * windows, admitted
    assert statuses[429] > 0
    text = site.errors()
    assert "Traceback" not in text and "ValueError" not in text, text[-3000:]
