"""Top offenders as operators see them: guaranteed counts, said to be lower bounds."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from ratelimits.engine import Limit
from ratelimits.engine.keynames import OFFENDERS_CAP
from ratelimits.ops import observe
from ratelimits.pipeline.engines import get_engine

URL = "/admin/ratelimits/policy/"


def _attack(name: str, real: str, now: float) -> None:
    """`real` refused 50 times, then 1,500 rotating identities refused once each."""
    engine = get_engine()
    for _ in range(51):
        engine.evaluate([Limit(real, "fixed_window", 1, 3600, name=name)], now=now)
    # refusals answered in process reach the list within a second; here before the rest
    getattr(engine, "flush", lambda: None)()
    for who in [f"ip:198.18.{i >> 8}.{i & 255}" for i in range(1_500) for _ in range(2)]:
        engine.evaluate([Limit(who, "fixed_window", 1, 3600, name=name)], now=now)


def test_observe_ranks_by_guaranteed_count_through_the_attack(any_store):
    now = 1_800_000_000.0
    _attack("login", "ip:203.0.113.9", now)
    top = observe.offenders("login", OFFENDERS_CAP, now=now)
    assert top[0] == ("ip:203.0.113.9", 50)
    assert max(count for _, count in top[1:]) == 1


def test_the_policy_page_says_the_counts_are_lower_bounds(admin_client, client, make_policy):
    policy = make_policy(name="search", limit=1, path="/hello/")
    for _ in range(3):
        client.get("/hello/", REMOTE_ADDR="198.51.100.1")
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    assert "<td><code>ip:198.51.100.1</code></td><td>2</td>" in page
    assert "At least N refusals: counts of clients that entered a full list are lower " \
        "bounds" in page


def test_reset_without_a_key_says_the_counts_are_lower_bounds(client, make_policy):
    make_policy(name="hello-ip", limit=1, period=3600, path="/hello/")
    client.get("/hello/")
    client.get("/hello/")
    with pytest.raises(CommandError) as error:
        call_command("ratelimits", "reset", "hello-ip", stdout=io.StringIO())
    assert "ip:127.0.0.1 (1)" in str(error.value)
    assert observe.OFFENDERS_NOTE in str(error.value)
