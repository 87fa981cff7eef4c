"""`RATELIMITS["CLOCK"] = "client"` from the settings to the store: each call carries
this process's time, and no script the request path sends calls `TIME` (a guard on every
script refuses it, see tests/engine/strict_guard.py)."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from ratelimits.engine import RedisEngine
from tests.engine.strict_guard import guarding


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket", "sliding_log"])
def test_requests_are_decided_without_the_store_clock(client, make_policy, redis_url,
                                                      algorithm):
    server = redis.Redis.from_url(redis_url)
    with guarding(server, clock="client"), \
            override_settings(RATELIMITS={**settings.RATELIMITS, "CLOCK": "client"}):
        make_policy(name="p", limit=2, period=60, key="global", path="/hello/",
                    algorithm=algorithm)
        codes = [client.get("/hello/").status_code for _ in range(3)]
    # a script refused by the guard would be an outage, which the policy's on_error
    # answers: the third request refused says the store decided each one
    assert codes == [200, 200, 429]
    assert server.function_list()  # the (guarded) library ran


def test_a_lost_version_restarts_from_this_process_clock(redis_client):
    engine = RedisEngine(redis_client, version_key="rl:version", clock="client")
    first = engine.bump_version()
    redis_client.flushdb()  # the store restarted empty
    before = time.time()
    after = engine.bump_version()
    assert after > first
    assert before * 1_000_000 <= after <= time.time() * 1_000_000 + 1
