"""The live instance count: each process beats in the store now and then, on calls it
makes anyway, and `on_error="local"` divides a shared limit by the last count learnt."""

from __future__ import annotations

import redis

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.heartbeat import BEAT_EVERY, LIVE_TTL, Heartbeat


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beating(client: redis.Redis, clock: ManualClock) -> RedisEngine:
    """An engine as the request path builds it, its beats timed by `clock`."""
    engine = RedisEngine(client, prefix="t:", version_key="t:version", live_key="t:live")
    assert engine.heartbeat is not None
    engine.heartbeat.clock = clock
    return engine


LIMIT = Limit("client", "fixed_window", 100, 60, name="p")


def commands(client: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"]
            for k, v in client.info("commandstats").items()}


def test_processes_count_each_other_and_drop_out_after_the_ttl(private_redis):
    client = redis.Redis.from_url(private_redis.url)
    clock = ManualClock()
    a, b, c = (beating(client, clock) for _ in range(3))
    a.evaluate([LIMIT], now=1000.0)
    b.evaluate([LIMIT], now=1000.5)
    c.read_version(now=1001.0)
    assert (a.live_instances, b.live_instances, c.live_instances) == (1, 2, 3)
    clock.now += BEAT_EVERY
    a.evaluate([LIMIT], now=1003.0)
    assert a.live_instances == 3
    clock.now += BEAT_EVERY
    # b and c stop; a keeps beating: they drop out once their last beat is LIVE_TTL old
    a.evaluate([LIMIT], now=1000.5 + LIVE_TTL + 0.1)
    assert a.live_instances == 2  # b's beat is older than the TTL, c's is not yet
    clock.now += BEAT_EVERY
    a.evaluate([LIMIT], now=1001.0 + LIVE_TTL + 0.1)
    assert a.live_instances == 1
    assert 0 < client.ttl("t:live") <= LIVE_TTL  # the set itself leaves with the last one


def test_a_beat_rides_on_a_call_at_most_every_few_seconds(private_redis):
    client = redis.Redis.from_url(private_redis.url)
    clock = ManualClock()
    engine = beating(client, clock)
    engine.evaluate([LIMIT])  # the first beat (and the scripts' first load)
    before = commands(client)
    for _ in range(20):
        engine.evaluate([LIMIT])
    after = commands(client)
    assert after["fcall"] - before["fcall"] == 20  # one call each, no beat among them
    assert after.get("zadd", {}) == before.get("zadd", {})
    clock.now += BEAT_EVERY
    engine.evaluate([LIMIT])
    assert commands(client)["zadd"] == before["zadd"] + 1


def test_a_fork_beats_as_a_new_process(monkeypatch):
    beat = Heartbeat("k", clock=ManualClock())
    assert beat.due()
    parent = beat.member()
    assert not beat.due()
    monkeypatch.setattr("os.getpid", lambda: 999_999)
    assert beat.due()  # a child does not wait out its parent's interval
    assert beat.member() != parent


def test_the_local_fallback_takes_a_share_of_the_live_count(
    client, make_policy, private_redis, settings
):
    """INSTANCES says 1, four processes are live: each takes a quarter while cut off."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    direct = redis.Redis.from_url(private_redis.url)
    make_policy(name="shared", limit=8, path="/hello/", on_error="local")
    for _ in range(3):  # three other processes beat
        RedisEngine(direct, prefix="tests-rl:", live_key="tests-rl:live").evaluate([LIMIT])
    assert client.get("/hello/").status_code == 200  # this one beats: four live
    from ratelimits.pipeline.engines import get_engine

    assert get_engine().live_instances == 4
    private_redis.stop()
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]


def test_instances_stands_until_the_first_contact(client, make_policy, settings):
    from tests.redis_server import free_port

    make_policy(name="shared", limit=8, path="/hello/", on_error="local")
    client.get("/login/")  # the snapshot, loaded while the fixture's store answers
    settings.RATELIMITS = {**settings.RATELIMITS, "INSTANCES": 2}
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    assert [client.get("/hello/").status_code for _ in range(5)] == [200] * 4 + [429]


def test_a_cluster_counts_processes_and_reads_the_version(cluster):
    import redis.cluster

    from ratelimits.engine.cluster import ClusterEngine

    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    clock = ManualClock()
    engines = [ClusterEngine(client, prefix="lv:", version_key="lv:version",
                             live_key="lv:live", stats=False) for _ in range(2)]
    for engine in engines:
        assert engine.heartbeat is not None
        engine.heartbeat.clock = clock
    engines[0].evaluate([LIMIT, Limit("other", "gcra", 5, 1)])
    assert engines[1].read_version() == 0
    assert [e.live_instances for e in engines] == [1, 2]
    client.incr("lv:version")
    assert engines[0].read_version() == 1
    assert engines[0].live_instances == 1  # no beat due: the count is the last one learnt
    clock.now += BEAT_EVERY
    engines[0].evaluate([LIMIT])
    assert engines[0].live_instances == 2
