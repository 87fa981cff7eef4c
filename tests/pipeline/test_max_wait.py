"""`max_wait` and `warmup` on policies: waiting for a turn instead of a 429 (sync and
async stacks, DRF), the admin's rules, and a warm-up seen through the middleware.

The clock is `ratelimits.testing`'s and stands still; the waits are recorded instead of
slept (the `waits` clock), so several requests arrive at one instant and each one's wait
is known.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError

from ratelimits.models import Policy
from ratelimits.pipeline.resolver import load_snapshot
from ratelimits.testing import Clock, limited

#: One per second, no burst, a request may wait 2 s for its turn.
PACED = {"name": "paced", "rate": "1/s", "algorithm": "gcra", "burst": 1, "max_wait": 2,
         "path": "/hello/"}


def test_a_request_whose_turn_comes_within_max_wait_waits_then_is_served(client, waits):
    with limited(PACED, clock=waits) as limits:
        codes = [client.get("/hello/").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        assert [round(w, 3) for w in waits.slept] == [1.0, 2.0]
        refused = client.get("/hello/")
        assert refused["Retry-After"] == "1"  # its turn at 3 s is 1 s beyond the 2 s
        limits.clock.advance(1)
        assert client.get("/hello/").status_code == 200
        assert round(waits.slept[-1], 3) == 2.0


def test_without_max_wait_the_same_request_is_refused_at_once(client, waits):
    with limited({**PACED, "max_wait": 0}, clock=waits):
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
        assert waits.slept == []


def test_the_async_stack_awaits_the_same_turns(async_client, waits):
    async def run():
        return [(await async_client.get("/async/")).status_code for _ in range(4)]

    with limited({**PACED, "path": "/async/"}, clock=waits):
        assert async_to_sync(run)() == [200, 200, 200, 429]
    assert [round(w, 3) for w in waits.slept] == [1.0, 2.0]


def test_a_drf_view_waits_in_its_throttle(client, waits):
    with limited({**PACED, "path": "*", "scope": "items"}, clock=waits):
        codes = [client.get("/api/items/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert [round(w, 3) for w in waits.slept] == [1.0, 2.0]


def test_the_waiting_room_bounds_max_wait_too(client, settings):
    """A client whose request is waiting gets a 429 for the next one at once."""
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_WAITING_PER_CLIENT": 1}
    from ratelimits.pipeline.waiting import room

    inner: list[int] = []

    class Impatient(Clock):  # while the first waits, the same client asks again
        def sleep(self, seconds: float) -> None:
            if not inner:
                inner.append(client.get("/hello/").status_code)

    with limited(PACED, clock=Impatient()):
        assert client.get("/hello/").status_code == 200
        assert client.get("/hello/").status_code == 200  # waited, and meanwhile ...
    assert inner == [429]  # ... its second request found no place in the room
    assert room.waiting() == 0


def test_warm_up_paces_a_cold_client_through_the_middleware(client, waits):
    """1 per second, burst 3, warm-up 6 s: a cold client is let through every 3 s, then
    every 2 s, then it is warm and has its burst."""
    rule = {"name": "warm", "rate": "1/s", "algorithm": "gcra", "burst": 3, "warmup": 6,
            "path": "/hello/"}
    with limited(rule, clock=waits) as limits:
        seen, start = [], limits.clock.now()
        for at in (0, 1, 3, 4, 5, 5, 5, 5):
            limits.clock.freeze(start + at)
            response = client.get("/hello/")
            seen.append((at, response.status_code, response.get("Retry-After")))
    assert seen == [(0, 200, None), (1, 429, "2"), (3, 200, None), (4, 429, "1"),
                    (5, 200, None), (5, 200, None), (5, 200, None), (5, 429, "1")]
    assert waits.slept == []


# -- the admin's rules ------------------------------------------------------------------

VALID = {"name": "p", "mode": "enforce", "limit": 10, "period": 1, "key": "ip", "path": "*"}


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"algorithm": "fixed_window", "max_wait": 1}, "max_wait",
         "Fixed window cannot take a max wait; set it to 0 or choose token bucket, leaky "
         "bucket or gcra."),
        ({"algorithm": "leaky_bucket", "warmup": 30}, "warmup",
         "Leaky bucket cannot take a warm-up; set it to 0 or choose token bucket or gcra."),
        ({"algorithm": "gcra", "max_wait": 6}, "max_wait",
         "A request is never held longer than RATELIMITS['MAX_DELAY'] (5 s); set the max "
         "wait to at most 5 or raise MAX_DELAY."),
        ({"algorithm": "gcra", "max_wait": -1}, "max_wait",
         "Ensure this value is greater than or equal to 0."),
        ({"algorithm": "leaky_bucket", "burst": 30, "max_wait": 3}, "burst",
         "A queue of 30 at this rate and this max wait holds a request up to 6 s, longer "
         "than RATELIMITS['MAX_DELAY'] (5 s); set the queue to at most 20, raise the "
         "rate, or raise MAX_DELAY."),
    ],
)
@pytest.mark.django_db
def test_a_wrong_wait_or_warm_up_is_refused_on_its_field(fields, field, message):
    with pytest.raises(ValidationError) as caught:
        Policy(**VALID, **fields).full_clean()
    assert caught.value.message_dict == {field: [message]}


@pytest.mark.django_db
def test_a_valid_policy_reaches_the_engine_and_reads_as_it_behaves():
    policy = Policy(**VALID, algorithm="token_bucket", burst=5, max_wait=0.5, warmup=60)
    policy.full_clean()
    limit = policy.as_limit("c")
    assert (limit.max_wait, limit.warmup) == (0.5, 60.0)
    assert policy.human_rate() == "10 per second, burst 5, waits up to 0.5 s, warm-up 60 s"


@pytest.mark.django_db
def test_an_override_keeps_the_policys_wait_and_a_saved_longer_wait_is_cut(settings):
    """A row saved before MAX_DELAY was lowered waits no longer than MAX_DELAY."""
    policy = Policy.objects.create(**VALID, algorithm="gcra", max_wait=4, warmup=10)
    policy.overrides.create(match="ip:10.0.0.1", limit=100)
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_DELAY": 2}
    compiled = load_snapshot(None).policies[0]
    assert compiled.template.max_wait == 2  # cut to MAX_DELAY
    (rule,) = compiled.overrides.exact.values()
    assert (rule.template.max_wait, rule.template.warmup, rule.template.limit) == (2, 10, 100)
