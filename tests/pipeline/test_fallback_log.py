"""What an operator is told when requests are decided by `on_error`, and the default
timeouts that decide when that happens, against a real redis-server: paused
(`SIGSTOP`: it accepts connections and never answers) or slow (`CLIENT PAUSE`: it holds
every reply for a while, as a busy machine or a fork for a snapshot does)."""

from __future__ import annotations

import logging
import signal
import time

import pytest
import redis

from ratelimits.conf import SETTINGS
from ratelimits.pipeline.report import FALLBACK_LOG_EVERY

#: The app's default reply timeout: what a site that sets none runs with.
DEFAULT_TIMEOUT = SETTINGS["SOCKET_TIMEOUT"].default


@pytest.fixture
def server(private_redis, settings):
    """The engine on a private server, with the default timeouts (the suite's settings
    lengthen the connect timeout only: a paused server still accepts connections)."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    assert "SOCKET_TIMEOUT" not in settings.RATELIMITS
    return private_redis


def fallback_lines(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.levelno == logging.WARNING and getattr(r, "ratelimits_policy", None) == name]


def test_a_paused_store_is_logged_once_per_policy_then_with_the_count_held_back(
    client, make_policy, server, clock, caplog
):
    make_policy(name="paused-allow", limit=50, path="/hello/", on_error="allow")
    make_policy(name="paused-local", limit=50, path="/hello/", on_error="local")
    make_policy(name="paused-shadow", mode="shadow", limit=50, path="/hello/",
                on_error="deny")
    assert client.get("/hello/").status_code == 200  # the store answers, nothing logged
    server.proc.send_signal(signal.SIGSTOP)
    try:
        with caplog.at_level(logging.DEBUG, "ratelimits"):
            statuses = [client.get("/hello/").status_code for _ in range(20)]
            assert statuses == [200] * 20
            first = {name: fallback_lines(caplog, name)
                     for name in ("paused-allow", "paused-local", "paused-shadow")}
            # a minute later in this process's clock: the next line carries the count
            clock.advance(FALLBACK_LOG_EVERY)
            assert client.get("/hello/").status_code == 200
    finally:
        server.proc.send_signal(signal.SIGCONT)

    assert {name: len(lines) for name, lines in first.items()} == {
        "paused-allow": 1, "paused-local": 1, "paused-shadow": 1}
    allow, local, shadow = (first[n][0].getMessage() for n in first)
    assert allow.startswith("ratelimits: policy paused-allow decided by its on_error=allow: "
                            "the store did not answer (")
    assert "Timeout" in allow  # the cause: the reply timed out
    assert allow.endswith("so it admitted the request, uncounted")
    assert local.endswith("so it decided the request in this process, with its share of "
                          "the limit")
    assert shadow.endswith("so it admitted the request: in shadow (or outside its rollout) a "
                           "policy never refuses, whatever its on_error")

    (later,) = fallback_lines(caplog, "paused-allow")[1:]
    assert later.ratelimits_held_back == 19
    assert later.getMessage().endswith(
        f"(19 more such requests in the {FALLBACK_LOG_EVERY:.0f} s since the last "
        "line about it)")


def test_no_line_while_the_store_answers(client, make_policy, server, caplog):
    make_policy(name="answered", limit=1, path="/hello/", on_error="allow")
    with caplog.at_level(logging.DEBUG, "ratelimits"):
        assert [client.get("/hello/").status_code for _ in range(3)] == [200, 429, 429]
    assert fallback_lines(caplog, "answered") == []


def test_the_default_timeout_outlasts_a_slow_reply(client, make_policy, server, caplog):
    """A reply held back 200 ms (the server paused by `CLIENT PAUSE` from a second
    connection, as a saturated machine delays it) is still the store's answer: the limit
    is kept, not handed to on_error="allow"."""
    make_policy(name="slow", limit=1, path="/hello/", on_error="allow")
    assert client.get("/hello/").status_code == 200  # the one request of the limit

    other = redis.Redis.from_url(server.url)
    held = 0.2
    assert held * 2 <= DEFAULT_TIMEOUT  # a margin for a loaded machine
    with caplog.at_level(logging.DEBUG, "ratelimits"):
        other.execute_command("CLIENT", "PAUSE", int(held * 1000), "ALL")
        began = time.monotonic()
        status = client.get("/hello/").status_code
        took = time.monotonic() - began
    assert status == 429, f"the store's refusal was lost to the timeout ({took:.3f} s)"
    assert took >= held * 0.75  # the reply was held back indeed
    assert fallback_lines(caplog, "slow") == []
    assert "store is unavailable" not in caplog.text


def failing_key(request):
    """A key function of the site's that fails on every request (a `call:` key)."""
    raise LookupError("no tenant header")


def test_a_key_function_that_fails_is_logged_once_per_policy_then_with_the_count(
    client, make_policy, clock, caplog
):
    make_policy(name="tenants", limit=50, path="/hello/", on_error="allow",
                key="call:tests.pipeline.test_fallback_log.failing_key")
    with caplog.at_level(logging.DEBUG, "ratelimits"):
        assert [client.get("/hello/").status_code for _ in range(5)] == [200] * 5
        clock.advance(FALLBACK_LOG_EVERY)
        assert client.get("/hello/").status_code == 200
    lines = [r.getMessage() for r in caplog.records
             if r.levelno == logging.ERROR and "could not identify" in r.getMessage()]
    first = ("ratelimits: policy tenants could not identify the client on /hello/ "
             "(tests.pipeline.test_fallback_log.failing_key raised LookupError: no tenant "
             "header); on_error=allow")
    assert lines == [first, first + f" (4 more such requests in the "
                     f"{FALLBACK_LOG_EVERY:.0f} s since the last line about it)"]
