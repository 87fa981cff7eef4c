"""The compiled snapshot: no queries per request, reloads on version change from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ratelimits.models import Policy
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.resolver import resolver

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def warm(client, path="/hello/", n=2):
    for _ in range(n):
        client.get(path)


def test_no_database_query_per_request_in_steady_state(
    client, make_policy, django_assert_num_queries
):
    make_policy(name="a", limit=100)
    make_policy(name="b", limit=100, key="user_or_ip", path="/hello/")
    warm(client)
    with django_assert_num_queries(0):
        for _ in range(5):
            assert client.get("/hello/").status_code == 200


def test_version_bump_makes_the_process_reload(client, make_policy, django_assert_num_queries):
    make_policy(name="a", limit=100)
    warm(client)
    # A change that sends no signal (as another process's save looks from here) ...
    Policy.objects.filter(name="a").update(limit=1)
    assert client.get("/hello/").status_code == 200  # still the old snapshot
    # ... then the version moves, as the other process's commit hook does.
    get_engine().bump_version()
    client.get("/hello/")  # notices the version and reloads
    assert client.get("/hello/").status_code == 429


def test_a_new_policy_applies_to_the_request_that_notices_it(client, make_policy):
    make_policy(name="a", limit=100)
    warm(client)
    Policy.objects.bulk_create(
        [
            Policy(
                name="new",
                mode="enforce",
                algorithm="fixed_window",
                limit=1,
                period=3600,
                key="ip",
                path="*",
            )
        ]
    )
    get_engine().bump_version()
    assert client.get("/hello/").status_code == 200  # charged to "new" right away
    assert client.get("/hello/").status_code == 429


def test_reload_when_another_process_bumps_the_version(client, make_policy, redis_url):
    make_policy(name="a", limit=100)
    warm(client)
    Policy.objects.filter(name="a").update(mode="off")
    assert client.get("/hello/").has_header("RateLimit")
    script = textwrap.dedent("""
        import os, django
        django.setup()
        from ratelimits.pipeline.engines import get_engine
        print(get_engine().bump_version())
    """)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_url}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    client.get("/hello/")
    assert not client.get("/hello/").has_header("RateLimit")  # "a" is off everywhere


def test_saving_in_this_process_applies_at_the_next_request(
    client, make_policy, django_capture_on_commit_callbacks
):
    policy = make_policy(name="a", limit=1, mode="shadow")
    warm(client)
    policy.mode = "enforce"
    with django_capture_on_commit_callbacks(execute=True):
        policy.save()
    assert client.get("/hello/").status_code == 429


def test_deleting_a_policy_unloads_it(client, make_policy, django_capture_on_commit_callbacks):
    policy = make_policy(name="a", limit=1)
    warm(client)
    with django_capture_on_commit_callbacks(execute=True):
        policy.delete()
    assert client.get("/hello/").status_code == 200


def test_failed_rebuild_keeps_the_last_good_snapshot(client, make_policy, monkeypatch, caplog):
    make_policy(name="a", limit=2)
    client.get("/hello/")

    def down(version):
        raise ConnectionError("database is gone")

    monkeypatch.setattr("ratelimits.pipeline.resolver.load_snapshot", down)
    get_engine().bump_version()
    assert client.get("/hello/").status_code == 200
    assert client.get("/hello/").status_code == 429  # policy "a" still applies
    assert "could not load the policies" in caplog.text and "database is gone" in caplog.text


def test_invalid_rows_are_skipped_not_fatal(client, make_policy, caplog):
    make_policy(name="good", limit=1)
    Policy.objects.bulk_create(
        [
            Policy(
                name="bad",
                mode="enforce",
                algorithm="fixed_window",
                limit=1,
                period=60,
                key="nonsense:",
                path="*",
            )
        ]
    )
    resolver.reset()
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    assert "bad" in caplog.text and "skipped" in caplog.text


def test_order_is_priority_then_specificity(make_policy):
    make_policy(name="all", path="*")
    make_policy(name="login", path="/login/")
    make_policy(name="urgent", path="*", priority=10)
    names = [p.name for p in resolver.snapshot().policies]
    assert names == ["urgent", "login", "all"]



def test_matching_keeps_that_order_whatever_scopes_are_asked_for(make_policy):
    """A request of one scope looks only at that scope's policies; of several, at all:
    either way in the snapshot's order, without the ids already charged."""
    make_policy(name="all", path="*")
    make_policy(name="api", path="*", scope="api", priority=5)
    make_policy(name="login", path="/login/")
    make_policy(name="urgent", path="*", priority=10)
    make_policy(name="api-login", path="/login/", scope="api")
    snap = resolver.snapshot()

    def names(scopes, exclude=frozenset()):
        return [p.name for p in snap.matching("/login", "GET", frozenset(scopes), exclude)]

    assert names({""}) == ["urgent", "login", "all"]
    assert names({"api"}) == ["api", "api-login"]
    assert names({"", "api"}) == ["urgent", "api", "api-login", "login", "all"]
    assert names({"other"}) == []
    urgent = next(p.id for p in snap.policies if p.name == "urgent")
    assert names({""}, {urgent}) == ["login", "all"]

