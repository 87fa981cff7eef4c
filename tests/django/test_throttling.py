"""The DRF throttle: scoped policies, Retry-After, and once-only charging beside the middleware."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings

from ratelimits.throttling import PolicyThrottle

pytestmark = pytest.mark.django_db

MW = "ratelimits.middleware.RateLimitMiddleware"


def statuses(client, path, n):
    return [client.get(path).status_code for _ in range(n)]


def test_scoped_policy_applies_to_views_with_that_scope_only(client, make_policy):
    make_policy(name="items", scope="items", limit=2)
    assert statuses(client, "/api/items/", 3) == [200, 200, 429]
    assert statuses(client, "/api/plain/", 3) == [200, 200, 200]  # no throttle_scope
    assert statuses(client, "/hello/", 3) == [200, 200, 200]  # not a DRF view


def test_drf_rejection_has_retry_after_and_the_headers(client, make_policy):
    make_policy(name="items", scope="items", limit=1, period=60)
    client.get("/api/items/")
    response = client.get("/api/items/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    # The middleware, when installed, adds the throttle's decision to the headers.
    assert response["RateLimit-Policy"] == '"items";q=1;w=60'


def test_unscoped_policy_charges_once_with_middleware_and_throttle(client, make_policy, any_store):
    make_policy(name="everything", limit=3)
    assert statuses(client, "/api/items/", 4) == [200, 200, 200, 429]


def test_without_the_middleware_the_throttle_applies_unscoped_policies(
    client, make_policy, settings
):
    settings.MIDDLEWARE = [m for m in django_settings.MIDDLEWARE if m != MW]
    make_policy(name="everything", limit=2)
    assert statuses(client, "/api/plain/", 3) == [200, 200, 429]
    assert statuses(client, "/hello/", 3) == [200, 200, 200]  # no middleware, no DRF


def test_throttle_only_concurrency_slot_is_freed_when_the_request_finishes(
    client, make_policy, settings
):
    settings.MIDDLEWARE = [m for m in django_settings.MIDDLEWARE if m != MW]
    make_policy(name="single", algorithm="concurrency", limit=1, scope="items")
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]


def test_wait_is_whole_seconds_at_least_one(make_policy, rf):
    from rest_framework.request import Request

    make_policy(name="items", scope="items", limit=1, period=1)
    view = type("V", (), {"throttle_scope": "items"})()
    throttle = PolicyThrottle()
    assert throttle.allow_request(Request(rf.get("/x")), view) is True
    throttle = PolicyThrottle()
    assert throttle.allow_request(Request(rf.get("/x")), view) is False
    assert throttle.wait() >= 1 and throttle.wait() == int(throttle.wait())
