"""Key kinds are one table: a kind added to it is parsed, validated, read from requests
and listed in messages and the admin, with no other module touched."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import RequestFactory

from ratelimits.matching.keykinds import KEY_KINDS, KeyKind, Proxies, parse_key
from ratelimits.matching.overrides import parse_match
from ratelimits.models import Policy

factory = RequestFactory()


def read_cookie(request: Any, arg: str, proxies: Proxies) -> str | None:
    return request.COOKIES.get(arg) or None


def cookie_name(arg: str) -> str | None:
    return None if arg.isidentifier() else f"cookie name {arg!r} is not an identifier"


@pytest.fixture
def cookie_kind():
    KEY_KINDS.add(KeyKind("cookie", read_cookie, "cookie:<name>", cookie_name,
                          "cookie: needs a cookie name, e.g. cookie:sessionid"))
    yield
    KEY_KINDS.remove("cookie")


def test_the_builtin_kinds_and_their_usage():
    assert [k.name for k in KEY_KINDS] == [
        "ip", "user", "user_or_ip", "global", "header", "query", "post", "call",
        "connection", "code"
    ]
    assert KEY_KINDS.usage == ("use ip, user, user_or_ip, global, header:<Name>, "
                               "query:<name>, post:<field>, call:<dotted.path> or connection")
    assert KEY_KINDS.reads_user == {"user", "user_or_ip"}
    assert KEY_KINDS.calls_code == {"call", "code"}
    assert KEY_KINDS.splittable == {"ip", "user", "user_or_ip"}
    assert parse_key("GET:page") == parse_key("query:page")  # django-ratelimit's spelling


def test_a_new_kind_is_parsed_and_its_argument_checked(cookie_kind):
    assert parse_key("cookie:sessionid").kind == "cookie"
    with pytest.raises(ValueError, match="cookie: needs a cookie name"):
        parse_key("cookie:")
    with pytest.raises(ValueError, match="is not an identifier"):
        parse_key("cookie:a-b")
    with pytest.raises(ValueError,
                       match=r"post:<field>, call:<dotted.path>, connection or cookie:<name>"):
        parse_key("nosuch:x")


def test_a_new_kind_identifies_a_request_and_is_hashed_when_long(cookie_kind):
    spec = parse_key("cookie:sessionid")
    request = factory.get("/")
    assert spec.identify(request) is None
    request.COOKIES["sessionid"] = "abc"
    assert spec.identify(request) == "cookie:abc"
    request.COOKIES["sessionid"] = "x" * 500
    assert spec.identify(request).startswith("cookie:h:")


def test_a_policy_with_a_new_kind_validates_and_takes_overrides(db, cookie_kind):
    Policy(name="per-session", key="cookie:sessionid", limit=5, period=60).full_clean()
    assert parse_match("cookie:sessionid", "cookie:abc").value == "cookie:abc"
    with pytest.raises(ValueError, match=r"write e\.g\. cookie:<value>, tier:<name>"):
        parse_match("cookie:sessionid", "user:42")


def test_the_admin_form_lists_the_kinds_declared_now(db, cookie_kind):
    policy_admin = admin.site._registry[Policy]
    form = policy_admin.get_form(factory.get("/"))()
    assert form.fields["key"].help_text == (
        "Who is counted: ip, user, user_or_ip, global, header:<Name>, query:<name>, "
        "post:<field>, call:<dotted.path>, connection or cookie:<name>."
    )
    assert "cookie" not in Policy._meta.get_field("key").help_text  # no migration needed


@pytest.mark.parametrize("query", [
    "a=1&b=2&a=3", "api%5Fkey=x+y&a=", "q=caf%C3%A9", "q=caf\xc3\xa9", "a", "a=1;a=2",
    "=&a=%", "a=%zz&a=%E2%82", "&&a=1&&",
])
def test_the_query_key_reads_what_request_get_reads(query):
    from django.http import QueryDict

    from ratelimits.matching.keykinds import query_value

    for name in ("a", "b", "api_key", "q", ""):
        expected = QueryDict(query.encode("latin-1")).get(name)
        assert query_value(query, name) == expected, (query, name)
