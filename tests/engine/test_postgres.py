"""What the PostgreSQL engine does beyond the tables every engine answers: its own
connections and clock, expiry without a cron job, an outage said as the engine's error,
what it cannot decide refused clearly, a batch leased; and how a site chooses it."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import types

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from ratelimits.conf import build_config
from ratelimits.engine import Limit
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.errors import CircuitOpen, EngineError, EngineUnavailable
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.engine.postgres_sessions import LOCK_SPACE
from ratelimits.pipeline.engines import conninfo_of, get_engine, is_shared, postgres_conninfo
from tests.engine.conftest import LOADED, T0


@pytest.fixture
def pg(postgres_url):
    engine = PostgresEngine(postgres_url, version_key="rl:version", timeout=LOADED)
    yield engine
    engine.close()


def _rows(url: str, table: str = "ratelimits_state_v1") -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_the_server_clock_decides_when_no_time_is_given(pg):
    limit = Limit("c", "fixed_window", 2, 3600)
    first = pg.evaluate([limit])
    assert first.allowed and first.results[0].remaining == 1
    assert pg.evaluate([limit]).allowed
    refused = pg.evaluate([limit])
    assert not refused.allowed
    assert 0 < refused.results[0].retry_after <= 3600


def test_the_client_clock_decides_when_clock_is_client(postgres_url, monkeypatch):
    """With `CLOCK = "client"` a call without a time is decided at this process's time,
    whatever the server's (here, this process's clock reads T0 + 9.8 s)."""
    import ratelimits.engine.postgres as module

    monkeypatch.setattr(module, "time", types.SimpleNamespace(time=lambda: T0 + 9.8))
    engine = PostgresEngine(postgres_url, clock="client")
    try:
        decision = engine.evaluate([Limit("c", "fixed_window", 1, 10)])
    finally:
        engine.close()
    assert decision.results[0].reset_after == pytest.approx(0.2)


def test_a_refusal_by_one_limit_charges_none(pg):
    loose = Limit("c", "sliding_log", 5, 60, name="loose")
    tight = Limit("c", "fixed_window", 1, 60, name="tight")
    assert pg.evaluate([loose, tight], now=T0).allowed
    refused = pg.evaluate([loose, tight], now=T0)
    assert not refused.allowed
    assert refused.results[0].remaining == 4  # spared: the log's unit was not taken
    assert pg.evaluate([loose], now=T0).results[0].remaining == 3


def test_a_view_rollback_cannot_undo_a_charge(pg, postgres_url):
    """The engine's connection is its own, in autocommit: a transaction of the site's
    that rolls back leaves the charge made meanwhile."""
    limit = Limit("c", "fixed_window", 1, 60)
    with psycopg.connect(postgres_url) as site:
        site.execute("SELECT 1")  # a transaction open on the site's connection
        assert pg.evaluate([limit], now=T0).allowed
        site.rollback()
    assert not pg.evaluate([limit], now=T0).allowed


def test_expired_rows_are_absent_and_swept_in_bounded_steps(pg, postgres_url):
    for i in range(5):
        pg.evaluate([Limit(f"c{i}", "fixed_window", 1, 10)], now=T0)
    assert _rows(postgres_url) == 5
    assert pg.sweep(now=T0 + 9.999) == 0  # live until their window ends
    assert pg.sweep(now=T0 + 10, most=2) == 2
    assert pg.sweep(now=T0 + 10) == 3
    assert _rows(postgres_url) == 0


def test_every_thousandth_call_sweeps(pg, postgres_url):
    pg.evaluate([Limit("gone", "fixed_window", 1, 1)], now=T0)
    limit = Limit("busy", "sliding_log", 10_000, 3600)
    for _ in range(999):
        pg.evaluate([limit], now=T0 + 5)
    assert _rows(postgres_url) == 1  # the sweep ran on the 1,000th call, after it wrote


def test_reset_forgets_every_row_of_the_client_and_no_other(pg):
    limit = Limit("c", "sliding_window", 1, 10)
    other = Limit("d", "sliding_window", 1, 10)
    for at in (T0, T0 + 10):
        pg.evaluate([limit], now=at)
        pg.evaluate([other], now=at)
    pg.reset(limit, now=T0 + 10)
    assert pg.evaluate([limit], now=T0 + 10).allowed
    assert not pg.evaluate([other], now=T0 + 10).allowed


def test_the_version_is_read_and_bumped(pg):
    assert pg.read_version() == 0
    assert pg.bump_version() == 1
    assert pg.evaluate([Limit("c", "fixed_window", 1, 10)], now=T0).version == 1


def test_a_forked_child_opens_its_own_connection(pg):
    limit = Limit("c", "fixed_window", 2, 3600)
    assert pg.evaluate([limit], now=T0).allowed  # the parent's connection is open
    pid = os.fork()
    if pid == 0:  # the child: its own connection; the parent's is left alone
        code = 0 if pg.evaluate([limit], now=T0).allowed else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not pg.evaluate([limit], now=T0).allowed  # the parent's still answers


def test_the_sites_own_options_are_kept(postgres_url):
    """A `search_path` given in the connection's options is where the engine installs
    its tables, and the engine sets nothing in the session itself."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS limits CASCADE")
        admin.execute("CREATE SCHEMA limits")
        defaults = admin.execute("SELECT current_setting('statement_timeout'), "
                                 "current_setting('lock_timeout')").fetchone()
    engine = PostgresEngine(postgres_url + "?options=-csearch_path%3Dlimits", timeout=1.5)
    try:
        assert engine.evaluate([Limit("c", "gcra", 1, 10)], now=T0).allowed
        assert engine.client.execute("SELECT current_setting('statement_timeout'), "
                                     "current_setting('lock_timeout')").fetchone() == defaults
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute(
                "SELECT to_regclass('limits.ratelimits_state_v1') IS NOT NULL").fetchone()[0]
    finally:
        engine.close()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("DROP SCHEMA limits CASCADE")


