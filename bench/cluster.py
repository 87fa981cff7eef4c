"""Redis Cluster beside one Redis, in one run: engine decisions per second from Python.

    .venv/bin/python bench/cluster.py [--seconds 2]

Starts a private redis-server and a private cluster (3 primaries, 3 replicas, from
tests/redis_cluster.py), then times synchronous `evaluate()` calls on one thread for 1
and 3 limits (sliding_log, large limits so every call charges). With 3 limits, the
cluster engine's keys sit on three different primaries, so each call fans out to three
nodes at once. Prints decisions/s and each cluster row's ratio to one Redis measured in
the same run. On a 2-core machine seven redis-servers share the cores: this shows the
cost per call, not what a cluster of real machines carries.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.cluster

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.keys import base_key
from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisProcess

BIG = 10**9


def spread_limits(client: redis.cluster.RedisCluster, n: int) -> list[Limit]:
    """`n` limits of one client whose keys sit on `n` different primaries."""
    chosen: list[Limit] = []
    nodes: set[str] = set()
    i = 0
    while len(chosen) < n:
        limit = Limit("203.0.113.7", "sliding_log", BIG, 60, name=f"policy-{i}")
        node = client.get_node_from_key(base_key("rl:", limit)).name
        if node not in nodes:
            nodes.add(node)
            chosen.append(limit)
        i += 1
    return chosen


def rate(engine: object, limits: list[Limit], seconds: float) -> float:
    evaluate = engine.evaluate  # type: ignore[attr-defined]
    for _ in range(200):  # warm up: scripts loaded, connections open
        evaluate(limits)
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            evaluate(limits)
        calls += 50
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    seconds = parser.parse_args().seconds
    server = RedisProcess().start()
    cluster = RedisCluster().start()
    try:
        single = RedisEngine(redis.Redis.from_url(server.url))
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        engine = ClusterEngine(client)
        print(f"{'limits':>6}  {'one Redis /s':>12}  {'cluster /s':>10}  {'cluster/one':>11}")
        for n in (1, 3):
            limits = spread_limits(client, n)
            one = rate(single, limits, seconds)
            many = rate(engine, limits, seconds)
            print(f"{n:>6}  {one:>12,.0f}  {many:>10,.0f}  {many / one:>11.2f}")
        engine.close()
    finally:
        cluster.stop()
        server.stop()


if __name__ == "__main__":
    main()
