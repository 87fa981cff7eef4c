"""A real Sentinel failover under traffic: the engine follows the service to its new master."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
import redis

from tests.redis_server import RedisProcess, free_port

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
            [shutil.which("redis-server"), config, "--sentinel"],
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
def test_enforcement_follows_a_sentinel_failover(client, make_policy, settings, redis_client):
    master = RedisProcess().start()
    replica = RedisProcess(extra_args=("--replicaof", "127.0.0.1", str(master.port))).start()
    sentinel = None
    try:
        replica_client = redis.Redis(port=replica.port)
        wait_for(lambda: replicated(replica_client), "the replica to sync")
        sentinel = SentinelProcess(master.port)
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
        make_policy(name="through-sentinel", limit=3, path="/hello/", on_error="deny")
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 200]
        assert redis.Redis(port=master.port).wait(1, 2000) == 1  # the counts reached the replica

        seen = lambda: sentinel.knows_healthy_replica(replica.port)  # noqa: E731
        wait_for(seen, "sentinel to see the replica", 30)
        sentinel.failover()
        wait_for(lambda: sentinel.master() == replica.port, "the failover")
        wait_for(lambda: replica_client.info("replication")["role"] == "master", "promotion")

        statuses = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and 429 not in statuses:
            statuses.append(client.get("/hello/").status_code)
            time.sleep(0.05)
        assert 500 not in statuses
        # the new master carries the old counts: one more admitted, then refused
        assert [s for s in statuses if s != 503] == [200, 429], statuses
    finally:
        if sentinel is not None:
            sentinel.stop()
        replica.stop()
        master.stop()
