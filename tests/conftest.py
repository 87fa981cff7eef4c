"""Shared fixtures: a real Redis for every test that needs one, never a mock."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisProcess


def _claim(url: str) -> None:
    """Refuse a database that holds data the suite did not write: the suite flushes it."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        size = client.dbsize()
    except redis.RedisError as exc:
        pytest.fail(f"REDIS_URL={url} does not answer ({exc}); unset it to let the tests "
                    "start a redis-server of their own")
    if size:
        pytest.fail(
            f"REDIS_URL={url} holds {size} keys that these tests did not write, and the suite "
            "flushes its database before and after each test. Point REDIS_URL at an empty "
            "database, or unset it: the tests then start a private redis-server."
        )


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A private redis-server for this run (never a developer's own data); `REDIS_URL`
    instead when set, provided its database is empty. Fails (never skips) when neither
    works."""
    url = os.environ.get("REDIS_URL")
    if url:
        _claim(url)
        yield url
        return
    server = RedisProcess().start()  # raises with a clear message when impossible
    os.environ["REDIS_URL"] = server.url
    try:
        yield server.url
    finally:
        os.environ.pop("REDIS_URL", None)
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    """A client on a freshly flushed database."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def private_redis():
    """A redis-server of this test's own (to kill, pause or count commands on)."""
    server = RedisProcess().start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()


@pytest.fixture(scope="module")
def cluster():
    """A real Redis Cluster (3 primaries, 3 replicas) of this test module's own, so a module
    may move its slots or kill its nodes; fails, never skips, when one cannot start."""
    try:
        started = RedisCluster().start()
    except RuntimeError as exc:
        pytest.fail(f"the cluster tests need a Redis Cluster: {exc}")
    try:
        yield started
    finally:
        started.stop()
