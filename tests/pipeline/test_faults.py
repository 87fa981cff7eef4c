"""Redis killed, paused, restarted, flushed or read-only under traffic: never a 500, never a hang.

Each test runs its own redis-server and drives real requests through the middleware.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

import pytest
import redis
from django.test import override_settings

from ratelimits.engine.errors import CircuitOpen, EngineUnavailable
from ratelimits.engine.local_first import HOLD
from ratelimits.pipeline.changes import listener
from ratelimits.pipeline.engines import get_engine
from ratelimits.testing import Clock
from tests.redis_server import RedisProcess

#: Generous bounds for a loaded 2-core CI machine; the default timeouts are 0.5 s.
WORST_ALLOWED = 1.5
COOLDOWN = 0.3


@pytest.fixture
def server(private_redis, settings, clock):
    """Point the engine at a private server, with a short breaker cool-down, on a clock
    the test moves: a cool-down ends when the test says so."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    settings.RATELIMITS = {**settings.RATELIMITS, "BREAKER_COOLDOWN": COOLDOWN}
    return private_redis


def timed(client, path: str, n: int) -> tuple[list[int], float]:
    """Statuses of n requests and the slowest one's latency in seconds."""
    statuses, worst = [], 0.0
    for _ in range(n):
        start = time.perf_counter()
        statuses.append(client.get(path).status_code)
        worst = max(worst, time.perf_counter() - start)
    return statuses, worst


def until_enforced(
    client, path: str, admitted: int, clock: Clock, deadline: float = 10.0
) -> list[int]:
    """Requests until Redis decides again: `admitted` passes, then a refusal.

    The breaker probes after its cool-down, so the first requests may still fall back.
    """
    statuses: list[int] = []
    tail = [200] * admitted + [429]
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        statuses.append(client.get(path).status_code)
        if statuses[-len(tail) :] == tail:
            return statuses
        clock.advance(COOLDOWN)  # the cool-down ends: the next request probes
        time.sleep(0.05)  # the restarted server, a real process, comes up meanwhile
    pytest.fail(f"enforcement did not resume: {statuses}")


def restart(server: RedisProcess) -> RedisProcess:
    server.stop()
    return RedisProcess(port=server.port).start()


EXPECTED = {
    "allow": [200] * 8,
    "deny": [503] * 8,
    "local": [200, 200, 200, 429, 429, 429, 429, 429],
}


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
def test_killed_server_answers_per_on_error_then_resumes(
    client, make_policy, server, on_error, caplog, clock
):
    make_policy(name=f"killed-{on_error}", limit=3, path="/hello/", on_error=on_error)
    assert timed(client, "/hello/", 2)[0] == [200, 200]

    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(5)
    with caplog.at_level(logging.ERROR, "ratelimits"):
        statuses, worst = timed(client, "/hello/", 8)
    assert statuses == EXPECTED[on_error]
    print(f"\nkilled, on_error={on_error}: worst latency {worst * 1000:.1f} ms")
    assert worst < WORST_ALLOWED
    # logged once for the outage, not once per request
    assert caplog.text.count("store is unavailable") == 1
    if on_error == "deny":
        assert client.get("/hello/")["Retry-After"] == "1"

    fresh = restart(server)
    try:
        # an empty server: new counters, no script (NOSCRIPT reload), no version key
        until_enforced(client, "/hello/", admitted=3, clock=clock)
    finally:
        fresh.stop()


@pytest.mark.slow
def test_paused_server_never_holds_a_request_past_the_timeout(
    client, make_policy, server, clock
):
    make_policy(name="paused", limit=3, path="/hello/", on_error="allow")
    assert timed(client, "/hello/", 1)[0] == [200]
    server.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
    try:
        statuses, worst = timed(client, "/hello/", 10)
        assert statuses == [200] * 10
        print(f"\npaused: worst latency {worst * 1000:.1f} ms")
        assert worst < WORST_ALLOWED
        # once the breaker is open, requests do not even try the socket
        fast, fast_worst = timed(client, "/hello/", 10)
        assert fast == [200] * 10 and fast_worst < 0.05
        print(f"paused, breaker open: worst latency {fast_worst * 1000:.1f} ms")
    finally:
        server.proc.send_signal(signal.SIGCONT)
    until_enforced(client, "/hello/", admitted=2, clock=clock)  # the paused server kept its count


@pytest.mark.slow
def test_script_flush_and_flushall_mid_traffic(client, make_policy, server, clock):
    make_policy(name="flushed", limit=2, path="/hello/")
    direct = redis.Redis.from_url(server.url)
    assert timed(client, "/hello/", 1)[0] == [200]
    deadline = time.monotonic() + 5  # a process serving for a while: it listens
    while listener.watch is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    direct.script_flush()
    assert timed(client, "/hello/", 2)[0] == [200, 429]
    direct.flushall()  # counters and the policy version are gone
    # this process hears the flush and drops the refusal it remembers: the store, which
    # has forgotten the client, decides again, though the clock stands still (before, the
    # refusal answered until the clock passed HOLD)
    statuses: list[int] = []
    deadline = time.monotonic() + 5 * HOLD
    while statuses[-3:] != [200, 200, 429] and time.monotonic() < deadline:
        statuses += timed(client, "/hello/", 1)[0]
        time.sleep(0.01)
    assert statuses[-3:] == [200, 200, 429], statuses


