"""Clients that try to walk around a policy: forged proxies, rotating addresses, path
spellings, absurd headers. Each must land on the same quota, and none may cause a 500."""

from __future__ import annotations

import hashlib
from urllib.parse import unquote

import pytest
from django.test import RequestFactory
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ratelimits.middleware import RateLimitMiddleware
from ratelimits.ops import observe
from ratelimits.pipeline import decision, evaluation

pytestmark = pytest.mark.django_db


def statuses(client, path="/hello/", n=1, **extra):
    return [client.get(path, **extra).status_code for _ in range(n)]


def test_forged_x_forwarded_for_from_an_untrusted_peer_gives_no_fresh_quota(client, make_policy):
    make_policy(name="per-ip", limit=2, path="/hello/")
    got = [
        client.get("/hello/", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(5)
    ]
    assert got == [200, 200, 429, 429, 429]


def test_behind_a_trusted_proxy_forged_entries_on_the_left_are_never_reached(
    client, make_policy, settings
):
    settings.RATELIMITS = {**settings.RATELIMITS, "TRUSTED_PROXIES": ["127.0.0.0/8"]}
    make_policy(name="per-ip", limit=2, path="/hello/")
    got = [
        client.get("/hello/", HTTP_X_FORWARDED_FOR=f"10.9.9.{i}, 203.0.113.5").status_code
        for i in range(4)
    ]
    assert got == [200, 200, 429, 429]
    # another real client behind the same proxy has its own quota
    assert statuses(client, HTTP_X_FORWARDED_FOR="203.0.113.6") == [200]


def test_forged_x_forwarded_for_behind_a_forwarded_only_proxy_gives_no_fresh_quota(
    client, make_policy, settings
):
    # The proxy sets Forwarded and passes the client's own X-Forwarded-For through.
    settings.RATELIMITS = {
        **settings.RATELIMITS,
        "TRUSTED_PROXIES": ["127.0.0.0/8"],
        "PROXY_HEADER": "forwarded",
    }
    make_policy(name="per-ip", limit=2, path="/hello/")
    got = [
        client.get(
            "/hello/", HTTP_FORWARDED="for=203.0.113.5", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}"
        ).status_code
        for i in range(4)
    ]
    assert got == [200, 200, 429, 429]
    # another real client behind the same proxy has its own quota
    assert statuses(client, HTTP_FORWARDED="for=203.0.113.6") == [200]


def test_rotating_ipv6_addresses_inside_one_64_gives_no_fresh_quota(client, make_policy):
    make_policy(name="per-ip", limit=2, path="/hello/")
    got = [
        client.get("/hello/", REMOTE_ADDR=f"2001:db8:1:2::{i:x}").status_code for i in range(1, 5)
    ]
    assert got == [200, 200, 429, 429]
    assert statuses(client, REMOTE_ADDR="2001:db8:1:3::1") == [200]


VARIANTS = [
    "/login/",
    "/login",
    "//login/",
    "/./login/",
    "/x/../login/",
    "/LOGIN/",
    "/Login",
    "/%6cogin/",
    "/%256cogin/",
    "/login;jsessionid=1",
    "/login//",
]


def as_served(client, variant: str):
    """The request a WSGI server makes of this raw path (PATH_INFO is decoded once)."""
    return client.get("/", PATH_INFO=unquote(variant))


#: APPEND_SLASH answers these with a redirect to /login/ (that request is charged), so
#: they cost nothing and reach no view.
REDIRECTED = {"/login"}


def test_every_spelling_of_a_path_counts_against_one_policy(client, make_policy):
    make_policy(name="login", limit=len(VARIANTS) - len(REDIRECTED), path="/login/")
    got = {variant: as_served(client, variant).status_code for variant in VARIANTS}
    assert 429 not in got.values() and 500 not in got.values(), got
    for variant in VARIANTS:
        expected = 301 if variant in REDIRECTED else 429
        assert as_served(client, variant).status_code == expected, variant


def hashed(kind: str, value: str) -> str:
    """The identity a long or unprintable value is counted under, worked out independently."""
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"{kind}:h:{digest.hexdigest()}"


@pytest.mark.parametrize(
    ("value", "identity"),
    [
        ("k" * 1_000_000, hashed("header", "k" * 1_000_000)),  # too long: a digest
        ("a\x00b", hashed("header", "a\x00b")),  # control characters: a digest
        ("\x01\x02\x7f", hashed("header", "\x01\x02\x7f")),
        # the UTF-8 bytes of "café", which Django keeps as latin-1 text: read as UTF-8
        ("caf\xc3\xa9", hashed("header", "caf\u00e9")),
        ("\udcff", hashed("header", "\udcff")),  # a lone surrogate still hashes
        ("é" * 5000, hashed("header", "é" * 5000)),
        ("  k-123  ", "header:k-123"),  # surrounding blanks are not part of the key
        (" ", None),  # blank: no identity, the policy does not apply
    ],
)
def test_absurd_header_values_are_counted_under_a_bounded_identity(
    client, make_policy, value, identity
):
    make_policy(name="by-key", limit=1, key="header:X-Api-Key", path="/hello/")
    responses = [client.get("/hello/", HTTP_X_API_KEY=value) for _ in range(2)]
    got = [r.status_code for r in responses]
    counts = observe.last_hour(["by-key"])["by-key"]
    if identity is None:
        assert got == [200, 200]
        assert (counts.admitted, counts.rejected) == (0, 0)  # never counted
        assert observe.offenders("by-key") == []
        return
    # counted: the first passes, the second is over the limit of one
    assert got == [200, 429]
    assert 1 <= int(responses[1]["Retry-After"]) <= 3600
    assert (counts.admitted, counts.rejected) == (1, 1)
    assert observe.offenders("by-key") == [(identity, 1)]
    # a value one character away is another client, with its own quota
    assert statuses(client, HTTP_X_API_KEY=value + "!") == [200]


@pytest.mark.parametrize("value", ["q" * 100_000, "\x00", "%ff%fe", "a&b=c"])
def test_absurd_query_values_never_crash(client, make_policy, value):
    make_policy(name="by-query", limit=1, key="query:token", path="/hello/")
    assert statuses(client, "/hello/", n=2, data={"token": value}) == [200, 429]


@pytest.fixture
def many_policies(make_policy):
    make_policy(name="ip-all", limit=10**6, key="ip", path="*")
    make_policy(name="hdr", limit=10**6, key="header:X-Api-Key", path="/api/*/items/")
    make_policy(name="user", limit=10**6, key="user_or_ip", path="/static/**", methods="POST,PUT")
    make_policy(name="q", mode="shadow", limit=10**6, key="query:q", path="/search/")


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300) | st.text(
    max_size=50
)


@hsettings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=texts,
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "X-WEIRD"]),
    xff=texts,
    forwarded=texts,
    key=texts,
    remote=st.sampled_from(["127.0.0.1", "::1", "", "garbage", "2001:db8::1", "300.1.1.1"]),
)
def test_fuzzed_requests_never_raise_inside_the_limiter(
    many_policies, path, method, xff, forwarded, key, remote
):
    request = RequestFactory().generic(
        method,
        "/",
        HTTP_X_FORWARDED_FOR=xff,
        HTTP_FORWARDED=forwarded,
        HTTP_X_API_KEY=key,
        REMOTE_ADDR=remote,
    )
    request.path_info = request.path = "/" + path
    # the decision itself, run to its end: evaluate() would log and admit, hiding a bug
    decision.decide(request, evaluation.UNSCOPED, RateLimitMiddleware)
