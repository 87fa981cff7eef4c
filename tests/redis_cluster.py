"""A real Redis Cluster for tests: primaries and replicas on free loopback ports.

Each node is a `redis-server --cluster-enabled yes`; `redis-cli --cluster create` joins them
and assigns the slots. Every node needs two free ports: its own and its cluster bus port
(port + 10000). `start()` returns once every node reports `cluster_state:ok` and every
replica has finished its first sync, so a failover is possible from then on.

Topology changes for tests: `add_node()` joins an empty primary (for `redis-cli --cluster
reshard` to fill), `move_node()` restarts a node on another port as the same node (its
id and its data kept), `wait_agree()` waits until every node sees every other where it is.

With `tls` (a directory holding ca.crt, server.crt and server.key), every node also speaks
TLS on a port of its own, its cluster bus too (`tls-cluster yes`); a TLS client is told the
nodes' TLS ports, while the plain ports stay open for the fixture's own checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_server import STORE, cli_binary, server_binary

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


@contextlib.contextmanager
def choosing_ports() -> Iterator[None]:
    """Held from choosing a cluster's ports until its nodes listen on them. Test
    processes started together (pytest-xdist's workers) scan the same range: without it,
    two of them may both find a pair free and start nodes on it, and one cluster is then
    made of the other's nodes, or fails to form."""
    with open(Path(tempfile.gettempdir()) / "ratelimits-cluster-ports.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class ClusterNodeView:
    """One line of `CLUSTER NODES`: how one node sees another (or itself: `myself`)."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    link: str
    slots: tuple[str, ...]


_FAILING = frozenset({"fail", "fail?", "handshake", "noaddr"})


def _healthy(view: ClusterNodeView | None, port: int) -> bool:
    return (view is not None and view.port == port and not view.flags & _FAILING
            and (view.link == "connected" or "myself" in view.flags))


@dataclass
class RedisCluster:
    """`primaries` primaries with `replicas` replicas each, killed and removed by `stop()`."""

    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    workdir: str = ""
    #: port -> the name of the node's files (`nodes-<name>.conf`, `dump-<name>.rdb`): the
    #: port it first started on, kept when `move_node()` restarts it on another port
    names: dict[int, str] = field(default_factory=dict)
    tls: Path | None = None
    #: port -> its TLS port (with `tls`)
    tls_ports: dict[int, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The scheme `RATELIMITS["REDIS_URL"]` takes: any node is a seed for the rest."""
        return f"{STORE}+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def tls_url(self) -> str:
        """`url` for a TLS client: the nodes' TLS ports, no options (the caller's)."""
        return f"{STORE}s+cluster://" + ",".join(f"127.0.0.1:{self.tls_ports[p]}"
                                              for p in self.ports)

    def client(self, port: int, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 30.0) -> RedisCluster:
        cli = cli_binary()
        count = self.primaries * (1 + self.replicas)
        self.workdir = tempfile.mkdtemp(prefix="ratelimits-cluster-")
        with choosing_ports():
            self.ports = free_cluster_ports(count)
            for port in self.ports:
                self.start_node(port)
            for port in self.ports:
                self._wait_ping(port, timeout)
        tls = [] if self.tls is None else [
            "--tls", "--cacert", str(self.tls / "ca.crt"),
            "--cert", str(self.tls / "client.crt"), "--key", str(self.tls / "client.key")]
        create = subprocess.run(
            # with TLS, the bus port is the TLS port + 10000: the nodes meet on those
            [cli, *tls, "--cluster", "create",
             *(f"127.0.0.1:{self.tls_ports.get(p, p)}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
        )
        if create.returncode != 0:
            self.stop()
            raise RuntimeError(
                f"redis-cli --cluster create failed:\n{create.stdout}{create.stderr}"
            )
        self.wait_ok(timeout)
        self._wait_replicas_known(timeout)
        return self

    def _wait_replicas_known(self, timeout: float) -> None:
        """Until every node's `CLUSTER NODES` names each replica's primary: the replicas
        are in sync before the gossip has told every node whose replica they are, and a
        test that looks a primary's replicas up must find them."""
        deadline = time.monotonic() + timeout
        wanted = self.primaries * self.replicas
        while time.monotonic() < deadline:
            try:
                if all(sum(v.primary_id is not None for v in self.nodes(p).values()) == wanted
                       for p in self.live_ports()):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the cluster's replicas were not known to every node in {timeout}s")

    def start_node(self, port: int, name: str | None = None) -> None:
        """(Re)start the node of `port` with its own config and data files (so a restart
        rejoins as the same node); `name` names the files of a node moved from elsewhere.
        No automatic snapshots: `move_node()` saves on the way down."""
        binary = server_binary()
        name = self.names[port] = name or self.names.get(port) or str(port)
        self.procs[port] = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir, "--dbfilename", f"dump-{name}.rdb",
             "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{name}.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms),
             # a replica's first sync starts at once, not after Redis's 5 s wait for more
             # replicas to share one transfer
             "--repl-diskless-sync-delay", "0", *self._tls_args(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _tls_args(self, port: int) -> list[str]:
        if self.tls is None:
            return []
        if port not in self.tls_ports:
            taken = {*self.ports, *self.tls_ports.values()}
            self.tls_ports[port] = next(p for p in range(port + 1000, port + 2000)
                                        if p not in taken and _free(p)
                                        and _free(p + BUS_OFFSET))
        return ["--tls-port", str(self.tls_ports[port]), "--tls-cluster", "yes",
                "--tls-auth-clients", "yes",
                "--tls-cert-file", str(self.tls / "server.crt"),
                "--tls-key-file", str(self.tls / "server.key"),
                "--tls-ca-cert-file", str(self.tls / "ca.crt")]

    def _wait_ping(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # no retries: redis-py's default backs off for seconds after a refused connection
        client = self.client(port, retry=Retry(NoBackoff(), 0))
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

    def node_id(self, port: int) -> str:
        raw = self.client(port).execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def nodes(self, port: int) -> dict[str, ClusterNodeView]:
        """What the node on `port` knows of every node (`CLUSTER NODES`), by node id."""
        raw = self.client(port).execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        out: dict[str, ClusterNodeView] = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            address = parts[1].split("@")[0]
            out[parts[0]] = ClusterNodeView(
                node_id=parts[0], port=int(address.rsplit(":", 1)[1] or 0),
                flags=frozenset(parts[2].split(",")),
                primary_id=None if parts[3] == "-" else parts[3],
                link=parts[7], slots=tuple(parts[8:]),
            )
        return out

    def wait_agree(self, timeout: float = 30.0) -> None:
        """Until every live node knows every live node at its current port, linked and
        without a failure flag, and `wait_ok()` holds."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                live = {self.node_id(p): p for p in self.live_ports()}
                views = {p: self.nodes(p) for p in live.values()}
                last = next((f"{p} sees {v.get(i)}" for p, v in views.items()
                             for i, q in live.items() if not _healthy(v.get(i), q)), "")
                if not last:
                    break
            except redis.RedisError as exc:
                last = str(exc)
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the cluster's nodes did not agree in {timeout}s: {last}")
        self.wait_ok(max(0.1, deadline - time.monotonic()))

    def add_node(self, timeout: float = 30.0) -> int:
        """Start an empty node and join it as a primary without slots (`redis-cli
        --cluster add-node`); returns its port once every node knows it."""
        cli = cli_binary()
        seed = self.primary_ports()[0]
        port = self._start_elsewhere(None, timeout)
        self.ports.append(port)
        add = subprocess.run(
            [cli, "--cluster", "add-node", f"127.0.0.1:{port}", f"127.0.0.1:{seed}"],
            capture_output=True, text=True, timeout=timeout,
        )
        if add.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster add-node failed:\n{add.stdout}{add.stderr}")
        self.wait_agree(timeout)
        return port

    def move_node(self, port: int, timeout: float = 30.0) -> int:
        """Restart the node of `port` on a new port, as the same node; returns the new port
        as soon as the node answers there. The other nodes learn the address from its
        gossip (`wait_agree()` waits for that).

        The way down keeps every answered write: `CLIENT PAUSE WRITE` (writes already run
        are answered, later ones wait unrun), then `SHUTDOWN SAVE NOW` (the data saved,
        without Redis's wait for replicas to acknowledge, which takes seconds). The node
        comes back with its own config file (its node id, its view of the cluster) and
        its data."""
        name = self.names[port]
        # no retries: the dropped connection is the answer (redis-py retries it for seconds)
        with contextlib.closing(redis.Redis(port=port, socket_timeout=timeout,
                                            retry=Retry(NoBackoff(), 0))) as client:
            client.client_pause(int(timeout * 1000), all=False)
            client.shutdown(save=True, now=True)  # returns once the connection dropped
        proc = self.procs.pop(port)
        proc.wait(timeout=timeout)
        del self.names[port]
        new = self._start_elsewhere(name, timeout)
        self.ports[self.ports.index(port)] = new
        return new

    def _start_elsewhere(self, name: str | None, timeout: float) -> int:
        """Start a node on a free port pair and return the port once it answers there.
        The pair is looked for from a random place in the range (clusters of test runs
        in parallel all scan from its bottom); when another process binds the port first,
        this node exits and the next pair is tried."""
        for _ in range(5):
            with choosing_ports():
                port = free_cluster_ports(1, start=random.randrange(21000, 29000))[0]
                self.start_node(port, name)
                if self._answers(port, timeout):
                    return port
            del self.procs[port], self.names[port]
        raise RuntimeError("could not start a cluster node: every port tried was taken")

    def _answers(self, port: int, timeout: float) -> bool:
        """Whether the node started on `port` answers there (this process, not another
        one on that port); False once it has exited."""
        proc = self.procs[port]
        deadline = time.monotonic() + timeout
        client = self.client(port, retry=Retry(NoBackoff(), 0))
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if client.info("server")["process_id"] == proc.pid:
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"cluster node {port} did not start in {timeout}s")

    def kill(self, port: int) -> None:
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        self.procs.clear()
        self.names.clear()
        self.tls_ports.clear()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""
