"""Each process's listener (`ratelimits.pipeline.changes`): started by the first request,
never at import; hearing another process's change within milliseconds, on Redis and on
PostgreSQL; connecting again after the store went away (or ended the session); one per
process across a fork; and what publishing a change returns for the admin to say."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import redis
from django.db import transaction

from ratelimits.engine import RedisEngine
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.models import Policy
from ratelimits.pipeline.changes import PING_EVERY, listener
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.resolver import resolver
from ratelimits.receivers import schedule_policies_changed
from tests.redis_server import RedisProcess
from tests.settings import RATELIMITS
from tests.support.workers import ROOT

URL = "/admin/ratelimits/policy/"
#: Generous for a loaded machine: a change is heard within milliseconds.
WITHIN = 5.0


def _until(condition, timeout: float = WITHIN) -> float:
    """Seconds until `condition()` held (polled); fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "not within the deadline"
        time.sleep(0.002)
    return time.monotonic() - started


def _listening() -> None:
    _until(lambda: listener.watch is not None and not listener.reading)


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ratelimits-changes" and t.is_alive()]


def test_nothing_listens_at_import_or_setup():
    code = ("import django, threading; django.setup()\n"
            "import ratelimits.receivers, ratelimits.pipeline.resolver\n"
            "from ratelimits.pipeline.changes import listener\n"
            "assert listener.pid is None, listener.pid\n"
            "assert not [t for t in threading.enumerate() if t.name == 'ratelimits-changes']\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)


def test_the_first_request_starts_the_listener_which_hears_another_process(
        client, make_policy, redis_url, capsys):
    make_policy(name="a", limit=1, path="/hello/")
    assert listener.pid is None
    assert client.get("/hello/").status_code == 200
    assert listener.pid == os.getpid()
    _listening()  # once the store has answered (it connects, and drops what is remembered)
    assert client.get("/hello/").status_code == 429  # remembered
    assert get_engine().denied.refused
    assert resolver.ready() is not None

    # another process saves a policy: the version is bumped in the store
    other = RedisEngine(redis.Redis.from_url(redis_url),
                        version_key=f"{RATELIMITS['KEY_PREFIX']}version")
    other.bump_version()
    heard = _until(lambda: resolver.ready() is None and not get_engine().denied.refused)
    with capsys.disabled():
        print(f"\nanother process's change heard in {heard * 1000:.1f} ms")
    other.close()
    # one listener: a thread an earlier test's reset stopped may still be ending its wait
    _until(lambda: len(_threads()) == 1, PING_EVERY + WITHIN)


def test_a_change_saved_in_this_process_is_seen_by_its_next_request(
        any_store, admin_client, make_policy, django_capture_on_commit_callbacks):
    policy = make_policy(name="a", limit=1, path="/hello/")
    assert admin_client.get("/hello/").status_code == 200
    assert admin_client.get("/hello/").status_code == 429
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(URL, {"action": "switch_to_shadow", "_selected_action": [policy.pk]})
    assert admin_client.get("/hello/").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(URL, {"action": "switch_to_enforce", "_selected_action": [policy.pk]})
    assert admin_client.get("/hello/").status_code == 429
    if any_store == "memory":
        assert listener.pid == os.getpid() and listener.watch is None  # nothing to hear


@pytest.fixture
def own_server(private_redis, settings):
    settings.CACHES = {**settings.CACHES,
                       "default": {**settings.CACHES["default"], "LOCATION": private_redis.url}}
    return private_redis


@pytest.mark.slow
def test_the_listener_connects_again_after_the_store_went_away(
        client, make_policy, own_server):
    make_policy(name="a", limit=1, path="/hello/")
    assert client.get("/hello/").status_code == 200
    _listening()
    first = listener.watch
    own_server.stop()
    _until(lambda: listener.watch is None)
    back = RedisProcess(port=own_server.port).start()
    try:
        _until(lambda: listener.watch is not None and listener.watch is not first, 15.0)
        _listening()
        # the restarted server lost the version: heard as a change, reloaded once
        _until(lambda: client.get("/hello/").status_code == 200
               and resolver.ready() is not None)
        RedisEngine(redis.Redis.from_url(back.url),
                    version_key=f"{RATELIMITS['KEY_PREFIX']}version").bump_version()
        _until(lambda: resolver.ready() is None)
    finally:
        back.stop()


def test_on_postgresql_the_listener_hears_another_process_and_a_session_ended(
        client, make_policy, postgres_url, settings, capsys):
    settings.RATELIMITS = {**settings.RATELIMITS, "DATABASE": postgres_url}
    make_policy(name="a", limit=1, path="/hello/")
    assert client.get("/hello/").status_code == 200
    _listening()
    assert client.get("/hello/").status_code == 429  # remembered
    assert get_engine().denied.refused and resolver.ready() is not None

    # another process saves a policy: the version bumped, and NOTIFY at its commit
    other = PostgresEngine(postgres_url, version_key=f"{RATELIMITS['KEY_PREFIX']}version")
    try:
        other.bump_version()
        heard = _until(lambda: resolver.ready() is None and not get_engine().denied.refused)
        with capsys.disabled():
            print(f"\nanother process's change heard on PostgreSQL in {heard * 1000:.1f} ms")

        # the session ended by the server (a restart, an administrator): the listener
        # connects again and drops what it remembers, as if the policies changed (as it
        # does on Redis), then hears again
        assert client.get("/hello/").status_code == 429
        assert get_engine().denied.refused and resolver.ready() is not None
        first = listener.watch
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query ILIKE 'LISTEN %%' AND datname = current_database()").fetchall()
        assert ended == [(True,)]
        _until(lambda: listener.watch is not None and listener.watch is not first, 15.0)
        _listening()
        _until(lambda: not get_engine().denied.refused)
        other.bump_version()
        _until(lambda: resolver.ready() is None)
    finally:
        other.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_process_listens_on_its_own_and_leaves_the_parents_alone(
        client, make_policy, redis_url):
    make_policy(name="a", limit=1, path="/hello/")
    assert client.get("/hello/").status_code == 200
    _listening()
    parents = listener.watch
    pid = os.fork()
    if pid == 0:  # the child, as a gunicorn worker forked after the app loaded
        code = 1
        try:
            assert listener.watch is None and listener.pid != os.getpid()
            assert resolver.ready() is None  # its first request builds, and listens
            resolver.snapshot()
            _listening()
            assert listener.pid == os.getpid() and listener.watch is not parents
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # the child neither closed nor read the parent's connection
    assert listener.watch is parents
    RedisEngine(redis.Redis.from_url(redis_url),
                version_key=f"{RATELIMITS['KEY_PREFIX']}version").bump_version()
    _until(lambda: resolver.ready() is None)


@pytest.mark.django_db(transaction=True)
def test_a_publication_says_whether_the_store_took_it(settings):
    done = schedule_policies_changed()  # outside a transaction: at once
    assert done.done and done.published and done.version
    with transaction.atomic():
        waiting = schedule_policies_changed()
        assert not waiting.done and not waiting.published
    assert waiting.published and waiting.version > done.version

    settings.CACHES = {**settings.CACHES, "default": {
        **settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    failed = schedule_policies_changed()
    assert failed.done and not failed.published
    assert "Connection" in failed.error and failed.version is None
    assert listener.last is failed


def test_a_policy_saved_publishes(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        Policy.objects.create(name="a", limit=1, period=60, key="ip", path="/x/")
    assert listener.last is not None and listener.last.published


@pytest.mark.slow
def test_a_store_that_cannot_push_leaves_the_once_a_second_read(
        client, make_policy, settings, caplog):
    server = RedisProcess(extra_args=("--rename-command", "CLIENT", "")).start()
    try:
        settings.CACHES = {**settings.CACHES,
                           "default": {**settings.CACHES["default"], "LOCATION": server.url}}
        make_policy(name="a", limit=1, path="/hello/")
        with caplog.at_level("INFO", logger="ratelimits"):
            assert client.get("/hello/").status_code == 200
            _until(lambda: not listener.reading)
        _until(lambda: not _threads())
        assert listener.watch is None
        assert "the store cannot push changes" in caplog.text
        # no message ever comes: remembered refusals are trusted, for HOLD at most
        assert client.get("/hello/").status_code == 429
        assert get_engine().denied.refused and not listener.unheard()
    finally:
        server.stop()
