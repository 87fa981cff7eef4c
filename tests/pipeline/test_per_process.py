"""Per-process policies: decided by this process's in-process engine, never by the store,
and still all or nothing with the shared policies of the same request."""

from __future__ import annotations

import math
import time

import pytest
import redis

from ratelimits import signals
from ratelimits.engine import Limit, MemoryEngine
from ratelimits.engine.registry import ALGORITHMS, REGISTRY
from ratelimits.engine.types import Outcome
from ratelimits.pipeline.compiled import in_rollout
from ratelimits.pipeline.engines import get_engine, get_local_engine
from ratelimits.pipeline.resolver import resolver


def commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}


@pytest.fixture
def server(private_redis, settings):
    """The engine on a server of this test's own, to count the commands it receives."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    return redis.Redis.from_url(private_redis.url)


def minute() -> int:
    return math.floor(time.time() / 60)


def store_counters(name: str) -> dict[str, int]:
    """Policy `name`'s counters of this minute in the store, as the admin reads them."""
    get_engine().flush()  # the tally, sent now rather than within a second
    return get_engine().counters(name, minute())


def test_a_per_process_policy_is_decided_without_the_store(client, make_policy, server):
    make_policy(name="node", limit=2, counting="per_process", path="/hello/")
    assert client.get("/login/").status_code == 200  # snapshot and version learnt
    before = commands(server)
    statuses = [client.get("/hello/").status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    used = {k: v - before.get(k, 0) for k, v in commands(server).items()}
    assert used.get("evalsha", 0) == 0  # nothing of it went to the store
    assert not [k for k in server.keys("*") if b"{" in k]  # no client state either
    assert store_counters("node") == {"a": 2, "r": 2}  # the figures the admin reads
    assert get_local_engine().counters("node", minute()) == {}  # counted once, there


def test_its_headers_signals_and_offenders_work_as_for_shared_ones(
    client, make_policy, server
):
    make_policy(name="node", limit=1, counting="per_process", path="/hello/")
    make_policy(name="watch", mode="shadow", limit=1, counting="per_process", path="/hello/")
    limited, would = [], []
    signals.request_limited.connect(lambda **kw: limited.append(kw["policy"]), weak=False)
    signals.request_would_be_limited.connect(
        lambda **kw: would.append(kw["policy"]), weak=False
    )
    try:
        first = client.get("/hello/")
        second = client.get("/hello/")
    finally:
        signals.request_limited.receivers.clear()
        signals.request_would_be_limited.receivers.clear()
    assert first.status_code == 200
    assert first["RateLimit"].startswith('"node";r=0;t=')
    assert second.status_code == 429
    assert second["RateLimit"].startswith('"node";r=0;t=')
    assert 0 < int(second["Retry-After"]) <= 3600
    assert limited == ["node"]
    assert would == ["watch"]  # its one unit went to the first request
    hour = math.floor(time.time() / 3600)
    get_engine().flush()
    assert get_engine().offenders("node", hour) == [("ip:127.0.0.1", 1)]


@pytest.mark.parametrize("fields", [{"mode": "shadow"}, {"rollout": 1}],
                         ids=["shadow", "client outside the rollout"])
def test_a_lone_per_process_policy_only_watches_a_client_it_does_not_enforce_for(
    client, make_policy, server, fields
):
    """The route's one policy, per process (taken alone by the in-process engine): a
    client it is not enforced for passes, and its refusals are would-be ones, counted and
    signalled as such, with no headers of a limit that does not apply to it."""
    # the test client's address is outside a 1% rollout of "node" (a stable draw)
    assert not in_rollout("node", "ip:127.0.0.1", 1)
    make_policy(name="node", limit=1, counting="per_process", path="/hello/", **fields)
    would: list[str] = []
    signals.request_would_be_limited.connect(
        lambda **kw: would.append(kw["policy"]), weak=False
    )
    try:
        responses = [client.get("/hello/") for _ in range(3)]
    finally:
        signals.request_would_be_limited.receivers.clear()
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert not [r for r in responses if "RateLimit" in r]
    assert would == ["node", "node"]
    assert store_counters("node") == {"a": 1, "w": 2}


def test_a_refusal_in_process_spares_the_store(client, make_policy, server):
    make_policy(name="node", limit=1, counting="per_process", path="/hello/")
    make_policy(name="shared", limit=10, path="/hello/")
    assert client.get("/hello/").status_code == 200
    before = commands(server)
    response = client.get("/hello/")
    assert response.status_code == 429
    used = {k: v - before.get(k, 0) for k, v in commands(server).items()}
    assert used.get("evalsha", 0) == 0  # refused here: the store was not asked
    assert response["RateLimit"].startswith('"node"')


def test_a_store_refusal_gives_the_per_process_units_back(client, make_policy, server):
    make_policy(name="node", limit=3, counting="per_process", path="/hello/")
    make_policy(name="shared", limit=1, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(4)] == [200, 429, 429, 429]
    # nothing charged in process for the refused requests: two units are still there
    assert store_counters("node") == {"a": 1, "o": 3}
    from ratelimits.models import Policy

    Policy.objects.filter(name="shared").delete()  # now only the per-process one applies
    from ratelimits.receivers import policies_changed

    policies_changed()
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]


