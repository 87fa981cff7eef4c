"""The request path under requests that try to slip past it or to abuse its logs."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings as django_settings
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
