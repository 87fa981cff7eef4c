"""`ratelimits.runtime`: one reset forgets every piece of process state, and the one clock
is the time requests are decided at, wait on and measure their intervals with."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from ratelimits import runtime
from ratelimits.compat.django_ratelimit.core import upstream
from ratelimits.conf import get_config
from ratelimits.engine import Limit, MemoryEngine, RedisEngine, keynames
from ratelimits.matching.identity import client_ip, parse_trusted_proxies
from ratelimits.pipeline.engines import get_adaptive_engine, get_engine, get_local_engine, install
from ratelimits.pipeline.metrics import recorder_for
from ratelimits.pipeline.report import log_unavailable
from ratelimits.pipeline.resolver import pinned_snapshot, resolver
from ratelimits.pipeline.state import process
from ratelimits.pipeline.waiting import room
from ratelimits.pipeline.watchdog import watchdog
from ratelimits.runtime import reset_process, using_clock
from ratelimits.testing import Clock

#: An epoch second on a minute's boundary.
T0 = 1_800_000_000.0

MINUTE = {"name": "minute", "rate": "1/m", "algorithm": "fixed_window", "path": "/hello/"}


@pytest.fixture(autouse=True)
def fresh():
    """Each test starts and ends with nothing kept in the process."""
    reset_process()
    yield
    reset_process()


@pytest.fixture
def in_process(settings):
    """The engines built from the settings are in process (no store to reach)."""
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "local"}


def hello(n: int = 1) -> list[int]:
    client = Client()
    return [client.get("/hello/").status_code for _ in range(n)]


# -- every holder forgets what it holds ------------------------------------------------------


def test_the_settings_are_read_again():
    config = get_config()
    assert get_config() is config
    reset_process()
    assert get_config() is not config


def test_the_engines_are_built_again(in_process):
    installed = MemoryEngine()
    install(installed)
    adaptive = get_adaptive_engine()
    assert get_engine() is installed and get_local_engine() is installed
    reset_process()
    assert get_engine() is not installed and get_local_engine() is not installed
    assert get_adaptive_engine() is not adaptive


def test_the_policy_snapshot_is_forgotten():
    resolver.pinned = pinned_snapshot([MINUTE])
    reset_process()
    assert resolver.pinned is None


def test_the_watchdog_renews_nothing_and_stops():
    engine = MemoryEngine()
    held = engine.evaluate([Limit("c", "concurrency", 1, 60, name="slots")], now=T0)
    watchdog.hold(engine, held)
    assert watchdog.in_flight() == 1 and watchdog.thread is not None
    reset_process()
    assert watchdog.in_flight() == 0 and watchdog.thread is None


def test_the_waiting_room_is_empty_again():
    assert room.enter(("ip:10.0.0.1",), 5, 5)
    assert room.waiting() == 1
    reset_process()
    assert room.waiting() == 0


def test_the_unavailable_store_is_logged_again(caplog):
    with using_clock(Clock()), caplog.at_level(logging.ERROR, "ratelimits"):
        for _ in range(2):  # the clock stands still: within the cool-down
            log_unavailable(ConnectionError("down"), get_config())
        assert caplog.text.count("store is unavailable") == 1
        reset_process()
        log_unavailable(ConnectionError("down"), get_config())
    assert caplog.text.count("store is unavailable") == 2


def test_a_metrics_failure_is_logged_again_and_the_recorder_kept(settings, caplog):
    pytest.importorskip("prometheus_client")
    settings.RATELIMITS = {**settings.RATELIMITS, "METRICS": True}
    recorder = recorder_for(get_config())
    assert recorder is not None
    with caplog.at_level(logging.ERROR, "ratelimits"):
        for _ in range(2):
            recorder.decided(MemoryEngine(), 0.001, [(None, "")], None)  # no results: fails
        assert caplog.text.count("recording metrics failed") == 1
        reset_process()
        recorder.decided(MemoryEngine(), 0.001, [(None, "")], None)
    assert caplog.text.count("recording metrics failed") == 2
    # its metrics are registered with prometheus_client once per process: the same one
    assert recorder_for(get_config()) is recorder


def test_the_proxy_header_warning_is_logged_again(caplog):
    proxies = parse_trusted_proxies(["10.0.0.0/8"])
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "9.9.9.9",
            "HTTP_FORWARDED": "for=198.51.100.7"}

    def warnings() -> int:
        return sum("which is not read" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, "ratelimits"):
        for _ in range(2):
            client_ip(meta, proxies)
        assert warnings() == 1
        reset_process()
        client_ip(meta, proxies)
    assert warnings() == 2


def caller(request) -> str | None:
    """The client of the `call:` policy below: one client, until the test replaces it."""
    return "the-one"


def test_a_call_key_imports_its_function_again(monkeypatch):
    snap = pinned_snapshot([{**MINUTE, "key": f"call:{__name__}.caller"}])
    engine, clock = MemoryEngine(), Clock(T0)

    def decide_with_them() -> None:
        runtime.use_clock(clock)
        install(engine)
        resolver.pinned = snap

    decide_with_them()
    assert hello(2) == [200, 429]
    monkeypatch.setattr(f"{__name__}.caller", lambda request: None)  # applies to no one
    assert hello() == [429]  # the function loaded first still counts the client
    reset_process()
    decide_with_them()  # the same clock, counts and policy: only the function is new
    assert hello() == [200]


def test_the_engine_key_names_are_worked_out_again(monkeypatch):
    limit = Limit("c", "sliding_window", 5, 60, name="p")
    before = keynames.cell("rl:", limit)
    monkeypatch.setattr(keynames, "WINDOW_SHARDS", keynames.WINDOW_SHARDS * 2 + 1)
    assert keynames.cell("rl:", limit) == before  # remembered
    reset_process()
    assert keynames.cell("rl:", limit) != before


def test_django_ratelimit_settings_are_read_again():
    read = upstream()
    assert upstream() is read
    reset_process()
    assert upstream() is not read


def test_the_policy_version_timer_starts_again(in_process):
    resolver.pinned = pinned_snapshot([MINUTE])
    assert hello() == [200]  # the reply carried the policy version
    assert process.version_at > -float("inf")
    reset_process()
    assert process.version_at == -float("inf")


def test_the_real_clock_is_back():
    runtime.use_clock(Clock())
    reset_process()
    assert runtime.clock() is runtime.REAL


def test_one_reset_forgets_every_holder_at_once(in_process):
    runtime.use_clock(Clock(T0))
    install(MemoryEngine())
    resolver.pinned = pinned_snapshot([MINUTE])
    assert hello(2) == [200, 429]
    room.enter(("ip:10.0.0.1",), 5, 5)
    reset_process()
    assert runtime.clock() is runtime.REAL and resolver.pinned is None
    assert room.waiting() == 0 and process.version_at == -float("inf")


def test_a_reset_is_registered_once():
    calls = []

    def forget() -> None:
        calls.append(1)

    assert runtime.on_reset(forget) is forget
    runtime.on_reset(forget)
    reset_process()
    assert calls == [1]


# -- the request path reads the one clock ----------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def engine(request):
    """The engine deciding the requests: in process, or a Redis server's."""
    if request.param == "memory":
        yield MemoryEngine()
        return
    engine = RedisEngine(request.getfixturevalue("redis_client"))
    yield engine
    engine.close()  # what it tallied reaches this test's database, not the next one's


