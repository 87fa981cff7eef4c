"""What a process hears of the store, and what its remembered refusals are checked against.

The watch (`engine.watch`) on a real server, a real cluster and a real PostgreSQL: the
version bumped by another engine, a reset announced, the store flushed; nothing for any
other write, nor from another site's prefix; a session the server ended is said. The
deny cache: learnt under a policy version, dropped when the store reports another, and
never trusted at a time before it was learnt.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis
import redis.cluster

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.interfaces import Watch
from ratelimits.engine.local_first import DenyCache, LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.engine.watch import FLUSHED, LONGEST_CHANNEL, POLICIES, RESET, Change, channel
from tests.engine.conftest import T0

LOGIN = Limit("ip:203.0.113.9", "fixed_window", 2, 60.0, name="login")
#: Generous for a loaded machine: a message comes within milliseconds.
WITHIN = 5.0


def _heard(watch: Watch) -> list[Change]:
    assert watch.wait(WITHIN), "nothing heard"
    assert watch.pending()  # not read yet: a request would not trust what it remembers
    return watch.read()


@contextlib.contextmanager
def _opened(engine: RedisEngine | ClusterEngine | PostgresEngine) -> Iterator[Watch]:
    """The engine's watch, open until the block ends."""
    watch = engine.watch()
    assert watch is not None
    watch.open()
    try:
        yield watch
    finally:
        watch.close()


@pytest.fixture
def store(redis_client):
    engine = RedisEngine(redis_client, version_key="rl:version")
    yield engine
    engine.close()


@pytest.fixture
def watch(store):
    with _opened(store) as watch:
        yield watch


def test_a_watch_hears_the_version_a_reset_and_a_flush_and_nothing_else(
        store, watch, redis_url):
    other = RedisEngine(redis.Redis.from_url(redis_url), version_key="rl:version")
    other.bump_version()  # another process saved a policy
    assert _heard(watch) == [Change(POLICIES)]
    other.announce_reset("login")  # an operator reset a client of "login"
    assert _heard(watch) == [Change(RESET, "login")]
    other.evaluate([LOGIN], now=T0)  # traffic: not a change
    assert not watch.wait(0.2)
    other.client.set("rl:versions-of-something", 1)  # sent (the prefix), yet no change
    assert _heard(watch) == []
    other.client.flushdb()
    assert _heard(watch) == [Change(FLUSHED)]
    other.client.flushall()
    assert _heard(watch) == [Change(FLUSHED)]
    other.close()


@pytest.fixture(params=["redis", "postgres"])
def either_watch(request):
    """An open watch on Redis, then on PostgreSQL."""
    engine = request.getfixturevalue("store" if request.param == "redis" else "pg")
    with _opened(engine) as watch:
        yield watch


def test_a_ping_is_answered_and_read_as_no_change(either_watch):
    either_watch.ping()
    assert either_watch.wait(WITHIN)
    assert either_watch.read() == []
    assert not either_watch.pending()


def test_a_closed_watch_says_nothing_is_pending_and_cannot_wait(either_watch):
    either_watch.close()
    assert not either_watch.pending()
    with pytest.raises(ConnectionError):
        either_watch.wait(0)


def test_a_close_from_another_thread_ends_a_wait(either_watch):
    """The listener's stop closes its watch from another thread: the wait returns then,
    not at its timeout."""
    closer = threading.Timer(0.1, either_watch.close)
    closer.start()
    started = time.monotonic()
    with contextlib.suppress(ConnectionError):  # the closed connection, said
        either_watch.wait(WITHIN * 2)
    closer.join()
    assert time.monotonic() - started < WITHIN


