"""The request path under requests that try to slip past it or to abuse its logs."""

from __future__ import annotations

import logging
import types

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.test import Client
from rest_framework.request import Request

from ratelimits.throttling import PolicyThrottle

pytestmark = pytest.mark.django_db


def statuses(client, method, path, n, **extra):
    return [getattr(client, method)(path, **extra).status_code for _ in range(n)]


# -- HEAD is served by the GET view ------------------------------------------------------


def test_head_is_refused_once_get_is_limited(client, make_policy, any_store):
    make_policy(name="get-only", limit=2, methods="GET", path="/hello/")
    assert statuses(client, "get", "/hello/", 2) == [200, 200]
    assert client.head("/hello/").status_code == 429


def test_head_counts_as_a_unit_of_the_get_policy(client, make_policy):
    make_policy(name="get-only", limit=2, methods="GET", path="/hello/")
    assert client.head("/hello/").status_code == 200
    assert statuses(client, "get", "/hello/", 2) == [200, 429]


def test_a_post_policy_does_not_match_head(client, make_policy):
    make_policy(name="post-only", limit=1, methods="POST", path="/hello/")
    assert statuses(client, "head", "/hello/", 3) == [200, 200, 200]


# -- a view function answers every method with its body ------------------------------------


def answers(client, method, path, n):
    return [client.generic(method, path).status_code for _ in range(n)]


def test_options_on_a_view_function_is_counted_by_the_get_policy(client, make_policy,
                                                                  any_store):
    make_policy(name="get-only", limit=2, methods="GET", path="/hello/")
    assert answers(client, "OPTIONS", "/hello/", 8) == [200, 200] + [429] * 6


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "PROPFIND", "X-WEIRD"])
def test_a_method_a_view_function_does_not_name_spends_the_get_quota(client, make_policy,
                                                                     method):
    make_policy(name="get-only", limit=2, methods="GET", path="/hello/")
    assert answers(client, "GET", "/hello/", 1) == [200]
    assert answers(client, method, "/hello/", 2) == [200, 429]
    assert answers(client, "GET", "/hello/", 1) == [429]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_the_writes_a_view_names_stay_outside_a_get_policy(client, make_policy, method):
    make_policy(name="get-only", limit=1, methods="GET", path="/hello/")
    assert answers(client, method, "/hello/", 3) == [200, 200, 200]
    assert answers(client, "GET", "/hello/", 2) == [200, 429]


def test_an_options_policy_still_counts_options_alone(client, make_policy):
    make_policy(name="options-only", limit=1, methods="OPTIONS", path="/hello/")
    assert answers(client, "GET", "/hello/", 2) == [200, 200]
    assert answers(client, "OPTIONS", "/hello/", 2) == [200, 429]


def test_options_on_a_view_function_is_counted_under_asgi(make_policy):
    from django.test import AsyncClient

    make_policy(name="get-only", limit=1, methods="GET", path="/async/")

    async def scenario():
        client = AsyncClient()
        return [(await client.options("/async/")).status_code for _ in range(3)]

    assert async_to_sync(scenario)() == [200, 429, 429]


def test_a_class_based_view_answers_options_without_spending_the_get_quota(client,
                                                                            make_policy):
    # Django's View answers OPTIONS (and refuses methods it has no handler for) without
    # running `get`: nothing of the GET policy's to count
    make_policy(name="get-only", limit=1, methods="GET", path="/page/")
    assert answers(client, "OPTIONS", "/page/", 3) == [200, 200, 200]
    assert answers(client, "PROPFIND", "/page/", 2) == [405, 405]
    assert answers(client, "GET", "/page/", 2) == [200, 429]


def test_a_class_based_views_options_is_counted_by_an_options_policy(client, make_policy):
    make_policy(name="options-only", limit=1, methods="OPTIONS", path="/page/")
    assert answers(client, "OPTIONS", "/page/", 2) == [200, 429]


def test_a_declared_get_limit_counts_options_on_its_view_function(settings):
    from django.http import HttpResponse
    from django.urls import path

    from ratelimits.decorators import ratelimit
    from ratelimits.pipeline.declared import registry

    before = dict(registry.declared)

    @ratelimit(name="reads", rate="2/m", methods="GET")
    def report(request):
        return HttpResponse("report")

    urls = types.ModuleType("options_urls")
    urls.urlpatterns = [path("report/", report)]
    settings.ROOT_URLCONF = urls
    registry.forget_written()
    try:
        client = Client()
        assert answers(client, "OPTIONS", "/report/", 3) == [200, 200, 429]
        assert answers(client, "POST", "/report/", 1) == [200]
    finally:
        registry.restore(before)
        registry.forget_written()


