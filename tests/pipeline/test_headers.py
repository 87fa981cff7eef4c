"""Header values: the closest enforced limit, structured-field quoting, styles."""

from __future__ import annotations

import pytest

from ratelimits.engine.types import Limit, Result
from ratelimits.pipeline.compiled import CompiledPolicy
from ratelimits.pipeline.responses import closest, rate_headers
from ratelimits.pipeline.verdict import PolicyOutcome


def outcome(
    name,
    *,
    remaining=1,
    allowed=True,
    shadow=False,
    algorithm="fixed_window",
    retry_after=0.0,
    reset_after=30.0,
):
    limit = Limit(key="k", algorithm=algorithm, limit=10, period=60.0, shadow=shadow, name=name)
    policy = CompiledPolicy(
        id=hash(name),
        name=name,
        mode="shadow" if shadow else "enforce",
        key="ip",
        key_spec=None,
        pattern=None,
        methods=frozenset(),
        scope="",
        on_error="allow",
        priority=0,
        template=limit,
    )
    return PolicyOutcome(policy, "k", Result(limit, allowed, remaining, reset_after, retry_after))


def test_closest_prefers_a_rejection_then_the_fewest_remaining_and_ignores_shadow():
    a, b = outcome("a", remaining=5), outcome("b", remaining=2)
    shadow = outcome("s", remaining=0, allowed=False, shadow=True, retry_after=9)
    assert closest([a, b, shadow]).policy.name == "b"
    refused = outcome("r", remaining=0, allowed=False, retry_after=3)
    assert closest([a, refused]).policy.name == "r"
    assert closest([shadow]) is None


def test_closest_in_any_order_the_longest_wait_then_the_fewest_left_then_the_longest_reset():
    import itertools

    soon = outcome("soon", remaining=0, allowed=False, retry_after=2)
    late = outcome("late", remaining=0, allowed=False, retry_after=7)
    few = outcome("few", remaining=1, reset_after=10)
    few_longer = outcome("few-longer", remaining=1, reset_after=40)
    many = outcome("many", remaining=9)
    for order in itertools.permutations([soon, late, few, many]):
        assert closest(order).policy.name == "late"
    for order in itertools.permutations([few, few_longer, many]):
        assert closest(order).policy.name == "few-longer"
    # equals: the first one (the policies' order, most important first)
    twin = outcome("twin", remaining=1, reset_after=40)
    assert closest([few_longer, twin]).policy.name == "few-longer"
    assert closest([twin, few_longer]).policy.name == "twin"
    again = outcome("again", remaining=0, allowed=False, retry_after=7)
    assert closest([late, again, soon]).policy.name == "late"


def test_ietf_values_and_rounding():
    headers = rate_headers(outcome("a", remaining=4, reset_after=12.2), "ietf")
    assert headers == {"RateLimit-Policy": '"a";q=10;w=60', "RateLimit": '"a";r=4;t=13'}
    refused = rate_headers(outcome("a", remaining=0, allowed=False, retry_after=0.4), "ietf")
    assert refused["RateLimit"] == '"a";r=0;t=1'


def test_concurrency_has_no_window():
    headers = rate_headers(outcome("c", algorithm="concurrency"), "both")
    assert headers["RateLimit-Policy"] == '"c";q=10'
    assert headers["X-RateLimit-Limit"] == "10"


def test_policy_names_are_quoted_as_structured_field_strings():
    headers = rate_headers(outcome('we"ird\\'), "ietf")
    assert headers["RateLimit-Policy"].startswith('"we\\"ird\\\\"')


# -- RateLimit-Policy means what draft-ietf-httpapi-ratelimit-headers means ----------------

POLICY_HEADERS = [
    # algorithm, burst, RateLimit-Policy: q is the limit per w = period, never the burst
    ("fixed_window", None, '"p";q=10;w=60'),
    ("sliding_window", None, '"p";q=10;w=60'),
    ("sliding_log", None, '"p";q=10;w=60'),
    ("token_bucket", 5, '"p";q=10;w=60'),
    ("token_bucket", 20, '"p";q=10;w=60'),
    ("gcra", 5, '"p";q=10;w=60'),
    ("leaky_bucket", 3, '"p";q=10;w=60'),
    ("concurrency", None, '"p";q=10'),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("algorithm", "burst", "expected"), POLICY_HEADERS)
