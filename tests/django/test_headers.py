"""Header values: the closest enforced limit, structured-field quoting, styles."""

from __future__ import annotations

from ratelimits.engine.types import Limit, Result
from ratelimits.pipeline.headers import closest, rate_headers
from ratelimits.pipeline.resolver import CompiledPolicy
from ratelimits.pipeline.verdict import Outcome


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
    return Outcome(policy, "k", Result(limit, allowed, remaining, reset_after, retry_after))


def test_closest_prefers_a_rejection_then_the_fewest_remaining_and_ignores_shadow():
    a, b = outcome("a", remaining=5), outcome("b", remaining=2)
    shadow = outcome("s", remaining=0, allowed=False, shadow=True, retry_after=9)
    assert closest([a, b, shadow]).policy.name == "b"
    refused = outcome("r", remaining=0, allowed=False, retry_after=3)
    assert closest([a, refused]).policy.name == "r"
    assert closest([shadow]) is None


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