def test_a_request_is_decided_at_the_clocks_time(engine):
    clock = Clock(T0 + 50)  # ten seconds before the minute ends
    with using_clock(clock):
        install(engine)
        resolver.pinned = pinned_snapshot([MINUTE])
        client = Client()
        assert client.get("/hello/").status_code == 200
        refused = client.get("/hello/")
        assert refused.status_code == 429 and refused["Retry-After"] == "10"
        clock.advance(10)
        assert client.get("/hello/").status_code == 200  # the next minute


def test_a_waiting_request_moves_the_clock(engine):
    paced = {"name": "paced", "rate": "1/s", "algorithm": "gcra", "burst": 1, "max_wait": 2,
             "path": "/hello/"}
    clock = Clock(T0)
    with using_clock(clock):
        install(engine)
        resolver.pinned = pinned_snapshot([paced])
        assert hello(2) == [200, 200]  # the second waited its turn ...
        assert clock.time() == T0 + 1.0  # ... on the clock, a second


def test_an_interval_is_measured_on_the_clock(caplog):
    clock = Clock()
    config = get_config()
    with using_clock(clock), caplog.at_level(logging.ERROR, "ratelimits"):
        log_unavailable(ConnectionError("down"), config)
        clock.advance(config["BREAKER_COOLDOWN"] - 0.1)
        log_unavailable(ConnectionError("down"), config)
        assert caplog.text.count("store is unavailable") == 1
        clock.advance(0.1)
        log_unavailable(ConnectionError("down"), config)
    assert caplog.text.count("store is unavailable") == 2