def test_each_algorithms_policy_header_and_its_live_state(
    client, make_policy, algorithm, burst, expected, settings
):
    # the leaky bucket's queue of 3 at 6 s a place holds a request up to 18 s
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_DELAY": 20}
    make_policy(name="p", algorithm=algorithm, limit=10, period=60, burst=burst, path="/hello/")
    response = client.get("/hello/")
    assert response.status_code == 200
    assert response["RateLimit-Policy"] == expected
    r, t = _ratelimit(response["RateLimit"])
    # r: units left now (for a bucket, up to its burst); t: seconds until fully reset
    expected_r = {
        "token_bucket": (burst or 10) - 1,
        "gcra": (burst or 10) - 1,
        "leaky_bucket": 3,  # the queue: 3 more may wait behind this one
    }.get(algorithm, 9)
    assert r == expected_r
    if algorithm == "concurrency":
        assert t == 60  # a slot's time to live
    elif algorithm in ("fixed_window", "sliding_window"):
        assert 0 < t <= 120
    else:
        assert t == {"sliding_log": 60, "token_bucket": 6, "gcra": 6, "leaky_bucket": 6}[algorithm]


def _ratelimit(value: str) -> tuple[int, int]:
    params = dict(part.split("=") for part in value.split(";")[1:])
    return int(params["r"]), int(params["t"])


# -- a refusal speaks for the policy that refused ----------------------------------------

