"""A real Redis Cluster for tests: primaries and replicas on free loopback ports.

Each node is a `redis-server --cluster-enabled yes`; `redis-cli --cluster create` joins them
and assigns the slots. Every node needs two free ports: its own and its cluster bus port
(port + 10000). `start()` returns once every node reports `cluster_state:ok` and every
replica has finished its first sync, so a failover is possible from then on.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

BUS_OFFSET = 10000


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int, start: int = 21000, stop: int = 30000) -> list[int]:
    """`count` ports whose bus ports (port + 10000) are free too."""
    ports: list[int] = []
    port = start
    while len(ports) < count and port < stop:
        if _free(port) and _free(port + BUS_OFFSET):
            ports.append(port)
        port += 1
    if len(ports) < count:
        raise RuntimeError(f"could not find {count} free port pairs between {start} and {stop}")
    return ports


@dataclass
class RedisCluster:
    """`primaries` primaries with `replicas` replicas each, killed and removed by `stop()`."""

    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    workdir: str = ""

    @property
    def url(self) -> str:
        """The scheme `RATELIMITS["REDIS_URL"]` takes: any node is a seed for the rest."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self, port: int, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 30.0) -> RedisCluster:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise RuntimeError(
                "a Redis Cluster needs redis-server and redis-cli "
                "(apt-get install redis-server redis-tools)"
            )
        count = self.primaries * (1 + self.replicas)
        self.ports = free_cluster_ports(count)
        self.workdir = tempfile.mkdtemp(prefix="ratelimits-cluster-")
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            self._wait_ping(port, timeout)
        create = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
        )
        if create.returncode != 0:
            self.stop()
            raise RuntimeError(
                f"redis-cli --cluster create failed:\n{create.stdout}{create.stderr}"
            )
        self.wait_ok(timeout)
        return self

    def start_node(self, port: int) -> None:
        """(Re)start the node of `port` with its own config file (so a restart rejoins)."""
        binary = shutil.which("redis-server") or "redis-server"
        self.procs[port] = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir,
             "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_ping(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.client(port)
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"cluster node {port} did not start in {timeout}s")

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and every live replica is in sync."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if all(self._node_ready(p) for p in self.live_ports()):
                    return
            except redis.RedisError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"the cluster did not become ready in {timeout}s {last}")

    def _node_ready(self, port: int) -> bool:
        client = self.client(port)
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        if "cluster_state:ok" not in text:
            return False
        replication = client.info("replication")
        if replication.get("role") == "slave":
            return bool(replication.get("master_link_status") == "up"
                        and not replication.get("master_sync_in_progress"))
        return True

    def primary_ports(self) -> list[int]:
        return [p for p in self.live_ports() if self.client(p).info("replication")["role"]
                == "master"]

    def kill(self, port: int) -> None:
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        self.procs.clear()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""
