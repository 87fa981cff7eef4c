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


# -- one decision per request: the middleware and the throttle together ------------------


def test_a_scoped_view_costs_one_store_call_for_all_its_policies(
    client, make_policy, private_redis, settings
):
    """Unscoped and scoped policies of a DRF view decided in one FCALL (INFO
    commandstats), the middleware and PolicyThrottle both installed."""
    import redis

    from tests.pipeline.test_round_trips import commands

    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    make_policy(name="site", limit=1000, period=60)
    make_policy(name="per-ip-items", limit=1000, period=60, scope="items")
    make_policy(name="all-items", limit=1000, period=60, scope="items", key="global")
    assert client.get("/api/items/").status_code == 200  # scripts and snapshot loaded
    direct = redis.Redis.from_url(private_redis.url)
    before = commands(direct)["fcall"]
    for _ in range(10):
        response = client.get("/api/items/")
        assert response.status_code == 200
        # every policy was decided, and the headers still come from the middleware
        assert response.has_header("RateLimit")
    assert commands(direct)["fcall"] - before == 10
    assert observe_hour("site").admitted == 11 and observe_hour("all-items").admitted == 11


def observe_hour(name):
    from ratelimits.ops import observe

    return observe.last_hour([name])[name]


def test_a_request_the_scoped_policy_refuses_charges_the_unscoped_ones_nothing(
    client, make_policy, any_store
):
    make_policy(name="site", limit=100)
    make_policy(name="items", limit=1, scope="items")
    assert statuses(client, "/api/items/", 3) == [200, 429, 429]
    site = observe_hour("site")
    assert site.admitted == 1  # only the admitted request was charged to "site"
    assert site.spared == 2  # the refused ones: admitted by it, refused by "items"
    assert statuses(client, "/hello/", 1) == [200]


def test_drf_refusing_before_its_throttles_still_meets_the_unscoped_policies(
    client, make_policy, any_store
):
    """An anonymous request to a view that requires a user: DRF answers 403 before its
    throttles run; the unscoped policies are decided all the same (a token guesser stays
    limited), and over the limit the answer is the 429."""
    make_policy(name="items", limit=100, scope="items")  # the view's scope has a policy
    make_policy(name="site", limit=2)
    assert statuses(client, "/api/private/", 4) == [403, 403, 429, 429]
    assert observe_hour("site").rejected == 2


def test_the_async_stack_leaves_a_scoped_view_to_the_throttle_too(
    async_client, make_policy, django_db_blocker
):
    from asgiref.sync import async_to_sync

    make_policy(name="site", limit=100)
    make_policy(name="items", limit=1, scope="items")
    make_policy(name="guard", limit=1, path="/api/private/")

    async def run():
        items = [(await async_client.get("/api/items/")).status_code for _ in range(2)]
        private = [(await async_client.get("/api/private/")).status_code for _ in range(2)]
        return items, private

    items, private = async_to_sync(run)()
    assert items == [200, 429]
    assert private == [403, 429]
    assert observe_hour("site").admitted == 2  # /api/items/ once, /api/private/ once
