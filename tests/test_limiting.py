"""`ratelimits.limit()`: the admin's policies for work outside requests, decided by the
same engines: a turn waited for, `Limited` past the timeout, shadow, off and `on_error`
as for a request, the figures in the store's counters."""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import subprocess
import sys
import time

import pytest
from django.core.exceptions import ImproperlyConfigured

import ratelimits
from ratelimits import Limited, limit, runtime
from ratelimits.models import Policy
from ratelimits.pipeline.engines import get_engine
from ratelimits.receivers import policies_changed
from ratelimits.testing import Clock
from tests.redis_server import RedisProcess, free_port
from tests.support.workers import ROOT, Site

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("forget_declarations")]


def minute() -> int:
    return math.floor(time.time() / 60)


def counters(name: str) -> dict[str, int]:
    get_engine().flush()  # the tally, sent now rather than within a second
    return get_engine().counters(name, minute())


def test_the_package_exports_limit_and_limited():
    assert ratelimits.limit is limit and ratelimits.Limited is Limited
    with pytest.raises(AttributeError):
        ratelimits.nothing_of_that_name  # noqa: B018


def test_a_call_past_the_limit_raises_limited_when_it_may_not_wait():
    emails = limit("emails-x", rate="2/m", timeout=0)
    for _ in range(2):
        with emails:
            pass
    with pytest.raises(Limited) as refused, emails:
        raise AssertionError("the block runs only with a turn")
    assert refused.value.policy == "emails-x"
    assert 0 < refused.value.retry_after <= 60
    assert counters("emails-x") == {"a": 2, "r": 1}  # the admin's figures


def test_limited_is_made_again_from_its_arguments_as_pickle_and_celery_make_it():
    refused = Limited("emails-x", 2.5)
    for again in (pickle.loads(pickle.dumps(refused)), Limited(*refused.args)):
        assert (again.policy, again.retry_after) == ("emails-x", 2.5)
        assert str(again) == str(refused) == ("rate limit 'emails-x': no turn within the "
                                              "timeout; retry in 2.5 s")


def test_a_declared_limit_is_a_policy_the_operator_sees_and_switches():
    partner = limit("partner-y", rate="1/h", timeout=0)
    with partner:
        pass
    row = Policy.objects.get(name="partner-y")
    assert row.declared and (row.limit, row.period, row.algorithm) == (1, 3600, "gcra")

    row.mode = "shadow"  # as the admin's action does
    row.save()
    policies_changed()
    started = time.monotonic()
    for _ in range(3):  # never waits, never refuses: the would-be refusals are counted
        with partner:
            pass
    assert time.monotonic() - started < 1
    assert counters("partner-y")["w"] == 3

    row.mode = "off"
    row.save()
    policies_changed()
    with partner:
        pass
    assert counters("partner-y")["w"] == 3  # off: not even counted


def test_each_key_has_its_own_count_and_cost_charges_several_units():
    tenants = {t: limit("tenant-z", rate="3/m", key=t, timeout=0) for t in ("acme", "globex")}
    with tenants["acme"]:
        pass
    with pytest.raises(Limited), limit("tenant-z", rate="3/m", key="acme", cost=3, timeout=0):
        pass  # 1 + 3 > 3
    with limit("tenant-z", rate="3/m", key="globex", cost=3, timeout=0):
        pass  # its own count


def test_a_turn_is_waited_for_in_order():
    turns = limit("paced", rate="10/s", burst=1, timeout=5)
    started = time.monotonic()
    for _ in range(4):
        with turns:
            pass
    # one at once, then a turn every 0.1 s: the engine reserved each in turn
    assert time.monotonic() - started >= 0.25


def test_turns_are_waited_for_on_the_installed_clock():
    """Under a test's clock (`ratelimits.testing.Clock`) a turn is decided at its time and
    waited for by moving it, as a request told to wait is: nothing sleeps."""
    clock = Clock(1_000_000)
    turns = limit("paced-on-a-clock", rate="10/s", burst=1, timeout=5)
    with runtime.using_clock(clock):
        for _ in range(4):
            with turns:
                pass
        assert clock.time() - 1_000_000 == pytest.approx(0.3)  # a turn each 0.1 s
        with pytest.raises(Limited) as refused, limit("paced-on-a-clock", timeout=0):
            pass
    assert refused.value.retry_after > 0


