"""Redis deployment modes are one table: each scheme is read by its mode's parser, the
messages list every mode, and a cache alias's client is told apart by its pool."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import redis
from redis.sentinel import Sentinel

from ratelimits.engine.deployments import (
    DEPLOYMENTS,
    async_twin_client,
    deployment,
    deployment_of,
    limiter_client,
    parse_redis_url,
)

EXAMPLES = {
    "redis": "redis://h:6379/0",
    "rediss": "rediss://h:6380/1",
    "unix": "unix:///run/redis.sock",
    "redis+cluster": "redis+cluster://a:7000,b:7001",
    "rediss+cluster": "rediss+cluster://a:7000",
    "valkey": "valkey://h:6379/0",
    "valkeys": "valkeys://h:6380/1",
    "valkey+cluster": "valkey+cluster://a:7000,b:7001",
    "valkeys+cluster": "valkeys+cluster://a:7000",
}


@pytest.mark.parametrize(("scheme", "url"), EXAMPLES.items())
def test_each_scheme_is_read_by_the_mode_that_declares_it(scheme, url):
    parsed = parse_redis_url(url)
    mode = deployment(parsed)
    assert scheme in mode.schemes and mode.parse is not None and mode.connect is not None


def test_every_scheme_of_the_table_has_an_example_and_the_message_lists_them():
    schemes = {s for mode in DEPLOYMENTS.values() for s in mode.schemes}
    assert schemes == set(EXAMPLES)
    with pytest.raises(ValueError) as info:
        parse_redis_url("memcached://h")
    for mode in DEPLOYMENTS.values():
        for scheme in mode.schemes:
            assert f"{scheme}://" in str(info.value)


def test_a_cache_aliass_client_is_a_server_or_a_sentinel_by_its_pool():
    plain = limiter_client(redis.Redis(host="h", port=1), 0.1, 0.1)
    assert deployment_of(plain).name == "server"
    watched = Sentinel([("127.0.0.1", 1)]).master_for("svc")  # connects on first command
    sentinel = limiter_client(watched, 0.1, 0.1)
    assert deployment_of(sentinel).name == "sentinel"
    assert sentinel.connection_pool.service_name == "svc"
    assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 0.1


class HangingUp:
    """A TCP server that accepts each connection and closes it at once: a sentinel that
    is there and answers nothing. It counts the connections it was asked for."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            conn.close()


@pytest.mark.parametrize("stack", ["blocking", "async"])
def test_the_limiter_asks_a_failing_sentinel_once_without_retrying(stack):
    """The cache's Sentinel manager keeps redis-py's default retries with backoff (seconds
    per call); the limiter's own asks each sentinel once and lets the policy decide."""
    sentinel = HangingUp()
    try:
        watched = Sentinel([("127.0.0.1", sentinel.port)]).master_for("svc")
        limiter = limiter_client(watched, 0.5, 0.5)
        with pytest.raises(redis.RedisError):
            if stack == "blocking":
                limiter.ping()
            else:
                asyncio.run(async_twin_client(limiter).ping())
        assert sentinel.accepted == 1
    finally:
        sentinel.listener.close()
