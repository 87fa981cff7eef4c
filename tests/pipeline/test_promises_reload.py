"""Promises docs/scale-out.md ("Changes take effect everywhere") and docs/reliability.md
make about policy reloads, held by tests that drive real requests.

- A policy version change met by many threads at once is loaded once, and every one of
  those requests is decided with the new policies; a stuck reload holds them only briefly.
- A failed reload keeps the last good snapshot, logs why, and retries a second later
  (once, however many threads meet it).

The policy table is made unreadable for real (renamed), never replaced by a stand-in.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ratelimits.models import Policy
from ratelimits.pipeline import resolver as resolver_module
from ratelimits.pipeline.changes import listener
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.resolver import RETRY_AFTER_FAILURE, resolver


def policy_queries(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "ratelimits_policy" in q["sql"]]


# -- many threads meet a policy change at once ---------------------------------------------

THREADS = 16


class Arrivals:
    """The threads that met a policy change; a reload can wait for all of them."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.changed = threading.Condition()

    def arrive(self) -> None:
        with self.changed:
            self.threads.add(threading.get_ident())
            self.changed.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.threads) >= n, timeout)


def hold_reload_for(n: int, monkeypatch) -> Arrivals:
    """Hold the next policy reload until n threads have met the change. A thread meets it
    either in a store reply (`observe`) or, once the listener has heard the version move,
    as a stale snapshot; both ask `_rebuild`, so arrivals are counted there."""
    arrivals = Arrivals()
    rebuild, load = resolver._rebuild, resolver_module.load_snapshot

    def rebuilding(version, *, wait):
        arrivals.arrive()
        return rebuild(version, wait=wait)

    def slow_load(version):
        arrivals.wait_for(n, timeout=20)
        return load(version)

    monkeypatch.setattr(resolver, "_rebuild", rebuilding)
    monkeypatch.setattr(resolver_module, "load_snapshot", slow_load)
    return arrivals


