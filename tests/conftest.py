"""Shared fixtures: a real Redis for every test that needs one, never a mock."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from tests.redis_server import RedisProcess

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """`REDIS_URL`, else the local server, else a private redis-server; fails if none works."""
    url = os.environ.get("REDIS_URL", DEFAULT_URL)
    if _answers(url):
        os.environ["REDIS_URL"] = url
        yield url
        return
    server = RedisProcess().start()  # raises with a clear message when impossible
    os.environ["REDIS_URL"] = server.url
    try:
        yield server.url
    finally:
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
