"""A flood from one client over three gunicorn workers: remembered refusals.

Each worker remembers an enforced refusal until its retry time, at most a second, and
answers the client's next requests without a round trip; those refusals still reach the
per-minute counters within a second, and an operator's reset reaches every worker within
a second. Real workers, a private redis-server watched with MONITOR: each script call is
told apart by its SHA (a decision, or the heartbeat that rides along now and then) and
each worker by its connection.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.keynames import stats_key
from ratelimits.engine.local_first import HOLD
from ratelimits.engine.scripts import batch_library
from tests.redis_server import Monitor
from tests.settings import RATELIMITS
from tests.support.workers import Site

pytestmark = pytest.mark.slow

PREFIX = RATELIMITS["KEY_PREFIX"]  # what the workers use (tests.settings)
LIMIT = Limit("ip:127.0.0.1", "sliding_log", 5, 60.0, name="flood")
BATCH, LIBRARY = batch_library()
@pytest.fixture
def site(tmp_path, private_redis):
    # Loaded before the workers start: a worker's first call must not meet a missing
    # function and be sent twice, which MONITOR would show as two decisions.
    redis.Redis.from_url(private_redis.url).function_load(LIBRARY)
    site = Site(tmp_path, private_redis.url)
    site.policy(name="flood", mode="enforce", algorithm="sliding_log", limit=5, period=60,
                key="ip", path="/hello/")
    site.start(workers=3)
    yield site
    site.stop()


def _refused(client: redis.Redis, minutes: range) -> int:
    return sum(int(client.hget(stats_key(PREFIX, "flood", m), "r") or 0) for m in minutes)


def test_a_flood_costs_about_one_script_per_worker_per_second(site, private_redis, tmp_path,
                                                              capsys):
    client = redis.Redis.from_url(private_redis.url)
    monitor = Monitor(private_redis.port, tmp_path / "monitor.txt")
    started = time.time()
    answers = site.load("/hello/", 1_000)
    ended = time.time()
    elapsed = ended - started
    statuses = Counter(status for _, status, _ in answers)
    assert statuses == {200: 5, 429: 995}

    # every refusal reaches the counters within a second of the flood's end
    minutes = range(int(started // 60), int(ended // 60) + 1)
    while _refused(client, minutes) < 995 and time.time() < ended + HOLD + 1:
        time.sleep(0.01)
    reached = time.time() - ended
    assert _refused(client, minutes) == 995
    assert reached <= HOLD + 0.25, reached

    # the admitted ones, then about one per worker per second the flood lasted
    scripts = monitor.scripts(BATCH, since=started, until=ended)
    assert len(scripts) <= 5 + 3 * (1 + elapsed), (len(scripts), elapsed)
    with capsys.disabled():
        print(f"\nflood: 1,000 requests over 3 workers in {elapsed:.2f} s: {len(scripts)} "
              f"decision scripts (bound {5 + 3 * (1 + elapsed):.0f}); refusals counted "
              f"{reached * 1000:.0f} ms after the flood")
    client.close()


def test_refusals_say_honestly_when_to_retry(site):
    first = None
    for _ in range(40):
        sent = time.time()
        status, _, headers = site.fetch("/hello/")
        if status == 200:
            first = first or sent
            continue
        assert first is not None
        # until the first admitted request leaves the 60 s log, whichever worker answers
        waited = sent - first
        assert 60 - waited - 2 <= int(headers["retry-after"]) <= 60 - waited + 2


def test_a_reset_reaches_every_worker_within_a_second(site, private_redis, tmp_path):
    client = redis.Redis.from_url(private_redis.url)
    answers = site.load("/hello/", 300)
    assert Counter(status for _, status, _ in answers)[200] == 5
    stop = threading.Event()
    flooded: set[int] = set()  # the workers that answered the flood during the reset

    def keep_flooding() -> None:
        while not stop.is_set():
            flooded.add(site.get("/hello/")[1])

    flooders = [threading.Thread(target=keep_flooding) for _ in range(3)]
    for t in flooders:
        t.start()
    try:
        time.sleep(0.3)  # the workers answer from memory by now
        monitor = Monitor(private_redis.port, tmp_path / "monitor.txt")
        # an operator resets the client: the store's keys are deleted by another process
        RedisEngine(client, prefix=PREFIX).reset(LIMIT)
        reset_at = time.time()
        time.sleep(HOLD + 0.3)  # a real-time promise about other processes' memory
    finally:
        stop.set()
        for t in flooders:
            t.join()
    # within the hold, every flooded worker asked Redis again (a worker may have
    # connected anew meanwhile: connections are told apart by the pid they are named by)
    runs = monitor.scripts(BATCH, since=reset_at, until=reset_at + HOLD + 0.1)
    names = monitor.names(client)
    asked = {int(names[who].removeprefix("worker-")) for _, who in runs if who in names}
    assert len(flooded) >= 2 and asked == flooded, (asked, flooded, runs, names)
    client.close()