def test_on_a_cluster_the_watch_is_on_the_version_keys_node(cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    engine = ClusterEngine(client, version_key="rl:version")
    try:
        with _opened(engine) as watch:
            engine.bump_version()
            assert _heard(watch) == [Change(POLICIES)]
            engine.announce_reset("login")  # its key is in the version key's slot
            assert _heard(watch) == [Change(RESET, "login")]
    finally:
        engine.close()
        client.close()


# -- PostgreSQL: NOTIFY in the write's transaction, LISTEN on a session of its own ------


@pytest.fixture
def pg(postgres_url):
    engine = PostgresEngine(postgres_url, version_key="rl:version")
    yield engine
    engine.close()


def test_on_postgresql_a_watch_hears_the_version_and_resets_and_nothing_else(
        pg, postgres_url):
    other = PostgresEngine(postgres_url, version_key="rl:version")  # another process
    elsewhere = PostgresEngine(postgres_url, prefix="b:", version_key="b:version")
    with _opened(pg) as watch:
        assert not watch.wait(0.2)
        assert other.bump_version() == 1  # another process saved a policy
        assert _heard(watch) == [Change(POLICIES)]
        other.reset(LOGIN, now=T0)  # an operator reset a client of "login"
        assert _heard(watch) == [Change(RESET, "login")]
        other.announce_reset("signup")  # told every process (reset_client does both)
        assert _heard(watch) == [Change(RESET, "signup")]
        other.evaluate([LOGIN], now=T0)  # traffic: not a change
        other.read_version()
        other.reset(Limit("ip:203.0.113.9", "fixed_window", 2, 60.0))  # no policy named
        # another site in the same database (another key prefix): never heard here
        elsewhere.bump_version()
        elsewhere.announce_reset("login")
        elsewhere.reset(LOGIN, now=T0)
        assert not watch.wait(0.3)
        assert not watch.pending()
    other.close()
    elsewhere.close()


def test_on_postgresql_a_long_prefix_gets_a_channel_of_its_own_that_fits(postgres_url):
    long, longer = "x" * 80 + ":version", "x" * 81 + ":version"
    assert len(channel(long).encode()) <= LONGEST_CHANNEL
    assert channel(long) != channel(longer)
    engine = PostgresEngine(postgres_url, prefix="x" * 80 + ":", version_key=long)
    with _opened(engine) as watch:
        engine.bump_version()
        assert _heard(watch) == [Change(POLICIES)]
    engine.close()


def test_on_postgresql_a_session_ended_by_the_server_is_said(pg, postgres_url):
    """A restarted server, or an administrator's pg_terminate_backend, ends the watch's
    session: its next reads raise ConnectionError (the listener then connects again and
    acts as if the policies changed), and a new watch hears again."""
    with _opened(pg) as watch:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            pid = admin.execute("SELECT pid FROM pg_stat_activity WHERE query ILIKE "
                                "'LISTEN %%' AND datname = current_database()").fetchone()[0]
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        with pytest.raises(ConnectionError, match="session ended"):
            for _ in range(5):  # libpq reads the server's goodbye, then the end
                assert watch.wait(WITHIN)
                assert watch.read() == []
    with _opened(pg) as again:
        pg.bump_version()
        assert _heard(again) == [Change(POLICIES)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_on_postgresql_a_forked_child_closing_the_watch_leaves_the_parents_session(pg):
    """A gunicorn worker forked from a master that listened holds the master's watch: its
    close ends nothing of the master's (the socket is shared)."""
    with _opened(pg) as watch:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                watch.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        pg.bump_version()
        assert _heard(watch) == [Change(POLICIES)]


# -- the deny cache: versions and time ---------------------------------------------------


def _refused(front: LocalFirst, at: float) -> None:
    for _ in range(LOGIN.limit):
        assert front.evaluate([LOGIN], now=at).allowed
    assert not front.evaluate([LOGIN], now=at).allowed


@pytest.fixture
def front(store):
    return LocalFirst(store)


def test_a_refusal_learnt_under_one_version_never_answers_under_another(front, redis_url):
    _refused(front, T0)
    assert front.denied.refused and front.denied.version == 0
    RedisEngine(redis.Redis.from_url(redis_url), version_key="rl:version").bump_version()
    front.store.reset(LOGIN, now=T0)  # the store would now admit the client
    # the deny cache does not know yet: it answers (until the version is learnt) ...
    assert not front.evaluate([LOGIN], now=T0 + 0.1).allowed
    # ... then a read of the version (once a second per process) drops it
    assert front.read_version() != 0
    assert not front.denied.refused
    assert front.evaluate([LOGIN], now=T0 + 0.2).allowed


def test_a_store_reply_with_another_version_drops_what_is_remembered(front, store):
    _refused(front, T0)
    other = Limit("ip:198.51.100.7", "fixed_window", 2, 60.0, name="login")
    store.bump_version()
    assert front.evaluate([other], now=T0).allowed  # its reply carries the new version
    assert not front.denied.refused


def test_a_flushed_store_reports_version_zero_and_nothing_is_remembered(front, store):
    store.bump_version()
    _refused(front, T0)
    version = front.denied.version
    assert version
    store.client.flushdb()
    other = Limit("ip:198.51.100.7", "fixed_window", 2, 60.0, name="login")
    assert front.evaluate([other], now=T0).allowed
    assert front.denied.version == 0 and not front.denied.refused
    assert front.evaluate([LOGIN], now=T0).allowed  # the store forgot the client


def test_a_refusal_is_never_trusted_before_the_time_it_was_learnt(front):
    _refused(front, T0)
    assert front.denied.answer([LOGIN], T0 + 0.5) is not None
    # a test's timer set back to 0: not a refusal with 57 years to wait
    assert front.denied.answer([LOGIN], 0.0) is None
    assert front.denied.answer([LOGIN], T0 - 0.001) is None


def test_unheard_changes_hold_the_remembered_refusals(front):
    _refused(front, T0)
    front.unheard = lambda: True  # a message came, not acted on yet
    scripts = front.store.client.info("commandstats")
    decision = front.evaluate([LOGIN], now=T0 + 0.1)  # asked of the store
    assert not decision.allowed
    assert front.store.client.info("commandstats") != scripts


def test_forget_remembered_drops_one_policy_or_all():
    cache = DenyCache()
    signup = Limit("ip:203.0.113.9", "fixed_window", 2, 60.0, name="signup")
    for limit in (LOGIN, signup):
        cache.refused[limit] = (T0 + 1, T0 + 30, T0 + 60, T0)
    cache.forget_policy("login")
    assert list(cache.refused) == [signup]
    cache.moved(7)
    assert not cache.refused and cache.version == 7
