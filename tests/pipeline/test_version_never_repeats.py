"""The policy version never repeats a number, even after the store lost it (flushed, or
restarted without its data): a process that holds a snapshot of an old number must not
take a new edit for the snapshot it has (lua/version.lua)."""

from __future__ import annotations

import pytest
import redis
import redis.cluster

from ratelimits.conf import get_config
from ratelimits.engine import RedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.models import Policy


def test_a_flushed_store_never_hands_out_a_number_again(redis_client):
    engine = RedisEngine(redis_client, version_key="rl:version")
    before = [engine.bump_version() for _ in range(3)]
    assert before == [before[0], before[0] + 1, before[0] + 2]  # one apart: a counter
    redis_client.flushdb()  # the store restarted empty
    assert engine.read_version() == 0  # no version: every process reloads once
    after = engine.bump_version()
    assert after > max(before)
    assert engine.bump_version() == after + 1


def test_a_version_kept_by_the_store_counts_on_from_where_it_is(redis_client):
    # a site upgraded from a counter that started at 0 goes on counting from it
    redis_client.set("rl:version", 41)
    assert RedisEngine(redis_client, version_key="rl:version").bump_version() == 42


@pytest.mark.slow
def test_a_flushed_cluster_never_hands_out_a_number_again(cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    engine = ClusterEngine(client, version_key="rl:version", stats=False)
    try:
        first = engine.bump_version()
        client.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        assert engine.bump_version() > first
    finally:
        engine.close()
        client.close()


def test_an_edit_after_a_flush_applies_from_the_next_request(client, make_policy, redis_url,
                                                             clock):
    # the app's clock stands still: the 2 s database check never comes to the rescue
    make_policy(name="p", limit=1000, key="global", path="/hello/")
    assert client.get("/hello/").status_code == 200  # this process: a snapshot of that number
    server = redis.Redis.from_url(redis_url)
    server.flushdb()  # the store restarted empty
    # another process edits the policy and publishes the change, as its commit would
    Policy.objects.filter(name="p").update(limit=1)  # (no signal reaches this process)
    other = RedisEngine(server, version_key=f"{get_config()['KEY_PREFIX']}version")
    other.bump_version()
    # the next request learns the version and reloads: the policy now allows 1
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