def test_a_store_outage_with_deny_gives_the_per_process_units_back(
    client, make_policy, settings
):
    from tests.redis_server import free_port

    make_policy(name="node", limit=1, counting="per_process", path="/hello/")
    make_policy(name="shared", limit=10, path="/hello/", on_error="deny")
    settings.CACHES = {  # nothing listens there
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    assert [client.get("/hello/").status_code for _ in range(3)] == [503, 503, 503]
    # its one unit is still there: taken by each request, given back after the 503
    node = next(p for p in resolver.snapshot().policies if p.name == "node")
    assert get_local_engine().evaluate([node.limit_for("ip:127.0.0.1")]).allowed
    assert not get_local_engine().evaluate([node.limit_for("ip:127.0.0.1")]).allowed


def test_the_drf_throttle_decides_per_process_policies_too(client, make_policy, server):
    make_policy(name="node", limit=1, counting="per_process", path="*", scope="items")
    assert client.get("/api/items/").status_code == 200
    assert client.get("/api/items/").status_code == 429


# -- the in-process refund, per algorithm ------------------------------------------------


def _limit(algorithm: str) -> Limit:
    spec = REGISTRY[algorithm]
    burst = (0 if spec.delays else 1) if spec.has_burst else None  # one unit, no queue
    return Limit("client", algorithm, 1, 60, burst=burst, name=f"p-{algorithm}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_refund_restores_what_the_charge_took(algorithm):
    engine = MemoryEngine()
    limit = _limit(algorithm)
    decision, receipt = engine.take([limit], now=1000.0)
    assert decision.allowed and receipt is not None
    assert not engine.evaluate([limit], now=1000.5).allowed  # the one unit is spent
    refunded = engine.refund(receipt)
    assert not refunded.allowed
    assert refunded.results[0].outcome is Outcome.SPARED
    assert refunded.results[0].remaining == 1
    assert engine.take([limit], now=1000.5)[0].allowed  # given back
    assert engine.counters(limit.name, math.floor(1000 / 60)) == {"a": 1, "o": 1, "r": 1}


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "leaky_bucket"])
def test_a_bucket_rebuilt_on_since_keeps_the_charge(algorithm):
    # another request charged on top of this one's state: moving it back could admit more
    # than the limit, so the refund leaves it (under-admission, never over)
    engine = MemoryEngine()
    limit = Limit("client", algorithm, 2, 60, burst=2 if algorithm != "leaky_bucket" else 1)
    _, receipt = engine.take([limit], now=1000.0)
    assert engine.evaluate([limit], now=1000.0).allowed
    assert receipt is not None
    engine.refund(receipt)
    assert not engine.evaluate([limit], now=1000.0).allowed


def test_a_refused_take_has_no_receipt():
    engine = MemoryEngine()
    limit = Limit("client", "fixed_window", 1, 60)
    engine.evaluate([limit], now=1000.0)
    decision, receipt = engine.take([limit], now=1000.0)
    assert not decision.allowed and receipt is None
