"""What the admin, a policy file and `full_clean()` accept must be able to run: a `call:`
key or a cost function that imports, a period of at most a year, a bucket that refills
within one; and `ratelimits.W010` for the rows saved before (or before a deploy renamed
the code they name)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection

from ratelimits.engine.types import MAX_LOCKOUT
from ratelimits.models import MAX_PERIOD, Policy

pytestmark = pytest.mark.django_db

URL = "/admin/ratelimits/policy/"
FORM = {
    "name": "x", "mode": "enforce", "algorithm": "fixed_window", "limit": 5, "period": 60,
    "cost": 1, "key": "ip", "path": "*", "methods": "", "scope": "", "on_error": "allow",
    "counting": "shared", "rollout": 100, "priority": 0, "max_wait": 0, "warmup": 0,
    "lockout": 0,
}


def errors_of(**fields) -> dict[str, list[str]]:
    policy = Policy(**{**{k: v for k, v in FORM.items() if k != "mode"}, **fields})
    with pytest.raises(ValidationError) as info:
        policy.full_clean()
    return info.value.message_dict


# -- the bounds --------------------------------------------------------------------------


def test_a_period_past_a_year_is_refused_with_what_to_write():
    (message,) = errors_of(period=99999999999)["period"]
    assert message.startswith("A period of 99999999999 s is longer than a year: set at "
                              "most 31622400 (366 days).")
    assert errors_of(period=MAX_PERIOD + 1)["period"]
    Policy(**{**FORM, "period": MAX_PERIOD}).full_clean()  # a year, leap years included


@pytest.mark.parametrize(("fields", "says"), [
    ({"algorithm": "token_bucket", "limit": 1, "period": 86400, "burst": 400},
     "A bucket of 400 at 1 per 86400 s takes 34560000 s to refill, longer than a year "
     "(31622400 s): a client that spent it would be told to wait as long. Set the burst "
     "to at most 366;"),
    ({"algorithm": "gcra", "limit": 1, "period": MAX_PERIOD, "warmup": 60},
     "with a warm-up (a cold client at a third of the rate) takes 94867200 s to refill"),
])
def test_a_bucket_that_refills_over_more_than_a_year_is_refused(fields, says):
    (message,) = errors_of(**fields)["burst"]
    assert says in message


def test_a_lockout_past_thirty_days_is_refused():
    (message,) = errors_of(lockout=MAX_LOCKOUT + 1)["lockout"]
    assert message.startswith(f"Lockout must be at most {MAX_LOCKOUT} seconds (30 days)")


def test_max_wait_is_held_to_max_delay():
    (message,) = errors_of(algorithm="gcra", max_wait=99999999999)["max_wait"]
    assert "set the max wait to at most 5" in message


def test_max_delay_is_at_most_a_minute():
    from django.core.exceptions import ImproperlyConfigured

    from ratelimits.conf import build_config

    assert build_config({"MAX_DELAY": 60})["MAX_DELAY"] == 60.0
    with pytest.raises(ImproperlyConfigured, match=r"RATELIMITS\['MAX_DELAY'\] must be at "
                       r"most 60 seconds, got 3600: a request held longer is cut off"):
        build_config({"MAX_DELAY": 3600})


def test_the_admin_shows_the_bound_on_the_field(admin_client):
    response = admin_client.post(URL + "add/", {**FORM, "period": 99999999999})
    assert response.status_code == 200  # the form again, with the error
    assert "is longer than a year: set at most 31622400" in response.content.decode()
    assert not Policy.objects.exists()


def export_with(tmp_path, **fields):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "ratelimits.policies", "version": 1,
                                "policies": [{**FORM, **fields}]}))
    return path


def test_an_import_refuses_a_period_past_a_year(tmp_path):
    with pytest.raises(CommandError) as info:
        call_command("ratelimits", "import", str(export_with(tmp_path, period=99999999999)))
    assert "policy 1 'x': period: A period of 99999999999 s is longer than a year" in str(
        info.value)
    assert not Policy.objects.exists()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "token_bucket", "gcra"])
def test_a_client_refused_under_the_longest_period_is_told_a_sane_retry_after(
    client, make_policy, algorithm
):
    """At most a period, two for a sliding window: never the 118-billion-second answer
    a period of 99999999999 gave."""
    make_policy(name="yearly", algorithm=algorithm, limit=1, period=MAX_PERIOD,
                path="/hello/")
    assert client.get("/hello/").status_code == 200
    refused = client.get("/hello/")
    assert refused.status_code == 429
    retry_after = int(refused["Retry-After"])
    bound = 2 * MAX_PERIOD if algorithm == "sliding_window" else MAX_PERIOD
    assert 1 <= retry_after <= bound


# -- call: keys, as cost functions are -----------------------------------------------------


def test_a_call_key_that_does_not_import_is_refused_in_the_admin(admin_client):
    response = admin_client.post(URL + "add/", {**FORM, "key": "call:nope.missing.fn"})
    page = response.content.decode()
    assert "&#x27;nope.missing.fn&#x27; cannot be imported (ModuleNotFoundError" in page
    assert not Policy.objects.exists()


@pytest.mark.parametrize(("key", "says"), [
    ("call:nope.missing.fn", "'nope.missing.fn' cannot be imported (ModuleNotFoundError"),
    ("call:sys.exit", "'sys.exit' is a builtin, not a function written in Python"),
    ("call:shutil.copyfile", "'shutil.copyfile' takes (src, dst"),
])
def test_an_import_refuses_a_call_key_that_cannot_run(tmp_path, key, says):
    with pytest.raises(CommandError) as info:
        call_command("ratelimits", "import", str(export_with(tmp_path, key=key)))
    assert f"policy 1 'x': key: {says}" in str(info.value).replace("\n", " ")


# -- W010: rows that cannot run as saved -------------------------------------------------


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A module of the project's, `renamed()` away as a deploy would."""
    name = "rl_keys_of_this_test"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        def tenant(request):
            return request.headers.get("X-Tenant")

        def rows(request):
            return 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))

    class Module:
        def renamed(self):
            (tmp_path / f"{name}.py").unlink()
            sys.modules.pop(name, None)

    yield Module()
    sys.modules.pop(name, None)