def in_threads(n: int, work, timeout: float = 60.0) -> list:
    """Run `work(i)` in n threads started together; their results, or the first error."""
    start = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        try:
            start.wait(30)
            results[i] = work(i)
        except BaseException as exc:  # reported in the test's own thread
            results[i] = exc
        finally:
            connection.close()  # this thread's database connection

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a request thread hung"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the request threads read committed rows
@pytest.mark.parametrize("told_by", ["reply", "push"])
def test_a_policy_change_met_by_many_threads_is_loaded_once_and_applies_to_all(
    make_policy, monkeypatch, told_by
):
    """The threads learn of the change from the store's replies (no listener), or the
    listener heard it first and the first thread finds its snapshot stale."""
    make_policy(name="old", limit=1000, key="global")
    assert Client().get("/hello/").status_code == 200  # the snapshot, at this version
    if told_by == "push":
        assert until(lambda: listener.watch is not None)  # listening before the change
    else:
        listener.stop()
    # Another process adds a policy: one that counts every request, and then the version.
    Policy.objects.bulk_create(
        [
            Policy(
                name="fresh",
                mode="enforce",
                algorithm="fixed_window",
                limit=THREADS,
                period=3600,
                key="global",
                path="/hello/",
            )
        ]
    )
    get_engine().bump_version()
    if told_by == "push":
        assert until(lambda: resolver._stale)  # heard before any thread asks

    # Hold the reload open until every thread has noticed the new version, so they all
    # meet it while it runs (otherwise the first reload may finish before the last starts).
    arrivals = hold_reload_for(THREADS, monkeypatch)
    monkeypatch.setattr(resolver_module, "WAIT_FOR_RELOAD", 30.0)  # a loaded CI machine

    def request(i: int) -> tuple[int, list[str]]:
        with CaptureQueriesContext(connection) as ctx:
            status = Client().get("/hello/").status_code
        return status, policy_queries(ctx)

    results = in_threads(THREADS, request)
    assert len(arrivals.threads) == THREADS  # every one of them noticed the change
    assert [status for status, _ in results] == [200] * THREADS
    assert sum(len(queries) for _, queries in results) == 1  # one reload for all
    # Every one of the 16 requests was charged to "fresh": its quota is spent.
    refused = Client().get("/hello/")
    assert refused.status_code == 429 and '"fresh"' in refused["RateLimit"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stuck_reload_holds_the_other_requests_only_briefly(make_policy, monkeypatch):
    make_policy(name="old", limit=1000, key="global")
    assert Client().get("/hello/").status_code == 200
    get_engine().bump_version()  # another process saved a policy

    stuck, release = threading.Event(), threading.Event()
    load = resolver_module.load_snapshot

    def stuck_load(version):  # a database that takes its time to answer
        stuck.set()
        release.wait(30)
        return load(version)

    monkeypatch.setattr(resolver_module, "load_snapshot", stuck_load)
    reloading = threading.Thread(target=lambda: (Client().get("/hello/"), connection.close()))
    reloading.start()
    try:
        assert stuck.wait(10)

        def other(i: int) -> tuple[float, object]:
            started = time.monotonic()
            response = Client().get("/hello/")
            return time.monotonic() - started, response

        [(waited, response)] = in_threads(1, other, timeout=10)
    finally:
        release.set()
        reloading.join(30)
    # It waited for the reload a while, then went on with the last good snapshot.
    assert resolver_module.WAIT_FOR_RELOAD <= waited < 5.0
    assert response.status_code == 200 and '"old"' in response["RateLimit"]


# -- a failed reload keeps the last snapshot and retries -----------------------------------


def rename_policy_table(to: str, back: str = "ratelimits_policy") -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{back}" RENAME TO "{to}"')


@pytest.mark.slow
def test_a_failed_reload_keeps_the_last_snapshot_then_retries(client, make_policy, caplog):
    make_policy(name="a", limit=2, path="/hello/")
    assert client.get("/hello/").status_code == 200
    # Another process turns "a" off (no signal here) and publishes a new version ...
    Policy.objects.filter(name="a").update(mode="off")
    get_engine().bump_version()
    # ... while this process cannot read the policy table.
    rename_policy_table("ratelimits_policy_away")
    try:
        failed_at = time.monotonic()
        with caplog.at_level(logging.ERROR, "ratelimits"):
            assert client.get("/hello/").status_code == 200  # notices the version, fails
            assert client.get("/hello/").status_code == 429  # "a" still applies
        assert "could not load the policies (OperationalError" in caplog.text
        assert "ratelimits_policy" in caplog.text and "keeping the previous ones" in caplog.text
    finally:
        rename_policy_table("ratelimits_policy", back="ratelimits_policy_away")

    # The database is back; the next attempt comes RETRY_AFTER_FAILURE after the failure.
    deadline = time.monotonic() + RETRY_AFTER_FAILURE + 10
    with CaptureQueriesContext(connection) as ctx:
        while True:
            response = client.get("/hello/")
            if response.status_code == 200 and not response.has_header("RateLimit"):
                break  # "a" is off here too
            assert time.monotonic() < deadline, "the new policies never arrived"
            time.sleep(0.05)
    assert time.monotonic() - failed_at >= RETRY_AFTER_FAILURE
    assert len(policy_queries(ctx)) == 1  # one retry, not one per request meanwhile


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_many_threads_meeting_a_failed_reload_query_once(make_policy, monkeypatch, caplog):
    make_policy(name="old", limit=1000, key="global")
    assert Client().get("/hello/").status_code == 200
    get_engine().bump_version()
    arrivals = hold_reload_for(THREADS, monkeypatch)  # every thread meets it, then it fails
    monkeypatch.setattr(resolver_module, "WAIT_FOR_RELOAD", 30.0)

    def request(i: int) -> tuple[object, list[str]]:
        with CaptureQueriesContext(connection) as ctx:
            response = Client().get("/hello/")
        return response, policy_queries(ctx)

    rename_policy_table("ratelimits_policy_away")  # committed: the threads see it too
    try:
        with caplog.at_level(logging.ERROR, "ratelimits"):
            results = in_threads(THREADS, request)
    finally:
        rename_policy_table("ratelimits_policy", back="ratelimits_policy_away")
    assert len(arrivals.threads) == THREADS
    assert sum(len(queries) for _, queries in results) == 1
    assert caplog.text.count("could not load the policies") == 1
    # every request was still decided by the last good snapshot
    assert all(r.status_code == 200 and '"old"' in r["RateLimit"] for r, _ in results)


# -- when a saved policy applies (docs/demo.md, "When a saved policy applies") -------------


def _saved_elsewhere(**fields) -> None:
    """A policy saved by another process (`manage.py shell`, another worker): its row is
    in the table, but no signal of this process ran (the test's transaction never
    commits, so the save's on-commit publication never happens here)."""
    values = {"name": "fresh", "mode": "enforce", "algorithm": "fixed_window", "limit": 1,
              "period": 3600, "key": "ip", "path": "/hello/", **fields}
    policy = Policy(**values)
    policy.full_clean()
    policy.save()


def _applies(response) -> bool:
    return '"fresh"' in response.get("RateLimit-Policy", "")


def test_on_the_in_process_engine_another_process_save_applies_within_db_check_every(
    memory_store, client, make_policy, clock, django_assert_num_queries
):
    """The bound docs/demo.md states: two seconds, read on a request, never a query per
    request. The time is the app's clock, moved by the test."""
    from ratelimits.pipeline.resolver import DB_CHECK_EVERY

    assert DB_CHECK_EVERY == 2.0
    make_policy(name="old", limit=100, path="/hello/")
    assert client.get("/hello/").status_code == 200  # the snapshot, and the tables read
    _saved_elsewhere()
    clock.advance(DB_CHECK_EVERY - 0.01)
    with django_assert_num_queries(0):  # not yet, and no query on the request path
        assert not any(_applies(client.get("/hello/")) for _ in range(3))
    clock.advance(0.01)
    first = client.get("/hello/")  # the first request two seconds after the save
    assert _applies(first) and first.status_code == 200
    assert client.get("/hello/").status_code == 429  # "fresh": 1 an hour
    clock.advance(DB_CHECK_EVERY - 0.01)
    with django_assert_num_queries(0):  # read again only two seconds later
        client.get("/hello/")


def test_on_the_in_process_engine_a_save_in_the_serving_process_applies_at_once(
    memory_store, client, make_policy, clock
):
    make_policy(name="old", limit=100, path="/hello/")
    assert client.get("/hello/").status_code == 200
    make_policy(name="fresh", limit=1, path="/hello/")  # saved and committed here (admin)
    assert _applies(client.get("/hello/"))  # the next request, with no time passed


def test_on_redis_another_process_save_applies_at_the_next_request_redis_decides(
    client, make_policy, clock
):
    make_policy(name="old", limit=100, path="/hello/")
    assert client.get("/hello/").status_code == 200
    _saved_elsewhere()
    get_engine().bump_version()  # what the other process's commit publishes
    # the next request learns the version from its reply: "fresh", new to it, applies to it
    assert _applies(client.get("/hello/"))
    assert client.get("/hello/").status_code == 429
