"""One Redis round trip per request, whatever the number of matching policies."""

from __future__ import annotations

import re
import time

import pytest
import redis

from ratelimits.engine.scripts import batch_source
from ratelimits.pipeline.changes import listener


def commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}


@pytest.mark.parametrize("policies", [1, 3, 7])
def test_one_script_call_per_request_through_the_middleware(
    client, make_policy, private_redis, settings, policies
):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    algorithms = [
        "gcra",
        "sliding_window",
        "fixed_window",
        "token_bucket",
        "sliding_log",
        "leaky_bucket",
        "concurrency",
    ]
    for i in range(policies):
        make_policy(
            name=f"p{i}",
            algorithm=algorithms[i],
            limit=1000,
            period=60,
            path="*",
            burst=10 if algorithms[i] == "leaky_bucket" else None,
        )
    assert client.get("/hello/").status_code == 200  # snapshot loaded, script loaded
    # the process's listener connects once (not per request): before counting
    deadline = time.monotonic() + 5
    while listener.watch is None or listener.reading:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    direct = redis.Redis.from_url(private_redis.url)
    before = commands(direct)
    for _ in range(20):
        assert client.get("/hello/").status_code == 200
    after = commands(direct)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in delta.items() if v and k != "info"}
    # INFO commandstats also counts the commands the script runs inside Redis
    inside = {c.lower() for c in re.findall(r"redis\.call\('(\w+)'", batch_source())}
    # the script's ZREM refunds a sliding log's reservation (charge_on), which no policy
    # here makes: every ZREM counted is a concurrency slot's release
    inside.discard("zrem")
    outside = {k: v for k, v in delta.items() if k not in inside}
    released = 20 if policies == 7 else 0  # a concurrency slot is freed after the response
    assert outside.pop("fcall") == 20
    assert outside == ({"zrem": released} if released else {})
