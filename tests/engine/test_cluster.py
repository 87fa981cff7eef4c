"""The key layout's promise on a real Redis Cluster: every key of one policy-and-client
shares a hash tag, so one limit is decided in one script call on the node that owns it."""

from __future__ import annotations

import pytest
import redis
import redis.cluster

from ratelimits.engine import ALGORITHMS, Limit, MemoryEngine, RedisEngine
from tests.engine.conftest import T0

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster_client(cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    yield client
    client.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_limit_is_decided_on_the_node_that_owns_its_keys(cluster_client, algorithm):
    engine = RedisEngine(cluster_client, stats=False)  # counters and version: not yet
    twin = MemoryEngine()
    limit = Limit("ip:203.0.113.7", algorithm, 3, 60.0, name=f"p-{algorithm}")
    times = [T0 + 0.001 * i for i in range(5)] + [T0 + 59.9, T0 + 60.5]  # and a new window
    got = [engine.evaluate([limit], now=t) for t in times]
    want = [twin.evaluate([limit], now=t) for t in times]
    assert [d.allowed for d in got] == [d.allowed for d in want]
    assert [d.results[0].remaining for d in got] == [d.results[0].remaining for d in want]
    assert False in [d.allowed for d in got]  # the limit was reached on the cluster
    keys = [
        key
        for node in cluster_client.get_primaries()
        for key in cluster_client.get_redis_connection(node).scan_iter()
    ]
    assert keys, "the decision wrote no state"
    slots = {cluster_client.keyslot(key) for key in keys}
    assert len(slots) == 1, keys
