"""Shared fixtures, for the suite in tests/ and the examples of docs/ alike: a real Redis for
every test that needs one, never a mock; a clean engine, snapshot and Redis database each,
and the app's clock. The root conftest.py registers this module as a plugin."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

from ratelimits.engine.postgres_sessions import tables
from ratelimits.engine.tally import discard_all
from ratelimits.pipeline.state import reset_state
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock
from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisProcess

#: Fixtures that start processes of their own (a cluster, a redis-server, the demo or a
#: workers' site, a browser): a test that uses one is `slow`, left out of `make test-fast`.
PROCESS_FIXTURES = frozenset({"cluster", "private_redis", "locked_cluster", "demo_env", "site",
                              "browser_page"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that uses a fixture of `PROCESS_FIXTURES`."""
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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
    """A client on a freshly flushed database. Engines count in process and send their
    counts from a thread up to a second later: what no engine has sent by a flush is
    dropped, so one test's counts never land in the next test's database."""
    client = redis.Redis.from_url(redis_url)
    discard_all()
    client.flushdb()
    yield client
    discard_all()
    client.flushdb()
    client.close()


#: The machine's PostgreSQL (trust auth), where each run makes a database of its own.
POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A database of this run's own (this worker's, under xdist) on the machine's
    PostgreSQL (`POSTGRES_SERVER`, or the server of `POSTGRES_URL` when set), dropped at
    the end; its URL. Fails (never skips) when the server does not answer."""
    import psycopg

    server = os.environ.get("POSTGRES_URL", POSTGRES_SERVER)
    name = f"ratelimits_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
    try:
        admin = psycopg.connect(server, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.fail(f"PostgreSQL at {server} does not answer ({exc}): start it, or set "
                    "POSTGRES_URL to a server where these tests may create a database")
    admin.execute(f'CREATE DATABASE "{name}"')
    url = server.rsplit("/", 1)[0] + "/" + name
    try:
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The run's PostgreSQL database with the engine's tables (`postgres_sessions.tables()`)
    emptied, those that exist (the first engine creates them), before and after the
    test."""
    import psycopg

    def empty() -> None:
        discard_all()  # counts of engines not closed: never into the next test's tables
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            there = [t for t in tables()
                     if conn.execute("SELECT to_regclass(%s)", (t,)).fetchone()[0]]
            if there:
                conn.execute(f"TRUNCATE {', '.join(there)}")

    empty()
    yield postgres_server
    empty()


@pytest.fixture
def site_database(postgres_server: str) -> Iterator[str]:
    """A database of the test's own on the run's PostgreSQL, for a site's processes (its
    Django tables and its limits), dropped afterwards with their connections."""
    import psycopg

    name = f"ratelimits_site_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Database:
    """The run's Redis database, held open for the run: emptied where a test left keys."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def empty(self) -> None:
        """FLUSHDB, when the database holds a key (DBSIZE: one cheap round trip; most
        Django tests never touch Redis)."""
        discard_all()  # counts of engines not closed: never into the next test's database
        if self.client.dbsize():
            self.client.flushdb()


@pytest.fixture(scope="session")
def redis_database(redis_url: str) -> Iterator[Database]:
    """The database of `redis_url`, for fixtures that empty it only when needed."""
    database = Database(redis_url)
    yield database
    database.client.close()


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


@contextlib.contextmanager
def own_cluster() -> Iterator[RedisCluster]:
    """A real Redis Cluster (3 primaries, 3 replicas), stopped on the way out; fails the
    test, never skips it, when one cannot start."""
    try:
        started = RedisCluster().start()
    except RuntimeError as exc:
        pytest.fail(f"the cluster tests need a Redis Cluster: {exc}")
    try:
        yield started
    finally:
        started.stop()


def _layout(cluster: RedisCluster) -> tuple[object, ...]:
    """What every live node says of the slots: who serves which, migrations included.
    A test that kills a node or moves a slot changes it."""
    return tuple(
        (port, sorted((view.port, view.slots) for view in cluster.nodes(port).values()
                      if view.slots))
        for port in sorted(cluster.live_ports())
    )


class SharedCluster:
    """The run's one cluster and the slot layout it started with."""

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self.layout = _layout(cluster)

    def fresh(self) -> RedisCluster:
        """The cluster as a new one is: started anew when a test changed its layout (a
        start-up costs seconds, the check a millisecond), and every primary without keys,
        scripts, functions or stats."""
        try:
            same = _layout(self.cluster) == self.layout
        except redis.RedisError:  # a node it knew is gone
            same = False
        if not same:
            self.cluster.stop()
            try:
                self.cluster.start()
            except RuntimeError as exc:
                pytest.fail(f"the cluster tests need a Redis Cluster: {exc}")
            self.layout = _layout(self.cluster)
        for port in self.cluster.primary_ports():
            node = self.cluster.client(port)
            node.flushall()
            node.script_flush()
            node.function_flush()
            node.config_resetstat()
            node.close()
        return self.cluster