# -- log injection -------------------------------------------------------------------------

FORGED = "/hello/%0d%0aratelimits: forged line"


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ratelimits"]


def _assert_escaped(messages):
    assert messages
    for message in messages:
        assert "\r" not in message and "\n" not in message, message
        assert "\\r\\n" in message, message


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_a_crlf_path_cannot_forge_a_log_line(client, make_policy, caplog, mode):
    make_policy(name="everything", mode=mode, limit=1, path="*")
    with caplog.at_level(logging.INFO, logger="ratelimits"):
        statuses(client, "get", FORGED, 2)
    messages = _lines(caplog)
    _assert_escaped(messages)
    record = next(r for r in caplog.records if r.name == "ratelimits")
    assert "\n" not in record.ratelimits_path and "\\r\\n" in record.ratelimits_path


def key_that_fails(request):
    raise ValueError(f"no tenant for {request.path}")


def key_that_returns_an_object(request):
    return object()


def test_identity_error_line_escapes_what_the_client_sent(client, make_policy, caplog):
    make_policy(name="tenant", key=f"call:{__name__}.key_that_fails", on_error="allow")
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        assert client.get(FORGED).status_code == 404
    _assert_escaped(_lines(caplog))


def test_unexpected_error_line_escapes_the_path(client, make_policy, caplog, monkeypatch):
    from ratelimits.pipeline import decision

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the limiter")

    make_policy(name="everything", limit=5)
    monkeypatch.setattr(decision, "plan", broken)
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        response = client.get(FORGED)
    assert response.status_code == 404  # admitted: the view (none here) decides
    (record,) = [r for r in caplog.records if r.name == "ratelimits"]
    _assert_escaped([record.getMessage()])
    # the traceback goes to the log, never into the response
    assert record.exc_info is not None and "a bug in the limiter" in caplog.text
    assert b"a bug in the limiter" not in response.content


def test_a_crlf_method_cannot_forge_a_log_line(client, make_policy, caplog):
    make_policy(name="everything", mode="shadow", limit=1, path="*")
    with caplog.at_level(logging.INFO, logger="ratelimits"):
        for _ in range(2):
            client.generic("GET\r\nX", "/hello/")
    _assert_escaped(_lines(caplog))


# -- APPEND_SLASH redirects ---------------------------------------------------------------


def test_an_append_slash_redirect_is_not_charged(client, make_policy, any_store):
    make_policy(name="one", limit=1, path="*")
    first = client.get("/hello")
    assert first.status_code == 301 and first["Location"] == "/hello/"
    assert client.get("/hello/").status_code == 200
    assert client.get("/hello/").status_code == 429


def test_other_unresolved_urls_are_charged(client, make_policy):
    make_policy(name="one", limit=1, path="*")
    assert statuses(client, "get", "/no-such-page", 2) == [404, 429]


def test_without_append_slash_the_redirect_path_is_charged(client, make_policy, settings):
    settings.APPEND_SLASH = False
    make_policy(name="one", limit=1, path="*")
    assert statuses(client, "get", "/hello", 2) == [404, 429]


def test_without_common_middleware_nothing_redirects_so_it_is_charged(
    client, make_policy, settings
):
    settings.MIDDLEWARE = [
        m for m in django_settings.MIDDLEWARE if m != "django.middleware.common.CommonMiddleware"
    ]
    make_policy(name="one", limit=1, path="*")
    assert statuses(client, "get", "/hello", 2) == [404, 429]


# -- Retry-After in whole seconds, the same everywhere --------------------------------------


def test_retry_after_is_exact_in_header_body_and_drf_wait(client, make_policy, rf):
    make_policy(name="g", algorithm="gcra", limit=2, period=60, burst=1, path="/hello/")
    assert client.get("/hello/").status_code == 200
    response = client.get("/hello/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert response["Retry-After"] == "30"
    assert response.json()["retry_after"] == 30

    make_policy(name="items", algorithm="gcra", limit=2, period=60, burst=1, scope="items")
    view = type("V", (), {"throttle_scope": "items"})()
    assert PolicyThrottle().allow_request(Request(rf.get("/x")), view) is True
    throttle = PolicyThrottle()
    assert throttle.allow_request(Request(rf.get("/x")), view) is False
    assert throttle.wait() == 30 and isinstance(throttle.wait(), int)
    drf = client.get("/api/items/")
    assert drf.status_code == 429 and drf["Retry-After"] == "30"
