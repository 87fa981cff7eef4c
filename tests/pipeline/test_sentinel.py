"""A real Sentinel failover under traffic: the engine follows the service to its new master."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
import redis
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django_redis.pool import ConnectionFactory

from tests.redis_server import RedisProcess, free_port, server_binary, wait_replicated

SERVICE = "rl-master"


class SentinelProcess:
    """One redis-server in sentinel mode, watching `master_port`."""

    def __init__(self, master_port: int) -> None:
        self.port = free_port()
        self.workdir = tempfile.mkdtemp(prefix="ratelimits-sentinel-")
        config = os.path.join(self.workdir, "sentinel.conf")
        with open(config, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
        self.proc = subprocess.Popen(
            [server_binary(), config, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(port=self.port, socket_timeout=1, decode_responses=True)
        wait_for(lambda: self.master() is not None, "sentinel to start")

    def master(self):
        try:
            _host, port = self.client.sentinel_get_master_addr_by_name(SERVICE)
            return int(port)
        except (redis.RedisError, TypeError):
            return None

    def knows_healthy_replica(self, port: int) -> bool:
        """Sentinel learns of replicas from the master's INFO; it refuses to promote one
        before it has seen it connected with a live link to the master."""
        try:
            replicas = self.client.execute_command("SENTINEL", "REPLICAS", SERVICE)
        except redis.RedisError:
            return False
        for entry in replicas:
            if isinstance(entry, list):  # RESP2 replies are flat name/value lists
                entry = dict(zip(entry[::2], entry[1::2], strict=True))
            fields = entry
            if (
                int(fields.get("port", 0)) == port
                and fields.get("flags") == "slave"
                and fields.get("master-link-status") == "ok"
            ):
                return True
        return False

    def failover(self) -> None:
        """Ask for a failover, retrying while the replica's last report is too fresh."""
        end = time.monotonic() + 30
        while True:
            try:
                self.client.execute_command("SENTINEL", "FAILOVER", SERVICE)
                return
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" not in str(exc) or time.monotonic() > end:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def replicated(replica: redis.Redis) -> bool:
    info = replica.info("replication")
    return info.get("master_link_status") == "up"


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["sync", "async"])
def test_enforcement_follows_a_sentinel_failover(client, make_policy, settings, redis_client,
                                                 stack):
    """Through Django's sync handler (the blocking engine), and through its ASGI handler
    (the asyncio engine's own Sentinel client)."""
    if stack == "sync":
        def get(path):
            return client.get(path).status_code
    else:
        def get(path):
            return async_to_sync(AsyncClient().get)(path).status_code
    master = RedisProcess().start()
    replica = RedisProcess(extra_args=("--replicaof", "127.0.0.1", str(master.port))).start()
    sentinel = None
    try:
        replica_client = redis.Redis(port=replica.port)
        wait_for(lambda: replicated(replica_client), "the replica to sync")
        sentinel = SentinelProcess(master.port)
        # django-redis keeps its pools per URL for the life of the process: a pool of the
        # other variant's (stopped) sentinel would answer "no master" here
        ConnectionFactory._pools.clear()
        settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
        settings.CACHES = {
            **settings.CACHES,
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"redis://{SERVICE}/0",
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.SentinelClient",
                    "SENTINELS": [("127.0.0.1", sentinel.port)],
                },
            },
        }
        # a log over an hour: no window boundary falls inside the failover
        make_policy(name="through-sentinel", algorithm="sliding_log", limit=3, period=3600,
                    path="/hello/", on_error="deny")
        assert [get("/hello/") for _ in range(2)] == [200, 200]
        wait_replicated(redis.Redis(port=master.port))  # the counts reached the replica

        seen = lambda: sentinel.knows_healthy_replica(replica.port)  # noqa: E731
        wait_for(seen, "sentinel to see the replica", 30)
        sentinel.failover()
        wait_for(lambda: sentinel.master() == replica.port, "the failover")
        wait_for(lambda: replica_client.info("replication")["role"] == "master", "promotion")
        # Until Sentinel turns the old master into a replica, both servers take writes: a
        # client still connected to the old one (or told of it by a lagging discovery)
        # counts there, and what it counts is lost. That is Sentinel's window, not the
        # limiter's; the test starts once it has closed.
        old = redis.Redis(port=master.port)
        wait_for(lambda: old.info("replication")["role"] == "slave", "the old master to follow",
                 30)

        statuses = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and 429 not in statuses:
            statuses.append(get("/hello/"))
            time.sleep(0.05)
        assert 500 not in statuses
        # the new master carries the old counts: one more admitted, then refused
        assert [s for s in statuses if s != 503] == [200, 429], statuses
    finally:
        if sentinel is not None:
            sentinel.stop()
        replica.stop()
        master.stop()