def test_a_call_waits_for_a_clients_lock_at_most_the_timeout(postgres_url):
    """Another call holding a client's lock (here a transaction of the test's own) keeps
    a decision of that client waiting `SOCKET_TIMEOUT` at most: then the store counts as
    unavailable and `on_error` decides, and other clients are decided meanwhile."""
    from ratelimits.engine.keynames import client_key

    limit = Limit("held", "fixed_window", 5, 60)
    engine = PostgresEngine(postgres_url, timeout=1.0)
    assert engine.evaluate([limit], now=T0).allowed  # the tables
    with psycopg.connect(postgres_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                       (LOCK_SPACE, client_key("rl:", limit)))
        started = time.monotonic()
        with pytest.raises(EngineUnavailable, match="lock timeout"):
            engine.evaluate([limit], now=T0)
        waited = time.monotonic() - started
        assert engine.evaluate([Limit("free", "fixed_window", 5, 60)], now=T0).allowed
    assert engine.evaluate([limit], now=T0).allowed  # released with the holder's transaction
    engine.close()
    # the lock's second (the server's lock_timeout said so), not forever: a call with no
    # answer at all is given up at twice it, with another message
    assert 0.95 <= waited < 2.0, waited


def test_decisions_need_read_committed_and_say_so(postgres_url):
    """Under repeatable read, the function's snapshot would be taken before a client's
    lock was granted, and miss what the previous holder committed: a database whose
    default is not read committed is refused with what to write (setting it in the
    engine's session would leak to the site's queries through a pool), and the option
    it names works."""
    rr = "?options=-cdefault_transaction_isolation%3Drepeatable%5C%20read"
    engine = PostgresEngine(postgres_url + rr)
    try:
        with pytest.raises(EngineError, match="need read committed transactions, and this "
                                              "session's default is repeatable read"):
            engine.evaluate([Limit("c", "fixed_window", 1, 10)], now=T0)
    finally:
        engine.close()
    told = rr + "%20-cdefault_transaction_isolation%3Dread%5C%20committed"
    engine = PostgresEngine(postgres_url + told)
    try:
        assert engine.evaluate([Limit("c", "fixed_window", 1, 10)], now=T0).allowed
    finally:
        engine.close()


def test_close_closes_every_threads_connection(pg):
    limit = Limit("c", "fixed_window", 10, 60)
    seen = []

    def call() -> None:
        pg.evaluate([limit], now=T0)
        seen.append(pg.client)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(conn) for conn in seen}) == 3  # one connection per thread
    pg.close()
    assert all(conn.closed for conn in seen)


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def test_a_server_out_of_reach_is_the_engines_error_and_opens_the_breaker():
    breaker = CircuitBreaker(failures=2, cooldown=60)
    engine = PostgresEngine(_dead_url(), breaker=breaker)
    limit = Limit("c", "fixed_window", 1, 10)
    for _ in range(2):
        with pytest.raises(EngineUnavailable, match="PostgreSQL did not answer"):
            engine.evaluate([limit])
    with pytest.raises(CircuitOpen):  # fails fast, no connection tried
        engine.evaluate([limit])


