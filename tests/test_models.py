"""Policy validation: every refusal lands on its field with a message that says what to fix."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from ratelimits.models import Policy, human_period

pytestmark = pytest.mark.django_db

VALID = {
    "name": "login-per-ip",
    "algorithm": "fixed_window",
    "limit": 5,
    "period": 60,
    "key": "ip",
    "path": "/login/",
}


def errors_for(**changes) -> dict[str, list[str]]:
    policy = Policy(**{**VALID, **changes})
    with pytest.raises(ValidationError) as info:
        policy.full_clean()
    return info.value.message_dict


def test_a_valid_policy_passes_and_defaults_to_shadow():
    policy = Policy(**VALID, methods=" post, get ")
    policy.full_clean()
    assert policy.mode == "shadow"
    assert policy.on_error == "allow"
    assert policy.methods == "GET,POST"  # normalised: upper case, one order


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"limit": 0}, "limit", "greater than or equal to 1"),
        ({"limit": -3}, "limit", "greater than or equal to"),
        ({"period": 0}, "period", "greater than or equal to 1"),
        ({"cost": 0}, "cost", "greater than or equal to 1"),
        ({"algorithm": "bogus"}, "algorithm", "not a valid choice"),
        ({"key": "ipx"}, "key", ""),
        ({"key": "header:"}, "key", ""),
        ({"key": "call:"}, "key", ""),
        ({"path": "/api/**x/"}, "path", ""),
        ({"burst": 10}, "burst", "has no burst"),
        ({"algorithm": "token_bucket", "burst": 2, "cost": 5}, "cost", "exceeds the capacity"),
        ({"cost": 6}, "cost", "lower the cost or raise"),
        ({"methods": "GET, P0ST"}, "methods", "is not an HTTP method"),
        ({"scope": "my scope!"}, "scope", "throttle_scope"),
        ({"name": "bad name"}, "name", "letters, digits"),
        ({"name": ""}, "name", "cannot be blank"),
        ({"algorithm": "gcra", "batch": 2}, "batch", "refill, expire"),
        ({"algorithm": "sliding_log", "batch": 2}, "batch", "fixed_window and sliding_window"),
        ({"algorithm": "concurrency", "batch": 2}, "batch", "not to concurrency"),
        ({"batch": 6}, "batch", "from the cost (1) to the limit (5)"),
        ({"batch": 1, "cost": 2}, "batch", "from the cost (2)"),
        ({"batch": 2, "counting": "per_process"}, "batch", "clear batch or count shared"),
        ({"counting": "everywhere"}, "counting", "not a valid choice"),
        ({"algorithm": "gcra", "burst": 0}, "burst", "at least 1"),
        # 1 per 10 s with a queue of 3 would hold the last 30 s; MAX_DELAY is 5 s
        ({"algorithm": "leaky_bucket", "limit": 1, "period": 10, "burst": 3}, "burst",
         "holds a request up to 30 s, longer than RATELIMITS['MAX_DELAY'] (5 s); set the "
         "queue to at most 0"),
        ({"algorithm": "leaky_bucket", "limit": 5, "period": 1, "burst": 30}, "burst",
         "set the queue to at most 25"),
    ],
)
def test_each_invalid_combination_is_refused_on_its_field(changes, field, says):
    errors = errors_for(**changes)
    assert field in errors, errors
    assert len(errors[field]) == 1, errors  # one message per mistake
    message = errors[field][0]
    assert says in message
    assert len(message) > 10  # a message a person can act on, not a bare code


ADMIN_FORM = {"name": "x", "mode": "shadow", "algorithm": "fixed_window", "limit": 5,
              "period": 60, "burst": "", "cost": 1, "key": "ip", "path": "*", "methods": "",
              "scope": "", "on_error": "allow", "counting": "shared", "priority": 0,
              "rollout": 100, "max_wait": 0, "warmup": 0, "lockout": 0,
              "overrides-TOTAL_FORMS": 0,
              "overrides-INITIAL_FORMS": 0}


@pytest.mark.parametrize(
    "changes",
    [{"limit": 0}, {"limit": -1}, {"period": 0}, {"cost": 0}, {"batch": 0},
     {"algorithm": "gcra", "burst": 0}],
)
def test_the_admin_form_says_one_thing_per_mistake(admin_client, changes):
    (field,) = set(changes) - {"algorithm"}
    response = admin_client.post("/admin/ratelimits/policy/add/", {**ADMIN_FORM, **changes})
    errors = response.context["adminform"].form.errors
    assert set(errors) == {field}
    assert errors[field] == ["Ensure this value is greater than or equal to 1."]


def test_batch_reaches_the_limit_of_a_shared_policy_only():
    shared = Policy(**VALID, batch=3)
    shared.full_clean()
    assert shared.as_limit("c").batch == 3
    alone = Policy(**VALID, counting="per_process")
    alone.full_clean()
    assert alone.as_limit("c").batch is None
    assert Policy(**VALID).counting == "shared"


def test_bad_key_message_names_the_grammar():
    message = " ".join(errors_for(key="cookie:sid")["key"])
    assert "cookie" in message


def test_period_of_ten_minutes_is_fine_and_reads_well():
    policy = Policy(**{**VALID, "limit": 100, "period": 600})
    policy.full_clean()
    assert policy.human_rate() == "100 per 10 minutes"


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"limit": 100, "period": 60}, "100 per minute"),
        ({"limit": 5, "period": 1}, "5 per second"),
        ({"limit": 3, "period": 3600}, "3 per hour"),
        ({"limit": 3, "period": 7200}, "3 per 2 hours"),
        ({"limit": 1000, "period": 86400}, "1000 per day"),
        ({"limit": 100, "period": 90}, "100 per 90 seconds"),
        (
            {"limit": 100, "period": 60, "algorithm": "token_bucket", "burst": 20},
            "100 per minute, burst 20",
        ),
        ({"limit": 10, "period": 60, "cost": 2}, "10 per minute, cost 2"),
        ({"limit": 10, "period": 60, "algorithm": "concurrency"}, "10 at a time"),
    ],
)
def test_human_rate(fields, text):
    assert Policy(**{**VALID, **fields}).human_rate() == text


def test_human_period():
    assert [human_period(s) for s in (1, 60, 120, 3600, 5400)] == [
        "second",
        "minute",
        "2 minutes",
        "hour",
        "90 minutes",
    ]


def test_limit_view_of_a_policy():
    policy = Policy(**{**VALID, "mode": "shadow", "algorithm": "gcra", "burst": 7})
    limit = policy.as_limit("1.2.3.4")
    assert (limit.key, limit.algorithm, limit.limit, limit.period) == ("1.2.3.4", "gcra", 5, 60.0)
    assert limit.burst == 7 and limit.shadow and limit.name == "login-per-ip"


@pytest.mark.parametrize("name", ["a\rb", "a\nb", "trailing\n", "bad name", "ümlaut", "-x", ""])
def test_a_bad_name_is_refused_on_save_without_full_clean(name):
    with pytest.raises(ValidationError) as info:
        Policy.objects.create(**{**VALID, "name": name})
    message = " ".join(info.value.message_dict["name"])
    assert "letters, digits" in message  # says what to write
    assert not Policy.objects.exists()  # nothing saved


def test_a_valid_name_saves_and_a_rename_is_checked_too():
    policy = Policy.objects.create(**{**VALID, "name": "api:v2_login-per.ip"})
    policy.name = "renamed\r"
    with pytest.raises(ValidationError):
        policy.save()
    assert Policy.objects.get().name == "api:v2_login-per.ip"


def test_a_final_newline_in_a_name_lands_on_the_field_in_forms():
    # The field's `$` regex alone lets "name\n" through; full_clean() must not.
    assert "name" in errors_for(name="login\n")


def test_a_queue_that_drains_within_max_delay_is_accepted(settings):
    Policy(**{**VALID, "algorithm": "leaky_bucket", "limit": 5, "period": 1,
              "burst": 25}).full_clean()  # the last waits 5 s: exactly MAX_DELAY
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_DELAY": 30}
    Policy(**{**VALID, "algorithm": "leaky_bucket", "limit": 1, "period": 10,
              "burst": 3}).full_clean()  # 30 s, now allowed


@pytest.mark.django_db
def test_an_override_of_limit_zero_is_refused_with_what_to_do_instead():
    from django.core.exceptions import ValidationError

    from ratelimits.models import Override

    policy = Policy.objects.create(name="p", limit=5, period=60)
    with pytest.raises(ValidationError) as info:
        Override(policy=policy, match="ip:192.0.2.1", limit=0).full_clean()
    assert "0 is not a limit" in " ".join(info.value.message_dict["limit"])
    assert "exempt" in " ".join(info.value.message_dict["limit"])
