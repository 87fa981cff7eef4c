"""A request no policy matches reads the policy version at most once a second per process,
and only when no store reply carried it meanwhile.

These are the promises of the fallback, where nothing is pushed (a store without
`CLIENT TRACKING`): no process listens here (`tests/pipeline/test_changes.py` tests the
listener)."""

from __future__ import annotations

import threading

import pytest
import redis

from ratelimits.engine import MemoryEngine
from ratelimits.pipeline import engines
from tests.redis_server import script_calls


@pytest.fixture
def server(private_redis, settings):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    return redis.Redis.from_url(private_redis.url)


@pytest.fixture(autouse=True)
def _nothing_pushed(monkeypatch):
    from ratelimits.pipeline.changes import listener

    monkeypatch.setattr(listener, "ensure", lambda: None)


def gets(server: redis.Redis) -> int:
    return int(server.info("commandstats").get("cmdstat_get", {}).get("calls", 0))


def evalshas(server: redis.Redis) -> int:
    """Script calls: the heartbeat's (EVALSHA) and decisions (FCALL)."""
    return script_calls(server)


def published_elsewhere(server: redis.Redis, **fields) -> None:
    """A policy saved by another process: in the database, and the version bumped."""
    from ratelimits.models import Policy

    values = {"name": "late", "mode": "enforce", "algorithm": "fixed_window", "limit": 1,
              "period": 3600, "key": "ip", "path": "/hello/", **fields}
    Policy.objects.bulk_create([Policy(**values)])  # no signal: this process is not told
    server.incr("tests-rl:version")


def test_unmatched_requests_read_the_version_once_a_second(client, db, server, clock):
    assert client.get("/hello/").status_code == 200
    first, scripts = gets(server), evalshas(server)  # (EVALSHA: the heartbeat's script)
    assert first == 1
    for _ in range(50):
        assert client.get("/hello/").status_code == 200
    assert (gets(server), evalshas(server)) == (first, scripts)  # no round trip at all
    clock.advance(1.0)
    for _ in range(50):
        assert client.get("/hello/").status_code == 200
    assert gets(server) == first + 1


def test_a_reply_that_carries_the_version_spares_the_read(client, make_policy, server, clock):
    make_policy(name="api", limit=100, path="/api/*")
    assert client.get("/api/plain/").status_code == 200
    clock.advance(0.9)
    assert client.get("/api/plain/").status_code == 200  # learns the version again
    before = gets(server)  # (the script's own GETs count too: read after it)
    clock.advance(0.9)
    for _ in range(10):
        assert client.get("/hello/").status_code == 200  # 0.9 s since the last reply
    assert gets(server) == before


def test_an_edit_elsewhere_reaches_unmatched_paths_within_a_second(client, db, server, clock):
    assert client.get("/hello/").status_code == 200
    published_elsewhere(server)
    assert client.get("/hello/").status_code == 200  # not known yet: not read since
    clock.advance(1.0)
    # read, reloaded, and applied to the request that read it
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]


def test_one_thread_reads_while_the_others_go_on(client, db, server, clock, settings):
    from django.test import Client

    assert client.get("/hello/").status_code == 200
    clock.advance(5.0)
    before = gets(server)
    start = threading.Barrier(8)
    statuses: list[int] = []

    def hit() -> None:
        c = Client()
        start.wait()
        for _ in range(10):
            statuses.append(c.get("/hello/").status_code)

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 80
    assert gets(server) == before + 1


def test_decisions_answered_in_process_still_learn_edits(client, make_policy, server, clock):
    """A layer in front of the store may answer without it (version None): then the
    version is read when a second old, like an unmatched request's."""
    make_policy(name="api", limit=100, path="/api/*")
    assert client.get("/api/plain/").status_code == 200
    engine = engines.get_engine()
    answers = MemoryEngine()

    class InProcess:  # like a cache in front of the store: answers here, with no version
        def __getattr__(self, name):
            return getattr(engine, name)

        def evaluate(self, limits, now=None):
            return answers.evaluate(limits, now)

    engines._engine = InProcess()
    published_elsewhere(server, path="/api/*")
    assert client.get("/api/plain/").status_code == 200
    before = gets(server)
    assert client.get("/api/plain/").status_code == 200
    assert gets(server) == before  # younger than a second: not read
    clock.advance(1.0)
    assert [client.get("/api/plain/").status_code for _ in range(2)] == [200, 429]
    assert gets(server) == before + 1


def test_an_unreachable_store_is_tried_once_a_second(client, db, settings, clock, caplog):
    from tests.redis_server import free_port

    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    assert [client.get("/hello/").status_code for _ in range(5)] == [200] * 5
    failures = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(failures) == 1


def test_the_engines_read_the_version_alone(server, settings):
    from ratelimits.engine import MemoryEngine, RedisEngine

    engine = RedisEngine(server, version_key="v:version")
    assert engine.read_version() == 0
    server.set("v:version", 7)
    assert engine.read_version() == 7
    local = MemoryEngine(version_key="v")
    local.bump_version()
    assert local.read_version() == 1


def test_an_async_request_reads_the_version_on_the_event_loop(
    async_client, db, server, clock, monkeypatch
):
    """Under ASGI the version is awaited like the store's decisions: on the loop's own
    thread, through the asyncio engine, and an edit elsewhere applies the same way."""
    from asgiref.sync import async_to_sync

    from ratelimits.engine.aio import AsyncRedisEngine

    read_on = []
    read_version = AsyncRedisEngine.read_version

    async def watched(self, now=None):
        read_on.append(threading.get_ident())
        return await read_version(self, now)

    monkeypatch.setattr(AsyncRedisEngine, "read_version", watched)

    async def hits(n):
        return [(await async_client.get("/async/")).status_code for _ in range(n)], \
            threading.get_ident()

    assert async_to_sync(hits)(1)[0] == [200]  # the snapshot and the version learnt
    read_on.clear()
    published_elsewhere(server, path="/async/")
    clock.advance(1.0)
    statuses, loop_thread = async_to_sync(hits)(2)
    assert statuses == [200, 429]  # read, reloaded, applied to the request that read it
    assert read_on == [loop_thread]
