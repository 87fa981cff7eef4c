"""What a process hears of the store, and what its remembered refusals are checked against.

The watch (`engine.watch`) on a real server and a real cluster: the version bumped by
another engine, a reset announced, the store flushed; nothing for any other write. The
deny cache: learnt under a policy version, dropped when the store reports another, and
never trusted at a time before it was learnt.
"""

from __future__ import annotations

import pytest
import redis
import redis.cluster

from ratelimits.engine import Limit, RedisEngine
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.local_first import DenyCache, LocalFirst
from ratelimits.engine.watch import FLUSHED, POLICIES, RESET, Change, ChangeWatch
from tests.engine.conftest import T0

LOGIN = Limit("ip:203.0.113.9", "fixed_window", 2, 60.0, name="login")
#: Generous for a loaded machine: a message comes within milliseconds.
WITHIN = 5.0


def _heard(watch: ChangeWatch) -> list[Change]:
    assert watch.wait(WITHIN), "nothing heard"
    assert watch.pending()  # not read yet: a request would not trust what it remembers
    return watch.read()


@pytest.fixture
def store(redis_client):
    engine = RedisEngine(redis_client, version_key="rl:version")
    yield engine
    engine.close()


@pytest.fixture
def watch(store):
    watch = store.watch()
    assert watch is not None
    watch.open()
    yield watch
    watch.close()


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


def test_a_ping_is_answered_and_read_as_no_change(watch):
    watch.ping()
    assert watch.wait(WITHIN)
    assert watch.read() == []
    assert not watch.pending()


def test_a_closed_watch_says_nothing_is_pending_and_cannot_wait(watch):
    watch.close()
    assert not watch.pending()
    with pytest.raises(ConnectionError):
        watch.wait(0)


def test_on_a_cluster_the_watch_is_on_the_version_keys_node(cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    engine = ClusterEngine(client, version_key="rl:version")
    watch = engine.watch()
    assert watch is not None
    watch.open()
    try:
        engine.bump_version()
        assert _heard(watch) == [Change(POLICIES)]
        engine.announce_reset("login")  # its key is in the version key's slot
        assert _heard(watch) == [Change(RESET, "login")]
    finally:
        watch.close()
        engine.close()
        client.close()


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