@pytest.mark.slow
@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 503)])
def test_read_only_replica_after_failover(
    client, make_policy, private_redis, settings, on_error, status
):
    replica = RedisProcess(extra_args=("--replicaof", "127.0.0.1", str(private_redis.port))).start()
    try:
        make_policy(name=f"ro-{on_error}", limit=1, path="/hello/", on_error=on_error)
        settings.CACHES = {
            **settings.CACHES,
            "default": {**settings.CACHES["default"], "LOCATION": replica.url},
        }
        statuses, worst = timed(client, "/hello/", 3)
        assert statuses == [status] * 3
        assert worst < WORST_ALLOWED
    finally:
        replica.stop()


def test_engine_client_has_the_limiter_timeouts_not_the_caches(settings):
    from ratelimits.pipeline.engines import get_engine

    settings.RATELIMITS = {**settings.RATELIMITS, "SOCKET_TIMEOUT": 0.05, "CONNECT_TIMEOUT": 0.02}
    with override_settings():
        kwargs = get_engine().client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.05, 0.02)
    assert kwargs["retry"].get_retries() == 0


def test_local_fallback_takes_this_instances_share(client, make_policy, settings):
    from tests.redis_server import free_port

    make_policy(name="shared", limit=4, path="/hello/", on_error="local")
    client.get("/login/")  # load the snapshot while the store answers
    settings.RATELIMITS = {**settings.RATELIMITS, "INSTANCES": 2}
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    assert timed(client, "/hello/", 4)[0] == [200, 200, 429, 429]


def test_local_share_never_drops_below_one_request():
    from ratelimits.engine import Limit
    from ratelimits.pipeline.fallback import local_share

    assert local_share(Limit("c", "fixed_window", 100, 1), 2).limit == 50
    assert local_share(Limit("c", "gcra", 100, 1, burst=10), 3).burst == 4
    assert local_share(Limit("c", "fixed_window", 3, 1, cost=2), 4).limit == 2
    assert local_share(Limit("c", "leaky_bucket", 9, 1, burst=1), 4).burst == 1
    # a batch above the share would make no valid limit: it is cut to the share
    assert local_share(Limit("c", "fixed_window", 30, 1, batch=10), 4).batch == 8
    assert local_share(Limit("c", "fixed_window", 30, 1, batch=5), 4).batch == 5


@pytest.mark.slow
@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 503)])
def test_a_server_busy_with_a_script_is_out_of_reach(
    client, make_policy, settings, on_error, status, caplog, clock
):
    # another client's script runs past the busy threshold: the server answers every other
    # call with BUSY (in Redis's words or Valkey's) until it ends or is killed
    busy = RedisProcess(extra_args=("--busy-reply-threshold", "50")).start()
    runner = None
    try:
        settings.CACHES = {
            **settings.CACHES,
            "default": {**settings.CACHES["default"], "LOCATION": busy.url},
        }
        settings.RATELIMITS = {**settings.RATELIMITS, "BREAKER_COOLDOWN": COOLDOWN}
        make_policy(name=f"busy-{on_error}", limit=2, path="/hello/", on_error=on_error)
        assert timed(client, "/hello/", 1)[0] == [200]
        direct = redis.Redis.from_url(busy.url, socket_timeout=5)
        runner = threading.Thread(target=_spin, args=(busy.url,), daemon=True)
        runner.start()
        _wait_busy(direct)
        with pytest.raises(EngineUnavailable) as raised:  # the store out of reach, by code
            get_engine().read_version()
        assert not isinstance(raised.value, CircuitOpen)  # the server's own answer
        with caplog.at_level(logging.WARNING, "ratelimits"):
            statuses, worst = timed(client, "/hello/", 5)
        assert statuses == [status] * 5
        assert worst < WORST_ALLOWED
        # an outage, said once, not an error of the call logged per request
        assert caplog.text.count("store is unavailable") == 1
        direct.script_kill()
        runner.join(5)
        clock.advance(COOLDOWN)
        until_enforced(client, "/hello/", admitted=1, clock=clock)  # the count was kept
    finally:
        if runner is not None and runner.is_alive():
            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(busy.url, socket_timeout=5).script_kill()
        busy.stop()


def _spin(url: str) -> None:
    """A read-only script that loops until SCRIPT KILL ends it."""
    with contextlib.suppress(redis.RedisError):
        redis.Redis.from_url(url, socket_timeout=30).eval("while true do end", 0)


def _wait_busy(direct: redis.Redis, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            direct.ping()
        except redis.ResponseError as exc:
            if str(exc).startswith("BUSY"):
                return
            raise
        time.sleep(0.02)
    raise AssertionError("the server never said BUSY")
