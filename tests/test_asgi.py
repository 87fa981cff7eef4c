"""Under a real ASGI server (uvicorn), the middleware decides on the event loop.

The site is tests/support/workers_settings.py served by one uvicorn process on a private
redis-server: its asyncio engine records the thread of every decision, and an async view
reports them beside the event loop's own thread.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from tests.settings import RATELIMITS
from tests.support.workers import Site

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    site.policy(name="asgi", mode="enforce", algorithm="fixed_window", limit=3, period=60,
                key="ip", path="/async/", on_error="deny")
    site.start_asgi()
    yield site
    site.stop()


def test_decisions_stay_on_the_event_loop(site, private_redis):
    assert [site.text("/async/")[0] for _ in range(5)] == [200, 200, 200, 429, 429]
    seen = json.loads(site.text("/threads/")[1])
    # four store calls (the fifth request is the deny cache's), all on the loop's thread
    assert len(seen["decided_on"]) == 4
    assert set(seen["decided_on"]) == {seen["loop"]}
    keys = redis.Redis.from_url(private_redis.url).keys(f"{RATELIMITS['KEY_PREFIX']}*:fw:*")
    assert len(keys) == 1  # counted in Redis, where every process sees it


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_dead_redis_follows_on_error_on_the_async_path(site, private_redis, fault):
    """As on the sync path (test_faults.py): a killed server refuses the connection, a
    paused one accepts it and never answers; either way the answer comes within the
    limiter's timeouts, per on_error, and the breaker then answers at once."""
    assert site.text("/async/")[0] == 200
    if fault == "killed":
        private_redis.proc.send_signal(signal.SIGKILL)
        private_redis.proc.wait()
    else:
        private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(3):
            started = time.monotonic()
            status, _ = site.text("/async/")
            assert status == 503  # on_error="deny": refused, never an error page
            assert time.monotonic() - started < 1.0  # the limiter's timeouts, not the cache's
    finally:
        if fault == "paused":
            private_redis.proc.send_signal(signal.SIGCONT)