def test_a_server_that_never_answers_is_given_up_after_twice_the_timeout(postgres_url):
    """The engine's server processes paused (SIGSTOP): the statement is sent and nothing
    comes back, nor does the server's own statement_timeout. The call gives up, as the
    Redis engine's does after its socket timeout, and the next call once the server runs
    again opens a new connection. (One thread makes every call: each thread has a
    connection of its own.)"""
    engine = PostgresEngine(postgres_url, timeout=0.2)
    limit = Limit("c", "fixed_window", 5, 60)
    asked, told = threading.Event(), []
    outcomes: list[object] = []

    def calls() -> None:
        for _ in range(3):
            asked.wait(30)
            asked.clear()
            try:
                outcomes.append(engine.evaluate([limit], T0).allowed)
            except BaseException as exc:
                outcomes.append(exc)
            told.append(len(outcomes))

    def ask(n: int) -> None:
        asked.set()
        deadline = time.monotonic() + 30
        while len(told) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(told) == n, "the call waits for a server that never answers"

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    try:
        ask(1)  # connected, its functions installed
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            paused = [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")]
        assert paused  # the engine's session
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            ask(2)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        ask(3)
    finally:
        asked.set()
        caller.join(30)
        engine.close()
    assert outcomes[0] is True
    assert isinstance(outcomes[1], EngineUnavailable), outcomes
    assert outcomes[2] is True  # answered on a new connection


def test_what_it_cannot_decide_is_refused_clearly(pg):
    with pytest.raises(ValueError, match="adaptive concurrency is learnt in each process"):
        pg.evaluate([Limit("c", "adaptive", 10, 5)])
    with pytest.raises(ValueError, match="has no batch to lease"):
        pg.lease([Limit("c", "fixed_window", 10, 60)])


def test_a_batch_is_leased_and_spent_in_process(pg, postgres_url):
    engine = LocalFirst(pg)
    limit = Limit("c", "fixed_window", 3, 60, batch=2, name="b")
    assert [engine.evaluate([limit], now=T0).allowed for _ in range(4)] == [
        True, True, True, False]
    # two calls for three admissions: a lease of 2, then of the 1 left (and a refusal)
    assert engine.leases.units(limit) == 0
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT v[1] FROM ratelimits_state_v1 WHERE k LIKE '%%:' || %s",
                            (str(int(T0 // 60)),)).fetchone()[0] == 3


# -- choosing it -------------------------------------------------------------------------


def test_database_takes_an_alias_or_a_postgresql_url():
    assert build_config({"DATABASE": "default"})["DATABASE"] == "default"
    url = "postgresql://app@db.internal/app"
    assert build_config({"DATABASE": url})["DATABASE"] == url
    with pytest.raises(ImproperlyConfigured, match="a Redis URL goes in REDIS_URL"):
        build_config({"DATABASE": "redis://127.0.0.1:6379/0"})
    with pytest.raises(ImproperlyConfigured, match="sets REDIS_URL and DATABASE: the limits "
                                                   "live in one store"):
        build_config({"DATABASE": "default", "REDIS_URL": "redis://127.0.0.1:6379/0"})


def test_an_alias_gives_its_server_but_not_djangos_own_options():
    conninfo = conninfo_of({
        "ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "o'brien",
        "PASSWORD": "", "HOST": "db.internal", "PORT": 6432,
        "OPTIONS": {"sslmode": "require", "isolation_level": 1, "prepare_threshold": None}})
    assert psycopg.conninfo.conninfo_to_dict(conninfo) == {
        "dbname": "app", "user": "o'brien", "host": "db.internal", "port": "6432",
        "sslmode": "require"}
    with pytest.raises(ImproperlyConfigured, match=r"ENGINE is 'django\.db\.backends\.sqlite3'"):
        postgres_conninfo("default")  # the suite's SQLite
    with pytest.raises(ImproperlyConfigured, match="not an alias in DATABASES"):
        postgres_conninfo("other")


def test_a_site_pointing_at_postgresql_decides_there(settings, postgres_url):
    settings.RATELIMITS = {"DATABASE": postgres_url}
    engine = get_engine()
    assert isinstance(engine, LocalFirst) and isinstance(engine.store, PostgresEngine)
    assert is_shared()
    limit = Limit("c", "fixed_window", 1, 60)
    assert engine.evaluate([limit], now=T0).allowed
    assert not PostgresEngine(postgres_url).evaluate([limit], now=T0).allowed
    # a policy's batch is leased there: the request takes 5 units, spends one
    leased = Limit("l", "fixed_window", 10, 60, batch=5, name="l")
    assert engine.evaluate([leased], now=T0).allowed
    assert engine.leases.units(leased) == 4


def test_a_database_alias_that_is_not_postgresql_fails_the_checks(settings):
    from django.core.checks import run_checks

    settings.RATELIMITS = {"DATABASE": "default"}  # the suite's SQLite
    (error,) = [m for m in run_checks() if m.id == "ratelimits.E006"]
    assert "PostgreSQL only" in error.msg
    from ratelimits.checks import ensure_valid

    with pytest.raises(ImproperlyConfigured, match=r"PostgreSQL only .*ratelimits\.E006"):
        ensure_valid()  # what the middleware runs where servers run no checks


def test_forgetting_a_policys_figures_keeps_the_others(pg):
    for name in ("gone", "kept"):
        limit = Limit("c", "fixed_window", 1, 60, name=name)
        pg.evaluate([limit], now=T0)
        pg.evaluate([limit], now=T0)  # refused: an offender too
    pg.forget_figures("gone", now=T0)
    minute, hour = int(T0 // 60), int(T0 // 3600)
    assert pg.counters("gone", minute) == {} and pg.offenders("gone", hour) == []
    assert pg.counters("kept", minute) == {"a": 1, "r": 1}
    assert pg.offenders("kept", hour) == [("c", 1)]


def test_requests_naming_clients_in_opposite_orders_never_deadlock(pg):
    """Each request locks its clients in one order (of their hashes), whatever order its
    limits come in: two threads on connections of their own, crossing, never deadlock."""
    a = Limit("a", "fixed_window", 10_000, 3600)
    b = Limit("b", "sliding_log", 10_000, 3600)
    failures: list[Exception] = []
    start = threading.Barrier(2)

    def cross(limits: list[Limit]) -> None:
        start.wait()
        for _ in range(150):
            try:
                pg.evaluate(limits, now=T0)
            except EngineError as exc:  # a deadlock PostgreSQL broke would land here
                failures.append(exc)

    threads = [threading.Thread(target=cross, args=(order,)) for order in ([a, b], [b, a])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert pg.evaluate([a, b], now=T0).results[0].remaining == 10_000 - 301


def test_processes_sharing_the_limits_are_counted_by_their_heartbeat(postgres_url):
    """Each process beats on its version reads; `on_error="local"` divides by the count
    (two engines here stand for two processes: each has a name of its own)."""
    first = PostgresEngine(postgres_url, version_key="rl:version", beat_every=0)
    second = PostgresEngine(postgres_url, version_key="rl:version", beat_every=0)
    other_site = PostgresEngine(postgres_url, prefix="other:", version_key="v", beat_every=0)
    try:
        assert first.live_instances is None  # no beat yet
        first.read_version()
        assert first.live_instances == 1
        second.read_version()
        other_site.read_version()
        first.read_version()
        assert first.live_instances == second.live_instances == 2
        assert other_site.live_instances == 1  # another prefix counts apart
    finally:
        for engine in (first, second, other_site):
            engine.close()


def test_a_role_that_may_not_create_the_tables_is_told_what_to_grant(postgres_server):
    """On PostgreSQL 15 and later, `public` lets only the database's owner create."""
    import uuid

    role = f"rl_reader_{uuid.uuid4().hex[:8]}"
    name = f"ratelimits_owned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = postgres_server.rsplit("/", 1)[0].replace("postgres@", f"{role}@") + "/" + name
    engine = PostgresEngine(url)
    try:
        with pytest.raises(EngineError, match="grant the limiter's role CREATE"):
            engine.evaluate([Limit("c", "fixed_window", 1, 10)])
    finally:
        engine.close()
        with psycopg.connect(postgres_server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            admin.execute(f'DROP ROLE "{role}"')
