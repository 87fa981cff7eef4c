"""Fixtures for the Django app tests: clean engine, snapshot and Redis for every test."""

from __future__ import annotations

import pytest
from django.test import override_settings

from ratelimits.pipeline.state import reset_state
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock


@pytest.fixture(scope="session", autouse=True)
def _cache_on_fixture_redis(redis_url):
    """Point the default cache at the Redis that tests/conftest.py chose."""
    from django.conf import settings

    caches = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": redis_url}}
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def clean_state(redis_database):
    """An empty Redis database and no engine, config or snapshot left from another test.
    The database is emptied only when it holds keys, after the engine closed (its tally
    written now, never into the next test)."""
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
