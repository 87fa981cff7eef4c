"""Which glue layer decides a request: the view a path goes to is looked up once per
URLconf, and looked up again when the URLconf changes."""

from __future__ import annotations

from django.test import RequestFactory, override_settings
from django.urls import clear_url_caches, path

from ratelimits.pipeline.resolver import resolver
from ratelimits.pipeline.routing import route_of, throttle_decides


def test_a_scoped_view_is_left_to_its_throttle_under_the_urlconf_in_force(make_policy):
    make_policy(name="items", scope="items")
    snap = resolver.snapshot()
    rf = RequestFactory()

    assert throttle_decides(rf.get("/api/items/"), snap)  # DRF's PolicyThrottle decides
    assert throttle_decides(rf.get("/api/items/"), snap)  # the path remembered
    assert not throttle_decides(rf.get("/hello/"), snap)
    assert not throttle_decides(rf.get("/no/such/page/"), snap)

    # Another URLconf where the path goes nowhere: the middleware decides it.
    with override_settings(ROOT_URLCONF="tests.support.urls_backoffice"):
        assert not throttle_decides(rf.get("/api/items/"), snap)
    assert throttle_decides(rf.get("/api/items/"), snap)

    # A request's own URLconf (set by a middleware) is the one resolved.
    request = rf.get("/api/items/")
    request.urlconf = "tests.support.urls_backoffice"
    assert not throttle_decides(request, snap)


def test_urls_changed_in_place_are_seen_after_clear_url_caches(make_policy):
    from tests import urls

    make_policy(name="items", scope="items")
    snap = resolver.snapshot()
    rf = RequestFactory()
    assert not throttle_decides(rf.get("/api/later/"), snap)

    added = path("api/later/", urls.Items.as_view())
    urls.urlpatterns.append(added)
    try:
        clear_url_caches()  # what a project that edits its URL patterns calls
        assert throttle_decides(rf.get("/api/later/"), snap)
    finally:
        urls.urlpatterns.remove(added)
        clear_url_caches()
    assert not throttle_decides(rf.get("/api/later/"), snap)


# -- routes: worked out once per snapshot -------------------------------------------------

UNSCOPED = frozenset({""})


def test_a_route_is_worked_out_once_per_snapshot_and_url_resolver(make_policy):
    make_policy(name="items", scope="items")
    snap = resolver.snapshot()
    rf = RequestFactory()

    first = route_of(rf.get("/api/items/"), "GET", UNSCOPED, snap)
    assert first.deferred  # the view's throttle decides it
    assert route_of(rf.get("/api/items/"), "GET", UNSCOPED, snap) is first  # looked up
    with override_settings(ROOT_URLCONF="tests.support.urls_backoffice"):
        assert not route_of(rf.get("/api/items/"), "GET", UNSCOPED, snap).deferred
    assert route_of(rf.get("/api/items/"), "GET", UNSCOPED, snap).deferred  # worked out again

    # A policy saved since: the newer snapshot works its routes out afresh.
    assert [p.name for p in route_of(rf.get("/hello/"), "GET", UNSCOPED, snap).policies] == []
    make_policy(name="hello", path="/hello/")
    newer = resolver.snapshot()
    assert newer is not snap
    assert [p.name for p in route_of(rf.get("/hello/"), "GET", UNSCOPED, newer).policies] == [
        "hello"]


def test_a_route_sees_urls_changed_in_place_after_clear_url_caches(make_policy):
    from tests import urls

    make_policy(name="items", scope="items")
    snap = resolver.snapshot()
    rf = RequestFactory()
    assert not route_of(rf.get("/api/later/"), "GET", UNSCOPED, snap).deferred

    added = path("api/later/", urls.Items.as_view())
    urls.urlpatterns.append(added)
    try:
        clear_url_caches()
        assert route_of(rf.get("/api/later/"), "GET", UNSCOPED, snap).deferred
    finally:
        urls.urlpatterns.remove(added)
        clear_url_caches()
    assert not route_of(rf.get("/api/later/"), "GET", UNSCOPED, snap).deferred


def test_a_changed_redirect_setting_reaches_the_next_request(client, make_policy, settings):
    make_policy(name="a", limit=1)
    # CommonMiddleware redirects /hello to /hello/: left alone, never counted
    assert [client.get("/hello").status_code for _ in range(3)] == [301, 301, 301]
    settings.APPEND_SLASH = False  # now the request itself is answered: and counted
    assert [client.get("/hello").status_code for _ in range(2)] == [404, 429]


def test_a_request_is_decided_where_settings_name_no_urlconf(make_policy, settings):
    """A middleware driven without URLs (a RequestFactory in a script, settings without
    ROOT_URLCONF) still has its requests decided, never an error admitting them all."""
    from django.http import HttpResponse

    from ratelimits.middleware import RateLimitMiddleware

    make_policy(name="a", limit=2)
    del settings.ROOT_URLCONF
    middleware = RateLimitMiddleware(lambda request: HttpResponse("hello"))
    rf = RequestFactory()
    assert [middleware(rf.get("/hello/")).status_code for _ in range(3)] == [200, 200, 429]
