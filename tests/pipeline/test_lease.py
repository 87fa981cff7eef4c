"""Leased policies through the middleware: a request that matches leased and unleased
policies, the units a refusal spends (none), the headers, and the store calls saved."""

from __future__ import annotations

import re

import pytest

from ratelimits.engine.scripts import lease_source
from ratelimits.pipeline.engines import get_engine
from tests.redis_server import Monitor, sha


def held(name: str) -> int:
    """Units this process holds leased for the policy `name`."""
    return sum(n for limit, n in get_engine().leases.held().items() if limit.name == name)


def remaining(response, name: str) -> int:
    match = re.search(rf'"{name}";r=(\d+)', response["RateLimit"])
    assert match, response["RateLimit"]
    return int(match.group(1))


def test_a_refusal_by_an_unleased_policy_spends_no_leased_unit(client, make_policy):
    make_policy(name="leased", limit=100, period=60, batch=10)
    make_policy(name="strict", limit=1, period=60)
    assert client.get("/hello/").status_code == 200  # leases 10, spends 1
    assert held("leased") == 9
    for _ in range(3):
        assert client.get("/hello/").status_code == 429  # "strict" refuses
    assert held("leased") == 9  # the refused requests spent nothing


def test_an_empty_window_refuses_without_charging_the_unleased_policy(
    client, make_policy, redis_client
):
    make_policy(name="leased", limit=2, period=60, batch=2)
    make_policy(name="other", limit=100, period=60)
    assert [client.get("/hello/").status_code for _ in range(4)] == [200, 200, 429, 429]
    refused = client.get("/hello/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    # "other" was charged for the two admitted requests only
    # (a client's <field>:l beside its count records what its leases were granted)
    counts = [int(n) for k in redis_client.keys("*:fw:*")
              for f, n in redis_client.hgetall(k).items() if not f.endswith(b":l")]
    assert sorted(counts) == [2, 2]


def test_headers_report_the_figures_as_of_the_lease(client, make_policy):
    make_policy(name="leased", limit=100, period=60, batch=10)
    first, second = client.get("/hello/"), client.get("/hello/")
    # the window had 90 left after the lease, and this process holds 9, then 8
    assert remaining(first, "leased") == 99
    assert remaining(second, "leased") == 98


def test_leased_requests_cost_a_store_call_per_batch(client, make_policy, private_redis,
                                                     settings, tmp_path):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    make_policy(name="leased", limit=1000, period=60, batch=20)
    monitor = Monitor(private_redis.port, tmp_path / "monitor.txt")
    statuses = [client.get("/hello/").status_code for _ in range(100)]
    assert statuses == [200] * 100
    # the lease script's runs (a heartbeat may ride along, a script of its own)
    calls = len(monitor.scripts(sha(lease_source())))
    # 100 requests, 20 units a lease: 5 lease calls, one more if a lease outlived its second
    assert 5 <= calls <= 7


def test_the_in_process_engine_decides_leased_policies_exactly(client, make_policy,
                                                               memory_store):
    make_policy(name="leased", limit=3, period=60, batch=2)
    assert [client.get("/hello/").status_code for _ in range(5)] == [200, 200, 200, 429, 429]


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "sliding_log"])
def test_the_model_refuses_batch_where_a_lease_would_break_the_promise(make_policy, algorithm):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="batch"):
        make_policy(name="x", algorithm=algorithm, limit=10, period=60, batch=5)


@pytest.mark.parametrize("batch", [None, 10])
def test_a_calendar_day_refuses_until_local_midnight_leased_or_not(
    client, make_policy, settings, clock, batch
):
    """A day of `TIME_ZONE` (Los Angeles): with or without `batch`, 30 admitted, then
    refused until local midnight (Retry-After 60,403 s at 07:13:17), not until 00:00
    UTC; and the leased policy counts in the unleased one's window."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("America/Los_Angeles")
    settings.TIME_ZONE = "America/Los_Angeles"
    clock.freeze(datetime(2027, 1, 15, 7, 13, 17, tzinfo=zone).timestamp())
    make_policy(name="daily", algorithm="fixed_window", calendar="day", limit=30,
                batch=batch, key="global", path="/hello/")
    statuses = [client.get("/hello/").status_code for _ in range(30)]
    refused = client.get("/hello/")
    assert statuses == [200] * 30 and refused.status_code == 429
    assert refused["Retry-After"] == "60403"
    clock.freeze(datetime(2027, 1, 16, 0, 0, tzinfo=zone).timestamp())
    assert client.get("/hello/").status_code == 200
