"""One reset function serves the admin and `manage.py ratelimits reset`: same reading of
the typed client, same refusals, and a store outage is a message, never a traceback."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ratelimits.ops.reset import reset_client

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