@pytest.fixture(scope="session")
def _session_cluster() -> Iterator[SharedCluster]:
    with own_cluster() as started:
        yield SharedCluster(started)


@pytest.fixture
def cluster(_session_cluster: SharedCluster) -> RedisCluster:
    """A real Redis Cluster (3 primaries, 3 replicas), shared by the run and emptied for
    each test. A test that changes the topology (kills a node, moves a slot) takes a
    cluster of its own (`own_cluster()`); one that changed this one anyway is not seen
    by the next test."""
    return _session_cluster.fresh()


# -- the Django app: process state, the app's clock, policies ------------------------------


@pytest.fixture(scope="session", autouse=True)
def _cache_on_fixture_redis(redis_url):
    """Point the default cache at the Redis that `redis_url` chose."""
    from django.conf import settings

    caches = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": redis_url}}
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def clean_state(redis_database):
    """An empty Redis database and no engine, config or snapshot left from another test.
    The database is emptied only when it holds keys, after the engine closed (its tally
    written now, never into the next test). The engine tests, which keep no process state,
    turn it off (tests/engine/conftest.py)."""
    reset_state()
    redis_database.empty()
    yield
    reset_state()
    redis_database.empty()


class Waits(Clock):
    """A test clock that records the wait each request is told to make (on either stack)
    and lets no time pass: requests arrive at one instant, and each one's wait is known."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def clock():
    """The app's clock for this test (`ratelimits.runtime`): standing still, moved by the
    test (`clock.advance(seconds)`)."""
    with using_clock(Clock()) as installed:
        yield installed


@pytest.fixture
def waits():
    """The app's clock for this test, recording the waits requests are told to make
    (`waits.slept`) instead of sleeping."""
    with using_clock(Waits()) as installed:
        yield installed


@pytest.fixture
def forget_declarations():
    """The limits a test declares (decorated views, compat throttles' scopes) end with it:
    later tests compile their snapshots without them."""
    from ratelimits.pipeline.declared import registry

    before = dict(registry.declared)
    yield
    registry.restore(before)


@pytest.fixture
def memory_store(settings):
    """Run the test on the in-process engine (a non-Redis cache)."""
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "local"}
    yield


@pytest.fixture(params=["redis", "memory"])
def any_store(request, settings):
    """Run the test once on the Redis engine and once on the in-process engine."""
    if request.param == "memory":
        settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "local"}
    return request.param


@pytest.fixture
def make_policy(db, django_capture_on_commit_callbacks):
    """Create a validated policy and publish it as a commit would."""
    from ratelimits.models import Policy

    def make(**fields):
        values = {
            "name": "p",
            "mode": "enforce",
            "algorithm": "fixed_window",
            "limit": 2,
            "period": 3600,
            "key": "ip",
            "path": "*",
        }
        values.update(fields)
        policy = Policy(**values)
        policy.full_clean()
        with django_capture_on_commit_callbacks(execute=True):
            policy.save()
        return policy

    return make


@pytest.fixture
def staff(django_user_model, client):
    """A staff user without model permissions, logged in on `client`."""
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    return user