RATE_HEADERS = ("RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                "X-RateLimit-Reset")


@pytest.mark.django_db
@pytest.mark.parametrize("style", ["ietf", "both"])
def test_a_failing_keys_503_carries_no_other_policys_headers(client, make_policy, settings,
                                                             any_store, style):
    settings.RATELIMITS = {**settings.RATELIMITS, "HEADERS": style}
    make_policy(name="per-ip", limit=3, period=60, path="/hello/")
    make_policy(name="per-tenant", limit=100, period=60, path="/hello/",
                key="call:tests.support.hooks.tenant_key", on_error="deny")
    refused = [client.get("/hello/") for _ in range(3)]
    assert [r.status_code for r in refused] == [503, 503, 503]
    for response in refused:
        assert response["Retry-After"] == "1"
        assert not set(RATE_HEADERS) & set(response.headers), dict(response.headers)


@pytest.mark.django_db
def test_a_failing_keys_503_charges_none_of_the_other_policies(client, make_policy):
    make_policy(name="per-ip", limit=3, period=60, path="/hello/")
    make_policy(name="per-tenant", limit=100, period=60, path="/hello/",
                key="call:tests.support.hooks.tenant_key", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(5)] == [503] * 5
    admitted = client.get("/hello/", headers={"X-Tenant": "acme"})
    assert admitted.status_code == 200
    assert admitted["RateLimit"].startswith('"per-ip";r=2;')  # its first unit, not its sixth


@pytest.mark.django_db
def test_an_outage_503_carries_no_headers_of_a_policy_decided_in_process(client, make_policy,
                                                                         settings):
    make_policy(name="per-node", limit=50, period=60, path="/hello/", counting="per_process")
    make_policy(name="payments", limit=100, period=60, path="/hello/", on_error="deny")
    admitted = client.get("/hello/")  # the snapshot is loaded while the store answers
    assert admitted["RateLimit"].startswith('"per-node";r=49;')
    settings.RATELIMITS = {**settings.RATELIMITS, "REDIS_URL": "redis://127.0.0.1:9/0"}
    refused = client.get("/hello/")
    assert refused.status_code == 503 and refused["Retry-After"] == "1"
    assert not set(RATE_HEADERS) & set(refused.headers), dict(refused.headers)


@pytest.mark.django_db
def test_a_throttles_outage_503_carries_no_headers_of_a_policy_decided_in_process(
        client, make_policy, settings):
    make_policy(name="per-node", limit=50, period=60, path="/api/**", counting="per_process")
    make_policy(name="items", limit=100, period=60, scope="items", on_error="deny")
    assert client.get("/api/items/").status_code == 200
    settings.RATELIMITS = {**settings.RATELIMITS, "REDIS_URL": "redis://127.0.0.1:9/0"}
    refused = client.get("/api/items/")
    assert refused.status_code == 503
    assert not set(RATE_HEADERS) & set(refused.headers), dict(refused.headers)


# -- a refusal's Retry-After is never earlier than its `t` (draft -11) --------------------

REFUSING = [
    # algorithm, burst: each refuses its 4th request inside the minute
    ("fixed_window", None), ("sliding_window", None), ("sliding_log", None),
    ("token_bucket", 3), ("gcra", 3),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("algorithm", "burst"), REFUSING)
def test_a_refusals_retry_after_is_the_end_of_its_effective_window(client, algorithm, burst):
    from ratelimits.testing import limited

    with limited({"name": "p", "rate": "3/m", "algorithm": algorithm, "burst": burst,
                  "path": "/hello/"}) as limits:
        for _ in range(3):
            assert client.get("/hello/").status_code == 200
            limits.clock.advance(5)
        refused = client.get("/hello/")
    assert refused.status_code == 429
    r, t = _ratelimit(refused["RateLimit"])
    assert r == 0
    # the draft: Retry-After SHOULD NOT point earlier than the reset parameter; ours
    # names the same moment, when a retry can pass, not the whole period
    assert int(refused["Retry-After"]) == t
    # a sliding window's weighted previous window may hold it into the next period
    assert 0 < t <= (120 if algorithm == "sliding_window" else 60)


@pytest.mark.django_db
def test_two_refusing_policies_the_headers_name_the_longest_wait(client):
    from ratelimits.testing import limited

    with limited({"name": "short", "rate": "1/10s", "path": "/hello/"},
                 {"name": "long", "rate": "1/m", "path": "/hello/"}) as limits:
        assert client.get("/hello/").status_code == 200
        limits.clock.advance(1)
        refused = client.get("/hello/", headers={"Accept": "application/json"})
    assert refused.status_code == 429
    assert refused["RateLimit"].startswith('"long";r=0;')
    assert int(refused["Retry-After"]) == _ratelimit(refused["RateLimit"])[1]
    assert sorted(refused.json()["violated-policies"]) == ["long", "short"]


# -- a refusal's body is the draft's problem type (RFC 9457) ------------------------------

@pytest.mark.django_db
def test_a_429_in_json_is_a_quota_exceeded_problem(client, make_policy, any_store):
    make_policy(name="per-ip", limit=1, period=60, path="/hello/")
    make_policy(name="watched", limit=1, period=60, path="/hello/", mode="shadow")
    client.get("/hello/")
    refused = client.get("/hello/", headers={"Accept": "application/json"})
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/problem+json"
    body = refused.json()
    assert body["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
    assert (body["title"], body["status"]) == ("Too Many Requests", 429)
    assert body["retry_after"] == int(refused["Retry-After"]) > 0
    assert body["violated-policies"] == ["per-ip"]  # a shadow policy refused nobody
    plain = client.get("/hello/")
    assert plain["Content-Type"] == "text/plain"


@pytest.mark.django_db
def test_an_outage_503_in_json_has_no_problem_type_of_the_drafts(client, make_policy,
                                                                 settings):
    make_policy(name="payments", limit=100, period=60, path="/hello/", on_error="deny")
    settings.RATELIMITS = {**settings.RATELIMITS, "REDIS_URL": "redis://127.0.0.1:9/0"}
    refused = client.get("/hello/", headers={"Accept": "application/problem+json"})
    assert refused.status_code == 503
    body = refused.json()
    assert "type" not in body and "violated-policies" not in body
    assert (body["title"], body["status"], body["retry_after"]) == (
        "Service Unavailable", 503, 1)


def test_an_adaptive_limits_503_is_a_temporary_reduced_capacity_problem(rf):
    import json

    from ratelimits.pipeline.responses import Rejection, reject
    from ratelimits.pipeline.verdict import UNAVAILABLE, Verdict

    request = rf.get("/hello/", headers={"Accept": "application/json"})
    response = reject(request, Rejection(UNAVAILABLE, 2, ("busy",), Verdict(UNAVAILABLE)))
    body = json.loads(response.content)
    assert body["type"] == (
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity")
    assert body["violated-policies"] == ["busy"] and body["status"] == 503
