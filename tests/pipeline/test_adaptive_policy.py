"""Adaptive policies on the request path: validated in the admin, decided in process
before the store, 503 with Retry-After when the learnt limit is reached, samples of
latency and limit in the store's counters, charted on the policy's page."""

from __future__ import annotations

import pytest
import redis
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError

from ratelimits.models import Override, Policy
from ratelimits.ops import observe
from ratelimits.pipeline.engines import get_adaptive_engine

ADAPTIVE = {"name": "busy", "mode": "enforce", "algorithm": "adaptive", "limit": 8,
            "floor": 1, "period": 60, "key": "global", "path": "/stream/"}


def errors_of(**fields) -> dict[str, list[str]]:
    policy = Policy(**{**ADAPTIVE, **fields})
    with pytest.raises(ValidationError) as info:
        policy.full_clean()
    return info.value.message_dict


@pytest.mark.django_db
def test_the_admin_refuses_what_an_adaptive_policy_cannot_be():
    assert "global" in errors_of(key="ip")["key"][0]
    assert "from 1 to the limit (8)" in errors_of(floor=9)["floor"][0]
    assert "Cost must be 1" in errors_of(cost=2)["cost"][0]
    assert "at least 2 seconds" in errors_of(period=1)["period"][0]
    assert "has no burst" in errors_of(burst=3)["burst"][0]
    assert "never calls the store" in errors_of(batch=2)["batch"][0]
    assert "Floor applies only to adaptive" in errors_of(algorithm="gcra", key="ip")["floor"][0]
    policy = Policy(**{**ADAPTIVE, "counting": "shared"})
    policy.full_clean()
    assert policy.counting == "per_process"  # each process learns its own
    assert policy.human_rate() == "1 to 8 at a time, learnt"
    policy.save()
    override = Override(policy=policy, match="tier:gold", limit=20)
    with pytest.raises(ValidationError, match="no clients to override"):
        override.full_clean()


@pytest.fixture
def server(private_redis, settings):
    """The engine on a server of this test's own, to count the commands it receives."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    return redis.Redis.from_url(private_redis.url)


def calls(server: redis.Redis) -> int:
    stats = server.info("commandstats")
    return sum(s["calls"] for name, s in stats.items()
               if name in ("cmdstat_fcall", "cmdstat_evalsha"))


def test_the_learnt_limit_refuses_with_503_and_retry_after_without_the_store(
    client, make_policy, server
):
    make_policy(**ADAPTIVE)  # a new limiter starts at its floor: 1 in flight
    assert client.get("/login/").status_code == 200  # snapshot and version learnt
    before = calls(server)
    running = client.get("/stream/")  # streaming: in flight until its body is closed
    refused = client.get("/stream/")
    assert (running.status_code, refused.status_code) == (200, 503)
    assert refused["Retry-After"] == "1"
    assert b"Traceback" not in refused.content
    running.close()
    after = client.get("/stream/")
    assert after.status_code == 200
    after.close()
    assert calls(server) == before  # decided in process: no store call for it
    assert get_adaptive_engine().in_flight() == 0
    counts = observe.last_hour(["busy"])["busy"]
    assert (counts.admitted, counts.rejected) == (2, 1)
    assert counts.samples == 2 and counts.mean_limit >= 1
    assert 0 < counts.latency_ms < 5_000


def test_shadow_refuses_nothing_counts_would_reject_and_logs_its_limit(
    client, make_policy, caplog
):
    make_policy(**{**ADAPTIVE, "mode": "shadow"})
    running = client.get("/stream/")
    also = client.get("/stream/")
    assert (running.status_code, also.status_code) == (200, 200)
    with caplog.at_level("INFO", logger="ratelimits"):
        running.close()
        also.close()
    counts = observe.last_hour(["busy"])["busy"]
    assert (counts.admitted, counts.would_reject, counts.rejected) == (1, 1, 0)
    assert counts.samples == 2
    assert "adaptive policy 'busy' would set (shadow): limit 1 in flight" in caplog.text


def test_a_store_refusal_gives_the_ticket_back_untaught(client, make_policy):
    make_policy(**ADAPTIVE)
    make_policy(name="rate", limit=1, path="/stream/")
    first = client.get("/stream/")
    first.close()
    second = client.get("/stream/")
    assert second.status_code == 429  # the rate refused: a client's limit, not overload
    engine = get_adaptive_engine()
    assert engine.in_flight() == 0
    counts = observe.last_hour(["busy"])["busy"]
    assert (counts.admitted, counts.spared, counts.samples) == (1, 1, 1)


def test_an_async_view_holds_its_ticket_until_the_response(async_client, make_policy):
    make_policy(**{**ADAPTIVE, "path": "/async/"})

    async def three():
        return [(await async_client.get("/async/")).status_code for _ in range(3)]

    assert async_to_sync(three)() == [200, 200, 200]  # one at a time: always room
    assert get_adaptive_engine().in_flight() == 0
    assert observe.last_hour(["busy"])["busy"].samples == 3


def test_the_policy_page_charts_the_limit_and_the_latency(admin_client, client, make_policy):
    policy = make_policy(**ADAPTIVE)
    for _ in range(3):
        client.get("/stream/").close()
    page = admin_client.get(f"/admin/ratelimits/policy/{policy.pk}/change/").content.decode()
    assert "Limit learnt and latency" in page
    assert "busy: the limit learnt (requests in flight), last hour" in page
    assert "busy: latency of the requests it admitted (ms), last hour" in page
    assert 'class="rl-mean_limit"' in page and 'class="rl-latency_ms"' in page
    learnt = " ".join(page.split('id="rl-learnt">', 1)[1].split("</p>", 1)[0].split())
    assert "requests in flight per process" in learnt and "over 3 requests." in learnt
    assert 'name="floor"' in page  # the field is on the form


def test_a_client_error_teaches_the_adaptive_limit_nothing(client, make_policy):
    """A 404 is answered before any work: its latency is not the service's."""
    make_policy(**{**ADAPTIVE, "path": "*"})
    assert client.get("/no-such-page/").status_code == 404
    assert client.get("/hello/").status_code == 200
    counts = observe.last_hour(["busy"])["busy"]
    assert (counts.admitted, counts.samples) == (2, 1)  # the 200's latency only
