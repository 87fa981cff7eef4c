"""The middleware end to end: 429s, headers, shadow logging, signals, slots, delays."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client, override_settings

from ratelimits import signals
from ratelimits.pipeline.engines import get_engine
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock

pytestmark = pytest.mark.django_db


def statuses(client, path, n, **extra):
    return [client.get(path, **extra).status_code for _ in range(n)]


def test_enforced_policy_rejects_with_429_retry_after_and_ietf_headers(
    client, make_policy, any_store
):
    make_policy(name="hello-ip", limit=2, period=60, path="/hello/")
    assert statuses(client, "/hello/", 2) == [200, 200]
    response = client.get("/hello/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert response["RateLimit-Policy"] == '"hello-ip";q=2;w=60'
    assert response["RateLimit"].startswith('"hello-ip";r=0;t=')
    assert "Too many requests" in response.content.decode()


def test_admitted_responses_carry_the_closest_enforced_limit(client, make_policy, any_store):
    make_policy(name="wide", limit=100, period=60)
    make_policy(name="narrow", limit=3, period=60, path="/hello/")
    make_policy(name="watch", mode="shadow", limit=1, period=60)
    response = client.get("/hello/")
    assert response.status_code == 200
    assert response["RateLimit-Policy"] == '"narrow";q=3;w=60'
    assert response["RateLimit"].startswith('"narrow";r=2;t=')


def test_json_body_when_the_client_asks_for_json(client, make_policy):
    make_policy(limit=1)
    client.get("/hello/")
    response = client.get("/hello/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert response.json()["retry_after"] >= 1


@pytest.mark.parametrize(
    ("style", "present", "absent"),
    [
        (
            "legacy",
            {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"},
            {"RateLimit"},
        ),
        ("both", {"X-RateLimit-Limit", "RateLimit", "RateLimit-Policy"}, set()),
        ("none", set(), {"X-RateLimit-Limit", "RateLimit"}),
    ],
)
def test_header_styles(client, make_policy, settings, style, present, absent):
    settings.RATELIMITS = {**settings.RATELIMITS, "HEADERS": style}
    make_policy(limit=5)
    response = client.get("/hello/")
    assert present <= set(response.headers)
    assert not absent & set(response.headers)
    if "X-RateLimit-Remaining" in present:
        assert response["X-RateLimit-Remaining"] == "4"


def test_shadow_passes_logs_one_warning_and_fires_the_signal(
    client, make_policy, caplog, any_store
):
    make_policy(name="search-shadow", mode="shadow", limit=1, path="/hello/")
    fired = []

    def receiver(sender, **kwargs):
        fired.append(kwargs)

    signals.request_would_be_limited.connect(receiver)
    try:
        with caplog.at_level(logging.INFO, logger="ratelimits"):
            assert statuses(client, "/hello/", 3) == [200, 200, 200]
    finally:
        signals.request_would_be_limited.disconnect(receiver)
    records = [r for r in caplog.records if r.name == "ratelimits"]
    assert [r.levelname for r in records] == ["WARNING", "WARNING"]
    message = records[0].getMessage()
    assert "search-shadow" in message and "would reject" in message
    assert "key ip" in message and "/hello/" in message and "retry after" in message
    assert len(fired) == 2
    assert fired[0]["policy"] == "search-shadow" and fired[0]["key"] == "ip"
    assert fired[0]["retry_after"] > 0 and fired[0]["path"] == "/hello/"


def test_enforced_rejection_logs_info_and_fires_request_limited(client, make_policy, caplog):
    make_policy(name="strict", limit=1)
    fired = []
    signals.request_limited.connect(
        lambda sender, **kw: fired.append(kw), weak=False, dispatch_uid="t"
    )
    try:
        with caplog.at_level(logging.INFO, logger="ratelimits"):
            statuses(client, "/hello/", 2)
    finally:
        signals.request_limited.disconnect(dispatch_uid="t")
    (record,) = [r for r in caplog.records if r.name == "ratelimits"]
    assert record.levelname == "INFO" and "strict" in record.getMessage()
    assert [f["policy"] for f in fired] == ["strict"]


def test_long_identities_are_shortened_in_logs(client, make_policy, caplog):
    make_policy(name="by-header", mode="shadow", limit=1, key="header:X-Api-Key")
    # printable ASCII under the 200-character identity cap is kept as sent (not hashed),
    # so only the log's own 80-character cap shortens it
    value = "k" * 150
    with caplog.at_level(logging.WARNING, logger="ratelimits"):
        statuses(client, "/hello/", 2, HTTP_X_API_KEY=value)
    (record,) = [r for r in caplog.records if r.name == "ratelimits"]
    shown = ("header:" + value)[:79] + "…"
    assert f"client {shown}," in record.getMessage()
    assert record.ratelimits_identity == shown and len(shown) == 80


def test_paths_and_methods_select_the_policy(client, make_policy):
    make_policy(name="login-post", limit=1, path="/login/", methods="POST")
    assert statuses(client, "/login/", 3) == [200, 200, 200]  # GET is not limited
    assert [client.post("/login/").status_code for _ in range(2)] == [200, 429]
    assert client.get("/hello/").status_code == 200


def test_clients_are_counted_apart(client, make_policy):
    make_policy(limit=1)
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 200
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.2").status_code == 200
    assert client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code == 429


def test_user_policy_skips_anonymous_requests(client, make_policy, django_user_model):
    make_policy(name="per-user", limit=1, key="user")
    assert statuses(client, "/hello/", 3) == [200, 200, 200]
    user = django_user_model.objects.create_user("ann", password="pw")
    client.force_login(user)
    assert statuses(client, "/hello/", 2) == [200, 429]


def test_concurrency_slot_is_released_after_the_response(client, make_policy):
    make_policy(name="one-at-a-time", algorithm="concurrency", limit=1, period=60)
    assert statuses(client, "/hello/", 3) == [200, 200, 200]


def test_concurrency_slot_is_released_when_the_view_raises(make_policy, any_store):
    make_policy(name="one-at-a-time", algorithm="concurrency", limit=1, period=60)
    client = Client(raise_request_exception=False)
    assert client.get("/boom/").status_code == 500
    assert client.get("/boom/").status_code == 500  # not 429: the slot was freed
    assert client.get("/hello/").status_code == 200


def test_concurrency_slot_of_a_streaming_response_is_held_until_close(make_policy):
    make_policy(name="one-at-a-time", algorithm="concurrency", limit=1, period=60)
    from django.test.client import RequestFactory

    from ratelimits.middleware import RateLimitMiddleware
    from tests.urls import stream

    middleware = RateLimitMiddleware(stream)
    first = middleware(RequestFactory().get("/stream/"))
    assert first.status_code == 200 and first.streaming
    held = middleware(RequestFactory().get("/stream/"))
    assert held.status_code == 429  # the body has not been sent yet
    assert b"".join(first.streaming_content) == b"abc"
    first.close()
    assert middleware(RequestFactory().get("/stream/")).status_code == 200


def test_streaming_through_the_test_client_releases(client, make_policy):
    make_policy(name="one-at-a-time", algorithm="concurrency", limit=1, period=60)
    for _ in range(3):
        response = client.get("/stream/")
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == b"abc"
        response.close()


def test_leaky_bucket_delay_is_slept_and_a_longer_wait_is_refused(
    client, settings, waits, django_capture_on_commit_callbacks
):
    """A queue that would hold a request longer than MAX_DELAY refuses that request (and
    charges nothing) instead of serving it early. The policy is saved without clean(),
    as a row from before that rule (or before MAX_DELAY was lowered) would be."""
    from ratelimits.models import Policy

    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_DELAY": 25}
    with django_capture_on_commit_callbacks(execute=True):
        Policy.objects.create(name="smooth", mode="enforce", algorithm="leaky_bucket",
                              limit=1, period=10, burst=5, key="ip", path="/hello/")
    got = [client.get("/hello/") for _ in range(5)]
    # one request per 10 s: the queue of 5 would hold the 4th 30 s, the 5th 40 s
    assert [r.status_code for r in got] == [200, 200, 200, 429, 429]
    assert [round(s) for s in waits.slept] == [10, 20]  # each held for its turn, never cut short
    assert int(got[3]["Retry-After"]) == 10  # when a place within MAX_DELAY frees up
    assert int(got[4]["Retry-After"]) == 10  # the refused 4th took no place: same turn


def test_exempt_function_skips_every_policy(client, make_policy, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "EXEMPT": "tests.support.hooks.exempt_health"}
    make_policy(limit=1)
    assert statuses(client, "/hello/", 3, HTTP_X_HEALTH="1") == [200, 200, 200]
    assert statuses(client, "/hello/", 2) == [200, 429]


def test_kill_switch(client, make_policy, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "ENABLED": False}
    make_policy(limit=1)
    assert statuses(client, "/hello/", 3) == [200, 200, 200]


def test_custom_reject_view(client, make_policy, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "REJECT_VIEW": "tests.support.hooks.teapot"}
    make_policy(name="strict", limit=1)
    client.get("/hello/")
    response = client.get("/hello/")
    assert response.status_code == 429
    assert response.content == b"slow down: strict"
    assert response["Retry-After"]


def test_broken_reject_view_falls_back_to_the_default(client, make_policy, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "REJECT_VIEW": "tests.support.hooks.broken"}
    make_policy(limit=1)
    client.get("/hello/")
    assert client.get("/hello/").status_code == 429


@pytest.mark.parametrize("setting", ["EXEMPT", "TIER", "REJECT_VIEW"])
def test_a_settings_function_that_exits_is_a_function_that_failed(
        client, make_policy, settings, setting, caplog, django_capture_on_commit_callbacks):
    """No function of yours stops the worker or becomes a 500: its SystemExit is logged
    as the function failing, and the request goes on as that failure says (not exempt,
    no tier, the default 429)."""
    from ratelimits.models import Override

    hook = "tests.support.hooks.exits_whatever_asked"
    settings.RATELIMITS = {**settings.RATELIMITS, setting: hook}
    policy = make_policy(name="strict", limit=1, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):  # TIER is asked of overrides
        Override.objects.create(policy=policy, match="tier:gold", limit=90)
    refused = [client.get("/hello/") for _ in range(2)][-1]
    assert refused.status_code == 429 and refused["Retry-After"]
    failed = [r for r in caplog.records if r.levelname == "ERROR" and setting in r.getMessage()]
    assert failed and failed[0].exc_info[0] is SystemExit


def test_call_key_that_raises_is_contained(client, make_policy, caplog):
    make_policy(name="fn-allow", limit=1, key="call:tests.support.hooks.failing_key")
    make_policy(
        name="fn-deny",
        limit=1,
        key="call:tests.support.hooks.failing_key",
        on_error="deny",
        path="/login/",
    )
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        assert statuses(client, "/hello/", 2) == [200, 200]
    assert "fn-allow" in caplog.text
    response = client.get("/login/")
    assert response.status_code == 503 and response["Retry-After"] == "1"


def test_off_policies_do_nothing(client, make_policy):
    make_policy(limit=1, mode="off")
    assert statuses(client, "/hello/", 3) == [200, 200, 200]


def test_the_memory_store_is_really_in_use(client, make_policy, memory_store):
    from ratelimits.engine import MemoryEngine

    make_policy(name="hello-ip", limit=2, period=60)
    assert statuses(client, "/hello/", 3) == [200, 200, 429]
    assert isinstance(get_engine(), MemoryEngine)


UNREACHABLE = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:9/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
    },
    "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}


@pytest.mark.parametrize(
    ("on_error", "expected"),
    [("allow", [200, 200, 200]), ("deny", [503, 503, 503]), ("local", [200, 200, 429])],
)
def test_on_error_when_redis_is_unreachable(
    client, make_policy, on_error, expected, caplog
):
    make_policy(name=f"fallback-{on_error}", limit=2, on_error=on_error)
    client.get("/hello/")  # the snapshot is loaded; the local engine starts empty
    with override_settings(CACHES=UNREACHABLE), caplog.at_level(logging.ERROR, "ratelimits"):
        got = statuses(client, "/hello/", 3)
    assert got == expected
    assert "unavailable" in caplog.text
    if on_error == "deny":
        assert client.get("/hello/").status_code == 200  # back on Redis


def test_async_middleware_with_an_async_view(make_policy):
    make_policy(name="async-ip", limit=2, path="/async/")

    async def scenario():
        client = AsyncClient()
        got = [(await client.get("/async/")).status_code for _ in range(3)]
        return got, await client.get("/async/")

    got, response = async_to_sync(scenario)()
    assert got == [200, 200, 429]
    assert response["Retry-After"] and response["RateLimit"].startswith('"async-ip";r=0')
    assert response.asgi_request is not None  # it went through the async handler


def test_async_refusals_reach_a_receiver_that_queries_the_database(make_policy):
    """On the event loop the decision sends its signals with asend() once it is made: a
    synchronous receiver runs in a thread, where the database may be queried."""
    from ratelimits.models import Policy

    make_policy(name="async-strict", limit=1, path="/async/")
    seen = []

    def receiver(sender, **kw):
        seen.append((kw["policy"], Policy.objects.filter(name=kw["policy"]).count()))

    signals.request_limited.connect(receiver, weak=False, dispatch_uid="async-t")

    async def scenario():
        client = AsyncClient()
        return [(await client.get("/async/")).status_code for _ in range(2)]

    try:
        assert async_to_sync(scenario)() == [200, 429]
    finally:
        signals.request_limited.disconnect(dispatch_uid="async-t")
    assert seen == [("async-strict", 1)]


def test_a_cold_process_reads_the_policies_outside_the_event_loop(make_policy, caplog):
    """The first async request of a process that has not read the policies yet: they are
    read in a thread (the database is not the event loop's), and the request is limited
    like the next ones."""
    from ratelimits.pipeline.resolver import resolver

    make_policy(name="cold", limit=1, path="/async/")
    resolver.reset()

    async def scenario():
        client = AsyncClient()
        return [(await client.get("/async/")).status_code for _ in range(2)]

    assert async_to_sync(scenario)() == [200, 429]
    assert "could not load the policies" not in caplog.text


def test_async_leaky_delay_is_awaited(make_policy):
    waited = []

    class Awaited(Clock):  # records the awaited waits; a blocking one fails the test
        def sleep(self, seconds):
            pytest.fail("blocked the event loop")

        async def asleep(self, seconds):
            waited.append(seconds)

    make_policy(name="smooth", algorithm="leaky_bucket", limit=1, period=1, burst=3)

    async def scenario():
        client = AsyncClient()
        return [(await client.get("/async/")).status_code for _ in range(3)]

    with using_clock(Awaited()):
        assert async_to_sync(scenario)() == [200, 200, 200]
    assert waited and all(0 < w <= 5 for w in waited)