def w010() -> list:
    return [m for m in run_checks(databases=["default"]) if m.id == "ratelimits.W010"]


def test_w010_a_call_key_or_cost_function_that_no_longer_imports(module):
    Policy(**{**FORM, "name": "tenant", "key": "call:rl_keys_of_this_test.tenant"}).full_clean()
    Policy.objects.create(**{**FORM, "name": "tenant", "key": "call:rl_keys_of_this_test.tenant"})
    Policy.objects.create(**{**FORM, "name": "rows", "mode": "shadow",
                             "cost_function": "rl_keys_of_this_test.rows"})
    assert w010() == []
    module.renamed()

    found = {m.obj.name: m for m in w010()}
    assert set(found) == {"tenant", "rows"}
    assert found["tenant"].msg.startswith(
        "The policy 'tenant' (enforce) cannot run as saved. key: "
        "'rl_keys_of_this_test.tenant' cannot be imported (ModuleNotFoundError")
    assert found["tenant"].msg.endswith(
        "So each request it matches is decided by its on_error (allow), with an ERROR "
        "logged each time.")
    assert "cost_function: 'rl_keys_of_this_test.rows' cannot be imported" in found["rows"].msg
    assert found["rows"].msg.endswith("charged the policy's cost (1) instead, with an ERROR "
                                      "logged.")
    assert found["tenant"].hint.startswith("Change the policy in the admin")
    assert "ratelimits.W010" not in {m.id for m in run_checks()}  # a database check


def test_w010_a_row_saved_before_the_bound():
    policy = Policy.objects.create(**{**FORM, "name": "forever"})
    Policy.objects.filter(pk=policy.pk).update(period=99999999999)  # as a row of old
    (message,) = w010()
    assert "period: A period of 99999999999 s is longer than a year" in message.msg
    assert message.msg.endswith("told to come back more than a year later.")


def test_w010_is_quiet_before_migrate():
    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute("ALTER TABLE ratelimits_policy RENAME TO ratelimits_policy_gone")
    assert w010() == []