@pytest.mark.django_db(transaction=True)  # the async path reads the policies in a thread
def test_a_decorated_function_and_an_async_block_take_turns_too():
    calls = []

    @limit("decorated", rate="2/m", timeout=0)
    def send(n):
        calls.append(n)
        return n

    assert [send(1), send(2)] == [1, 2]
    with pytest.raises(Limited):
        send(3)
    assert calls == [1, 2]

    async def main():
        async with limit("awaited", rate="1/m", timeout=0):
            pass
        with pytest.raises(Limited):
            async with limit("awaited", rate="1/m", timeout=0):
                pass

        @limit("awaited-fn", rate="1/m", timeout=0)
        async def fetch():
            return "ok"

        assert await fetch() == "ok"
        with pytest.raises(Limited):
            await fetch()

    asyncio.run(main())


def test_a_concurrency_turn_is_held_for_the_block_and_given_back():
    slot = limit("one-at-a-time", rate="1/m", algorithm="concurrency", timeout=0)
    # entered again while the first still holds the only slot
    with slot, pytest.raises(Limited), slot:
        pass
    with slot:  # given back at the end of the block
        pass


def test_an_admin_policy_without_rate_and_no_policy_at_all():
    Policy.objects.create(name="outbound-admin", mode="enforce", algorithm="fixed_window",
                          limit=1, period=60, key="global", path="*", scope="jobs")
    policies_changed()
    with limit("outbound-admin", timeout=0):
        pass
    with pytest.raises(Limited), limit("outbound-admin", timeout=0):
        pass
    for _ in range(3):  # no such policy: nothing limits the call
        with limit("nobody-declared-this", timeout=0):
            pass


@pytest.mark.parametrize(("on_error", "raises"), [("allow", False), ("deny", True)])
def test_a_store_out_of_reach_leaves_the_call_to_on_error(settings, on_error, raises):
    Policy.objects.create(name=f"down-{on_error}", mode="enforce", algorithm="gcra", limit=5,
                          period=60, key="global", path="*", scope="jobs", on_error=on_error)
    policies_changed()
    settings.RATELIMITS = {**settings.RATELIMITS,
                           "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    if raises:
        with pytest.raises(Limited) as refused, limit(f"down-{on_error}", timeout=0):
            pass
        assert refused.value.retry_after == 1
    else:
        with limit(f"down-{on_error}", timeout=0):
            pass


def test_mistakes_are_refused_saying_what_to_fix():
    with pytest.raises(ImproperlyConfigured, match="cost must be a positive integer"):
        limit("bad", rate="1/m", cost=0)
    with pytest.raises(ImproperlyConfigured, match="timeout must be a number"):
        limit("bad", rate="1/m", timeout=-1)
    with pytest.raises(ImproperlyConfigured, match=r"limit\('bad'\)"):
        limit("bad", rate="often")


# -- four processes share one pace ---------------------------------------------------------

CALLER = """
import json, sys, time
from ratelimits import limit
pace = limit("partner-api", rate="10/s", burst=2, timeout=30)
times = []
for _ in range(10):
    with pace:
        times.append(time.time())
print(json.dumps(times))
"""


@pytest.mark.slow
def test_four_processes_calling_a_partner_share_its_pace(tmp_path):
    server = RedisProcess().start()
    try:
        site = Site(tmp_path, server.url)
        callers = [subprocess.Popen([sys.executable, "-c", "import django; django.setup()\n"
                                     + CALLER], cwd=ROOT, env=site.env,
                                    stdout=subprocess.PIPE, text=True) for _ in range(4)]
        times = sorted(t for c in callers for t in json.loads(c.communicate(timeout=90)[0]))
    finally:
        server.stop()
    assert len(times) == 40  # every call ran: none timed out
    # never more than the rate plus the burst in any one second, across the processes
    busiest = max(sum(1 for t in times[i:] if t - start < 1.0)
                  for i, start in enumerate(times))
    assert busiest <= 10 + 2, busiest
    assert times[-1] - times[0] >= (40 - 2) / 10 - 0.2  # paced, not let through at once
