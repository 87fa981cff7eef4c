"""The suite never touches data it did not write: its own redis-server by default, and a
given REDIS_URL only when that database is empty."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from tests.redis_server import RedisProcess

# each test runs pytest in a process of its own (and one starts a redis-server)
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_one_redis_test(env_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if env_url is not None:
        env["REDIS_URL"] = env_url
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/engine/test_redis.py::test_script_flush_is_survived"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_database_holding_other_data_is_refused_and_kept():
    server = RedisProcess().start()
    try:
        client = redis.Redis(port=server.port)
        client.set("someone:else", "precious")
        run = _run_one_redis_test(server.url)
        assert run.returncode != 0
        assert "holds 1 keys that these tests did not write" in run.stdout
        assert client.get("someone:else") == b"precious"
        assert client.dbsize() == 1
    finally:
        server.stop()


def test_without_redis_url_the_suite_leaves_the_local_server_alone():
    """A developer's own server on the default port keeps its data through a run."""
    local = redis.Redis(port=6379, socket_timeout=1, socket_connect_timeout=1)
    try:
        local.set("ratelimits-tests:canary", "keep", ex=300)
    except redis.RedisError:
        local = None  # nothing listens there: the run must still find a server of its own
    run = _run_one_redis_test(None)
    assert run.returncode == 0, run.stdout + run.stderr
    if local is not None:
        assert local.get("ratelimits-tests:canary") == b"keep"
        local.delete("ratelimits-tests:canary")
