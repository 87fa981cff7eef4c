"""The peers' suites as they run, one test after another in one process: each test's
`setUp` clears Django's cache (on a migrated site, the Redis the compat layers count in:
a FLUSHDB), and DRF's tests set the throttle's `timer` back to 0 after others ran at the
real time. The process keeps what it remembers across those tests, so what it remembers
must not outlive the store's reset, nor answer a request made "before" it was learnt."""

from __future__ import annotations

import time

import pytest
from django.core.cache import cache
from django.test import RequestFactory
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from ratelimits.compat.django_ratelimit.decorators import ratelimit
from ratelimits.compat.drf import UserRateThrottle
from ratelimits.pipeline.changes import listener
from ratelimits.pipeline.engines import get_engine

pytestmark = pytest.mark.django_db


class ThreePerSecond(UserRateThrottle):
    rate = "3/sec"
    scope = "store-reset-seconds"


class ThrottledView(APIView):
    throttle_classes = (ThreePerSecond,)

    def get(self, request):
        return Response("foo")


def _forgotten() -> None:
    """Wait, at most the half second the docs promise, until this process has heard of
    the flush and dropped what it remembers: the store tells the listener's connection
    beside its reply to the flush, and a loaded machine may run the test's next line
    before that message is read."""
    deadline = time.monotonic() + 0.5
    while get_engine().denied.refused or listener.reading:
        assert time.monotonic() < deadline, "the flush was not heard within 0.5 s"
        time.sleep(0.002)


def _listening() -> None:
    """Wait until this process's listener has connected (it starts with the first
    request; a real site's first requests come long before any reset)."""
    deadline = time.monotonic() + 5
    while listener.watch is None or listener.reading:
        assert time.monotonic() < deadline, "the listener did not connect"
        time.sleep(0.005)


@pytest.fixture(autouse=True)
def _real_timer():
    yield
    ThreePerSecond.timer = UserRateThrottle.timer


def test_drf_timer_set_back_to_zero_after_a_test_at_the_real_time():
    request = APIRequestFactory().get("/")
    # DRF's test_requests_are_throttled: at the real time
    for _ in range(4):
        response = ThrottledView.as_view()(request)
    assert response.status_code == 429
    # the next test: setUp clears the cache, then test_request_throttling_expires
    cache.clear()
    ThreePerSecond.timer = lambda self: 0
    for _ in range(4):
        response = ThrottledView.as_view()(request)
    assert response.status_code == 429
    assert int(response["Retry-After"]) <= 1  # not the 57 years to the real time
    ThreePerSecond.timer = lambda self: 1
    assert ThrottledView.as_view()(request).status_code == 200


def test_django_ratelimit_cache_cleared_between_tests(clock):
    @ratelimit(key="ip", rate="1/m", block=False)
    def view(request):
        return request.limited

    assert not view(RequestFactory().get("/"))
    _listening()
    assert view(RequestFactory().get("/"))  # refused, and remembered: the clock stands still
    assert view(RequestFactory().get("/"))
    cache.clear()  # the next test's setUp
    _forgotten()
    assert not view(RequestFactory().get("/"))
    assert view(RequestFactory().get("/"))


def test_a_refusal_outlives_no_flush_made_by_another_process(clock, redis_url):
    """The same, the store flushed by another connection (`redis-cli FLUSHDB`)."""
    import redis

    @ratelimit(key="ip", rate="1/m", block=False)
    def view(request):
        return request.limited

    assert not view(RequestFactory().get("/"))
    _listening()
    assert view(RequestFactory().get("/"))
    other = redis.Redis.from_url(redis_url)
    other.flushdb()
    other.close()
    _forgotten()
    assert not view(RequestFactory().get("/"))
