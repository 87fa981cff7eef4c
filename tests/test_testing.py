"""`ratelimits.testing`: policies for one test without the database, a clock the test
moves, counters from zero, and the pytest fixture."""

from __future__ import annotations

import re
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError

from ratelimits import runtime
from ratelimits.pipeline.resolver import resolver
from ratelimits.testing import START, Clock, limited

LOGIN = {"name": "login", "rate": "5/m", "algorithm": "sliding_log", "path": "/login/",
         "methods": "POST"}


def _posts(client, n, path="/login/"):
    return [client.post(path).status_code for _ in range(n)]


def test_policies_are_installed_without_the_database(client):
    # no `db` fixture: any query would fail the test
    with limited(LOGIN):
        assert _posts(client, 6) == [200] * 5 + [429]


def test_a_saved_policy_is_not_applied_inside_but_load_applies_it(client, make_policy):
    make_policy(name="saved", limit=1, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    with limited() as limits:
        assert [client.get("/hello/").status_code for _ in range(3)] == [200] * 3
        limits.load()
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    # outside, the database's policies and the store's counts again
    assert client.get("/hello/").status_code == 429
    assert resolver.pinned is None and runtime.clock() is runtime.REAL


def test_each_block_starts_with_no_counts(client):
    with limited(LOGIN):
        assert _posts(client, 6)[-1] == 429
    with limited(LOGIN) as limits:
        assert _posts(client, 5) == [200] * 5
        limits.reset()
        assert _posts(client, 5) == [200] * 5


def test_the_clock_stands_still_until_advanced(client):
    with limited(LOGIN, at=1_000_000.0) as limits:
        _posts(client, 5)
        assert client.post("/login/")["Retry-After"] == "60"
        limits.clock.advance(59.5)
        assert client.post("/login/")["Retry-After"] == "1"
        limits.clock.advance(0.5)
        assert _posts(client, 1) == [200]
        assert limits.clock.now() == 1_000_060.0


# -- where the clock starts ----------------------------------------------------------------

#: Periods a window is usually given: a second, a minute, an hour, a day.
USUAL_PERIODS = (1, 10, 60, 3600, 86400)


def test_the_clock_starts_at_a_fixed_midnight_where_every_usual_window_begins(ratelimits):
    assert START == 1_704_067_200.0  # 2024-01-01T00:00:00Z
    assert all(START % period == 0 for period in USUAL_PERIODS)
    with limited(LOGIN) as limits:
        assert limits.clock.now() == START
    assert ratelimits.clock.now() == START  # the pytest fixture too
    with limited(LOGIN, clock=Clock(5.0)) as limits:
        assert limits.clock.now() == START  # and a clock of your own given to it
    with limited(LOGIN, at=1_000_000.0) as limits:
        assert limits.clock.now() == 1_000_000.0  # unless told


def _retry_after(policy: dict, client, **where) -> str:
    """Retry-After of the refusal after a policy of 5 a minute admitted five."""
    with limited(policy, **where):
        assert _posts(client, 5) == [200] * 5
        refused = client.post("/login/")
    assert refused.status_code == 429
    return refused["Retry-After"]


@pytest.mark.parametrize(("algorithm", "retry_after"),
                         [("fixed_window", "60"), ("sliding_window", "72")])
def test_a_window_retry_after_is_the_same_whatever_the_wall_clock_says(
    client, monkeypatch, algorithm, retry_after
):
    """Run at the seconds 0, 10, 30, 50 and 59 of a minute (the wall clock is made to
    say so, nothing sleeps): the same Retry-After every time, where a clock started at
    the wall clock's time gave one per second of the minute."""
    policy = {**LOGIN, "algorithm": algorithm}
    minute = 1_750_000_020.0  # a whole minute
    assert minute % 60 == 0
    seen, from_the_wall = set(), []
    for second in (0, 10, 30, 50, 59):
        monkeypatch.setattr(time, "time", lambda second=second: minute + second)
        seen.add(_retry_after(policy, client))
        from_the_wall.append(_retry_after(policy, client, at=time.time()))
    monkeypatch.undo()
    assert seen == {retry_after}
    assert len(set(from_the_wall)) == 5  # the scenario does depend on where the clock starts
    if algorithm == "sliding_window":
        assert from_the_wall == ["72", "62", "42", "22", "13"]


def test_a_waiting_request_moves_the_clock_instead_of_sleeping(client):
    queue = {"name": "q", "algorithm": "leaky_bucket", "rate": "1/4s", "burst": 1,
             "path": "/hello/"}
    with limited(queue, at=0.0) as limits:
        started = time.monotonic()
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 200]
        assert limits.clock.now() == 4.0  # the second waited its turn on the test's clock
        assert time.monotonic() - started < 2.0


def test_an_invalid_policy_says_what_to_fix():
    with pytest.raises(ValidationError, match="burst"):
        limited({"name": "bad", "rate": "5/m", "algorithm": "fixed_window", "burst": 3}
                ).__enter__()
    with pytest.raises(ValueError, match=re.escape("'5 per minute' is not N/<unit>")):
        limited({"name": "bad", "rate": "5 per minute"}).__enter__()


@limited(LOGIN)
def test_as_a_decorator(client):
    assert _posts(client, 6) == [200] * 5 + [429]


@limited(LOGIN)
class TestAsAClassDecorator:
    """Each test of a decorated class starts from zero counts."""

    def test_first(self, client):
        assert _posts(client, 6)[-1] == 429

    def test_second(self, client):
        assert _posts(client, 6)[-1] == 429


def test_an_async_test(async_client):
    @limited(LOGIN)
    async def test():
        return [(await async_client.post("/login/")).status_code for _ in range(6)]

    assert async_to_sync(test)() == [200] * 5 + [429]


def test_the_fixture_starts_with_no_policy_and_a_frozen_clock(client, ratelimits):
    assert _posts(client, 8) == [200] * 8
    before = ratelimits.clock.now()
    assert ratelimits.clock.now() == before
    ratelimits.use(LOGIN)
    assert _posts(client, 6)[-1] == 429


def test_a_clock_only_moves_forward():
    with pytest.raises(ValueError, match="forward"):
        Clock(0).advance(-1)


def _declared_late(settings, name):
    """A URLconf whose view module is imported only now, as a server imports it at its
    first request: a limit of 2 a minute declared at that moment."""
    import types

    from django.http import HttpResponse
    from django.urls import path

    from ratelimits.decorators import ratelimit

    @ratelimit(name=name, rate="2/m")
    def view(request):
        return HttpResponse("late")

    urls = types.ModuleType(f"{name}_urls")
    urls.urlpatterns = [path("late/", view)]
    settings.ROOT_URLCONF = urls


def test_a_limit_declared_inside_limited_applies(client, settings, forget_declarations):
    with limited(LOGIN):
        assert _posts(client, 1) == [200]  # the snapshot is pinned before the declaration
        _declared_late(settings, "late-in-test")
        assert [client.get("/late/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
def test_a_limit_declared_after_the_first_request_applies(client, settings,
                                                          forget_declarations):
    assert client.get("/hello/").status_code == 200  # the snapshot is built: no policy
    _declared_late(settings, "late-in-server")
    assert [client.get("/late/").status_code for _ in range(3)] == [200, 200, 429]
