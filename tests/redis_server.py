"""Start and stop private redis-server processes for tests that need their own server.

`RATELIMITS_TEST_STORE=valkey` runs the suite's servers, clusters and sentinels on
Valkey instead (`valkey-server`, `valkey-cli`): `make test-valkey`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The server the suite runs on: "redis" (redis-server, redis-cli) or "valkey".
STORE = os.environ.get("RATELIMITS_TEST_STORE", "redis")
if STORE not in ("redis", "valkey"):
    raise RuntimeError(f"RATELIMITS_TEST_STORE={STORE!r}: use redis or valkey")
#: Its server and command-line client, found on PATH.
SERVER = f"{STORE}-server"
CLI = f"{STORE}-cli"
_INSTALL = {"redis": "apt-get install redis-server redis-tools",
            "valkey": "apt-get install -t bookworm-backports valkey-server valkey-tools"}


def server_binary() -> str:
    """The path of the suite's server binary; fails with how to install it."""
    binary = shutil.which(SERVER)
    if binary is None:
        raise RuntimeError(f"the tests need {SERVER} on PATH ({_INSTALL[STORE]})")
    return binary


def cli_binary() -> str:
    """The path of the suite's command-line client; fails with how to install it."""
    cli = shutil.which(CLI)
    if cli is None:
        raise RuntimeError(f"the tests need {CLI} on PATH ({_INSTALL[STORE]})")
    return cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisProcess:
    """A redis-server on a free loopback port, killed and cleaned up by `stop()`."""

    port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    workdir: str = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisProcess:
        binary = server_binary()
        if not self.workdir:
            self.workdir = tempfile.mkdtemp(prefix="ratelimits-redis-")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.workdir,
                # a replica's first sync starts at once, not after Redis's 5 s wait for
                # more replicas to share one transfer
                "--repl-diskless-sync-delay",
                "0",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # no retries: redis-py's default backs off for seconds after a refused connection,
        # where the server is a few milliseconds from listening
        client = redis.Redis(port=self.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start in {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""


_SETNAME_LINE = re.compile(
    r'^[\d.]+ \[\d+ (?P<client>[^\]]+)\] "(?i:client)" "(?i:setname)" "(?P<name>[^"]*)"'
)
_MONITOR_LINE = re.compile(
    r'^(?P<at>[\d.]+) \[\d+ (?P<client>[^\]]+)\] "(?P<cmd>[^"]+)"(?: "(?P<sha>[^"]*)")?'
)


def wait_replicated(primary: redis.Redis, timeout: float = 10.0) -> None:
    """Return once a replica of `primary` has acknowledged everything written to it so far.

    `WAIT` cannot say this for another connection's writes: it waits for the offset of
    the calling connection's own last write, and a connection that wrote nothing waits for
    none. A replica's first writes after its initial sync also reach it only once it first
    acknowledges (within a second), so "link up" is not "caught up" either. The primary's
    offset now, against the offsets its replicas acknowledged, is.
    """
    target = primary.info("replication")["master_repl_offset"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = primary.info("replication")
        for name, replica in info.items():
            if (name.startswith("slave") and isinstance(replica, dict)
                    and replica.get("state") == "online" and replica["offset"] >= target):
                return
        time.sleep(0.05)
    raise AssertionError(f"no replica acknowledged offset {target} within {timeout}s")


def script_calls(client: redis.Redis) -> int:
    """Scripts and functions the server has run since its stats were last reset: the
    batch decisions (FCALL) and the other scripts (EVALSHA) together."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("evalsha", "fcall"))


def sha(source: str) -> str:
    """The SHA1 a script of this source runs under (what EVALSHA names)."""
    return hashlib.sha1(source.encode()).hexdigest()


class Monitor:
    """`redis-cli monitor` into a file: every command a server ran, when and from which
    connection. INFO commandstats counts EVALSHA calls of every script together; this
    tells the scripts apart by their SHA, and functions by their name."""

    def __init__(self, port: int, path: Path) -> None:
        self.path = path
        self.out = path.open("w")
        self.proc = subprocess.Popen([cli_binary(), "-p", str(port), "monitor"], stdout=self.out)
        time.sleep(0.2)  # MONITOR is on before the first command to watch

    def names(self, client: redis.Redis) -> dict[str, str]:
        """Each connection's name (`CLIENT SETNAME`): those open now, and those that
        named themselves while the monitor watched (a connection opened and closed)."""
        names = {c["addr"]: c["name"] for c in client.client_list() if c.get("name")}
        for line in self.path.read_text().splitlines():
            m = _SETNAME_LINE.match(line)
            if m:
                names[m["client"]] = m["name"]
        return names

    def scripts(self, of: str, since: float = 0.0,
                until: float = float("inf")) -> list[tuple[float, str]]:
        """Stop watching; (time, client) of each run of the script whose SHA is `of`, or
        of the function named `of`."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
            self.out.close()
        out = []
        for line in self.path.read_text().splitlines():
            m = _MONITOR_LINE.match(line)
            if m and m["cmd"].upper() in ("EVALSHA", "FCALL") and m["sha"] == of \
                    and since <= float(m["at"]) <= until:
                out.append((float(m["at"]), m["client"]))
        return out
