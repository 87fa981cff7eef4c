"""One reset function serves the admin and `manage.py ratelimits reset`: same reading of
the typed client, same refusals, and a store outage is a message, never a traceback. A
deleted policy's figures go with it, on either engine."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ratelimits.models import Policy
from ratelimits.ops import observe
from ratelimits.ops.observe import PolicyCounts
from ratelimits.ops.reset import forget_figures, reset_client
from ratelimits.pipeline.engines import get_engine

pytestmark = pytest.mark.django_db
URL = "/admin/ratelimits/policy/"


def hit(client, n: int, ip: str) -> list[int]:
    return [client.get("/hello/", REMOTE_ADDR=ip).status_code for _ in range(n)]


@pytest.mark.parametrize(
    ("key", "typed", "identity"),
    [
        ("ip", "192.0.2.9", "ip:192.0.2.9"),
        ("ip", " ip:192.0.2.9 ", "ip:192.0.2.9"),
        ("ip", "2001:db8:1:2::7", "ip:2001:db8:1:2::/64"),
        ("user", "7", "user:7"),
        ("user_or_ip", "192.0.2.9", "ip:192.0.2.9"),
        ("user_or_ip", "alice", "user:alice"),
        ("global", "", "global"),
    ],
)
def test_the_typed_client_is_read_as_requests_are(make_policy, key, typed, identity):
    policy = make_policy(name="p", key=key, limit=1)
    if key == "global":
        with pytest.raises(ValueError, match="enter the client"):
            reset_client(policy, typed)
        typed = "global"
    assert reset_client(policy, typed) == identity


def test_the_admin_and_the_command_reset_the_same_client(admin_client, client, make_policy):
    policy = make_policy(name="login", limit=1, path="/hello/")
    for reset in (
        lambda: admin_client.post(f"{URL}{policy.pk}/reset-client/", {"identity": "192.0.2.9"}),
        lambda: call_command("ratelimits", "reset", "login", "--key", "192.0.2.9",
                             stdout=io.StringIO()),
    ):
        assert hit(client, 2, "192.0.2.9") == [200, 429]
        reset()
        assert hit(client, 1, "192.0.2.9") == [200]
        reset()  # for the next round


def test_what_cannot_be_a_client_gets_the_same_message_from_both(admin_client, make_policy):
    policy = make_policy(name="login", limit=1, path="/hello/")
    with pytest.raises(ValueError, match=r"'not-an-ip' is not an IP address") as info:
        reset_client(policy, "not-an-ip")
    page = admin_client.post(
        f"{URL}{policy.pk}/reset-client/", {"identity": "not-an-ip"}, follow=True
    ).content.decode()
    assert "is not an IP address" in page
    with pytest.raises(CommandError) as command:
        call_command("ratelimits", "reset", "login", "--key", "not-an-ip")
    assert str(info.value) in str(command.value)


def test_a_store_outage_is_a_message_in_both(admin_client, make_policy, settings):
    from tests.redis_server import free_port

    policy = make_policy(name="login", limit=1, path="/hello/")
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    with pytest.raises(ValueError, match="the store did not answer"):
        reset_client(policy, "192.0.2.9")
    response = admin_client.post(
        f"{URL}{policy.pk}/reset-client/", {"identity": "192.0.2.9"}, follow=True
    )
    assert response.status_code == 200
    assert "the store did not answer" in response.content.decode()
    with pytest.raises(CommandError, match="the store did not answer"):
        call_command("ratelimits", "reset", "login", "--key", "192.0.2.9")


# -- a deleted policy's figures go with it ---------------------------------------------------


def figures(admin_client, policy) -> tuple[PolicyCounts | None, ...]:
    """What the admin shows of `policy`: its last hour in the list and on its page, its
    last day, its offenders."""
    listed = {p.name: p for p in admin_client.get(URL).context["cl"].result_list}
    page = admin_client.get(f"{URL}{policy.pk}/change/").context
    day = sum(observe.series([policy.name], 24 * 60)[policy.name], PolicyCounts())
    return listed[policy.name]._hour, page["hour_counts"], day, page["offenders"]


def record(admin_client, client, make_policy) -> Policy:
    """A policy with traffic this minute (admitted, rejected, an offender) and earlier
    today, as the admin shows it."""
    policy = make_policy(name="login", limit=1, path="/hello/")
    assert hit(client, 3, "192.0.2.9") == [200, 429, 429]
    now_us = int(time.time() * 1_000_000)
    get_engine().count_fields("login", now_us - 23 * 3600 * 1_000_000, {"a": 40, "r": 2})
    hour, on_page, day, offenders = figures(admin_client, policy)
    assert hour == on_page == PolicyCounts(admitted=1, rejected=2)
    assert day == PolicyCounts(admitted=41, rejected=4)
    assert offenders == [("ip:192.0.2.9", 2)]
    return policy


def test_a_policy_deleted_and_created_again_under_its_name_starts_from_zero(
    any_store, admin_client, client, make_policy, django_capture_on_commit_callbacks
):
    policy = record(admin_client, client, make_policy)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"{URL}{policy.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Policy.objects.exists()

    again = make_policy(name="login", limit=1, path="/hello/")
    assert figures(admin_client, again) == (PolicyCounts(), PolicyCounts(), PolicyCounts(), [])


def test_the_figures_stay_when_the_delete_is_rolled_back(
    admin_client, client, make_policy, django_capture_on_commit_callbacks
):
    from django.db import transaction

    policy = record(admin_client, client, make_policy)
    with (django_capture_on_commit_callbacks(execute=True) as callbacks,
          contextlib.suppress(RuntimeError), transaction.atomic()):
        Policy.objects.filter(pk=policy.pk).delete()
        raise RuntimeError("rolled back")
    assert callbacks == [] and Policy.objects.filter(pk=policy.pk).exists()
    hour, _, day, offenders = figures(admin_client, policy)
    assert hour == PolicyCounts(admitted=1, rejected=2) and day.total == 45 and offenders


def test_a_store_outage_at_the_delete_is_logged_not_raised(
    admin_client, make_policy, settings, caplog, django_capture_on_commit_callbacks
):
    from tests.redis_server import free_port

    policy = make_policy(name="login", limit=1)
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"{URL}{policy.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Policy.objects.exists()
    assert "could not delete the figures of deleted policy 'login'" in caplog.text


def test_forgetting_names_its_keys_and_leaves_other_policies_alone(any_store, client,
                                                                   make_policy):
    make_policy(name="login", limit=1, path="/hello/")
    make_policy(name="login-2", limit=1, path="/hello/")  # a name that starts the same
    hit(client, 2, "192.0.2.9")
    forget_figures("login")
    totals = observe.last_hour(["login", "login-2"])
    assert totals == {"login": PolicyCounts(),
                      "login-2": PolicyCounts(admitted=1, rejected=1)}
    assert observe.offenders("login-2") == [("ip:192.0.2.9", 1)]


def test_forgetting_reaches_back_as_far_as_figures_are_kept(any_store):
    from ratelimits.engine.keynames import to_us
    from ratelimits.pipeline.engines import get_engine

    engine = get_engine()
    now = 1_704_067_200.0
    for ago in (0, 3600, 24 * 3600):
        engine.count_fields("p", to_us(now - ago), {"a": 1})
        engine.count_fields("q", to_us(now - ago), {"a": 1})
    forget_figures("p", now=now)
    for ago in (0, 3600, 24 * 3600):
        minute = int((now - ago) // 60)
        assert engine.counters("p", minute) == {}
        assert engine.counters("q", minute) == {"a": 1}