# -- the database check: edits that moved no version --------------------------------------


def applied(response) -> str:
    return response.headers.get("RateLimit-Policy", "")


def test_an_edit_that_moved_no_version_reaches_the_process_after_db_check_every(
    client, make_policy, clock, any_store, django_assert_num_queries
):
    """Another process saved while the store was down, or on a store that is not shared:
    no version moved, and the policy table itself tells, read at most every few seconds."""
    from django.utils import timezone

    from ratelimits.pipeline.resolver import DB_CHECK_EVERY

    make_policy(name="a", limit=100, path="/hello/")
    assert applied(client.get("/hello/")) == '"a";q=100;w=3600'
    Policy.objects.filter(name="a").update(limit=1, updated=timezone.now())  # no signal
    clock.advance(DB_CHECK_EVERY - 0.1)
    with django_assert_num_queries(0):  # not yet: no query on the request path
        assert applied(client.get("/hello/")) == '"a";q=100;w=3600'
    clock.advance(0.1)
    with django_assert_num_queries(3):  # the fingerprint, then the policies and overrides
        assert applied(client.get("/hello/")) == '"a";q=1;w=3600'
    with django_assert_num_queries(0):  # read again only DB_CHECK_EVERY later
        for _ in range(3):
            assert applied(client.get("/hello/")) == '"a";q=1;w=3600'
    # a policy deleted without a signal is gone after the next check too
    Policy.objects.filter(name="a").delete()
    clock.advance(DB_CHECK_EVERY)
    assert applied(client.get("/hello/")) == ""


def test_an_unchanged_table_costs_one_query_per_check_and_no_reload(
    client, make_policy, clock, django_assert_num_queries
):
    from ratelimits.pipeline.resolver import DB_CHECK_EVERY

    make_policy(name="a", limit=100, path="/hello/")
    client.get("/hello/")
    snap = resolver.snapshot()
    for _ in range(3):
        clock.advance(DB_CHECK_EVERY)
        with django_assert_num_queries(1):
            client.get("/hello/")
        assert resolver.snapshot() is snap


def test_a_failed_check_keeps_the_snapshot_and_says_why(client, make_policy, clock, caplog):
    import logging

    from ratelimits.pipeline.resolver import DB_CHECK_EVERY
    from tests.pipeline.test_promises_reload import rename_policy_table

    make_policy(name="a", limit=2, path="/hello/")
    assert client.get("/hello/").status_code == 200
    rename_policy_table("ratelimits_policy_away")
    try:
        clock.advance(DB_CHECK_EVERY)
        with caplog.at_level(logging.WARNING, "ratelimits"):
            assert client.get("/hello/").status_code == 200
            assert client.get("/hello/").status_code == 429  # "a" still applies
    finally:
        rename_policy_table("ratelimits_policy", back="ratelimits_policy_away")
    assert "could not check the policies for changes (OperationalError" in caplog.text
