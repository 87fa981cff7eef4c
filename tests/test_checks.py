"""System checks, run as `manage.py check` runs them, under override_settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core import checks
from django.core.checks import run_checks
from django.test import override_settings

MW = "ratelimits.middleware.RateLimitMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"


def ids() -> set[str]:
    return {m.id for m in run_checks() if (m.id or "").startswith("ratelimits.")}


def messages(check_id):
    return [m for m in run_checks() if m.id == check_id]


def test_the_test_settings_pass():
    assert ids() == set()


@override_settings(RATELIMITS={"HEADER": "ietf"})
def test_e001_unknown_key():
    (msg,) = messages("ratelimits.E001")
    assert "HEADER" in msg.msg and msg.hint


def test_e001_hint_points_to_a_page_that_exists():
    with override_settings(RATELIMITS={"HEADER": "ietf"}):
        (msg,) = messages("ratelimits.E001")
    assert '"Settings" page' in msg.hint and "docs/settings.md" in msg.hint
    page = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    assert page.startswith("# Settings\n") and "\n## Every key\n" in page


def test_every_check_has_its_section_in_the_docs():
    """docs/checks.md has a section per check id of ratelimits/checks.py and
    ratelimits/policy_checks.py, and no other."""
    root = Path(__file__).resolve().parents[1]
    source = "".join((root / "ratelimits" / name).read_text()
                     for name in ("checks.py", "policy_checks.py"))
    page = (root / "docs" / "checks.md").read_text()
    declared = set(re.findall(r'id="(ratelimits\.[EWI]\d{3})"', source))
    sections = set(re.findall(r"^### `(ratelimits\.[EWI]\d{3})`$", page, re.MULTILINE))
    assert declared and sections == declared


@override_settings(RATELIMITS={"MAX_DELAY": "soon"})
def test_e001_bad_value():
    (msg,) = messages("ratelimits.E001")
    assert "MAX_DELAY" in msg.msg


def test_e002_middleware_before_authentication():
    order = [m for m in settings.MIDDLEWARE if m != MW]
    order.insert(order.index(AUTH), MW)
    with override_settings(MIDDLEWARE=order):
        (msg,) = messages("ratelimits.E002")
    assert "AuthenticationMiddleware" in msg.hint


@override_settings(RATELIMITS={"CACHE": "nope"})
def test_e003_unknown_cache_alias():
    assert "ratelimits.E003" in ids()


@override_settings(RATELIMITS={"REJECT_VIEW": "tests.nowhere.view"})
def test_e004_reject_view_not_importable():
    (msg,) = messages("ratelimits.E004")
    assert "tests.nowhere.view" in msg.msg


@override_settings(RATELIMITS={"TIER": "tests.nowhere.plan"})
def test_e004_tier_not_importable():
    """A TIER that cannot be imported would give no request a tier: every client would
    get the limits of none, quietly."""
    (msg,) = messages("ratelimits.E004")
    assert "RATELIMITS['TIER'] = 'tests.nowhere.plan'" in msg.msg


@override_settings(RATELIMITS={"CACHE": "local"})
def test_w001_store_not_shared():
    (msg,) = messages("ratelimits.W001")
    assert "each process" in msg.msg and "django-redis" in msg.hint


@override_settings(
    CACHES={
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/3",
        }
    }
)
def test_djangos_own_redis_cache_counts_as_shared():
    assert "ratelimits.W001" not in ids()


def test_w002_nothing_installed():
    without = [m for m in settings.MIDDLEWARE if m != MW]
    with override_settings(MIDDLEWARE=without, REST_FRAMEWORK={}):
        assert "ratelimits.W002" in ids()
    with override_settings(MIDDLEWARE=without):  # the DRF throttle alone is enough
        assert "ratelimits.W002" not in ids()


@override_settings(RATELIMITS={"TRUSTED_PROXIES": ["10.0.0.0/8"]})
def test_i001_trusted_proxies_without_a_chosen_header():
    (msg,) = messages("ratelimits.I001")
    assert msg.level == checks.INFO
    assert "X-Forwarded-For" in msg.msg and "PROXY_HEADER" in msg.hint
    assert "'forwarded'" in msg.hint


def test_i001_is_quiet_once_the_header_is_chosen_or_no_proxy_is_trusted():
    chosen = {"TRUSTED_PROXIES": ["10.0.0.0/8"], "PROXY_HEADER": "x-forwarded-for"}
    with override_settings(RATELIMITS=chosen):
        assert "ratelimits.I001" not in ids()
    with override_settings(RATELIMITS={"PROXY_HEADER": "forwarded"}):
        assert "ratelimits.I001" not in ids()


# -- W004: an enforced policy that can lock an operator out of the admin -------------------


def lockout(**fields):
    from ratelimits.models import Policy

    values = {"name": "p", "mode": "enforce", "algorithm": "fixed_window", "limit": 5,
              "period": 60, "key": "ip", "path": "*"}
    values.update(fields)
    Policy.objects.create(**values)
    return [m for m in run_checks(databases=["default"]) if m.id == "ratelimits.W004"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["*", "/admin/**", "/admin/"])
def test_w004_an_enforced_policy_over_the_admin(path):
    (msg,) = lockout(path=path)
    assert "'p'" in msg.msg and "/admin/" in msg.msg and "EXEMPT" in msg.hint


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"methods": "POST"},  # the admin's pages stay open
    {"mode": "shadow"},
    {"path": "/api/**"},
    {"scope": "items"},  # applies to DRF views with that scope only
])
def test_w004_spares_policies_that_leave_the_admin_open(fields):
    assert lockout(**fields) == []


@pytest.mark.django_db
def test_w004_reads_the_admins_prefix_from_the_urlconf():
    with override_settings(ROOT_URLCONF="tests.support.urls_backoffice"):
        assert lockout(path="/admin/**") == []
        (msg,) = lockout(name="q", path="/backoffice/**")
    assert "/backoffice/" in msg.msg


@pytest.mark.django_db
def test_w004_is_a_database_check():
    """A plain `check` (or runserver) does not query the database."""
    from ratelimits.models import Policy

    Policy.objects.create(name="p", mode="enforce", algorithm="fixed_window", limit=5,
                          period=60, key="ip", path="*")
    assert "ratelimits.W004" not in ids()


# -- W007, W008: the DRF compat throttles' client address beside DRF's NUM_PROXIES ---------

COMPAT = {"DEFAULT_THROTTLE_CLASSES": ["ratelimits.compat.drf.AnonRateThrottle"]}


def test_w007_num_proxies_is_not_read_by_the_compat_throttles():
    with override_settings(REST_FRAMEWORK={**COMPAT, "NUM_PROXIES": 1}):
        (msg,) = messages("ratelimits.W007")
    assert msg.level == checks.WARNING
    assert "NUM_PROXIES'] is 1" in msg.msg and "counted as one" in msg.msg
    assert "TRUSTED_PROXIES" in msg.hint and "'num_proxies'" in msg.hint


@pytest.mark.parametrize("ratelimits", [
    {"TRUSTED_PROXIES": ["10.0.0.0/8"], "PROXY_HEADER": "x-forwarded-for"},  # ours is set
    {"DRF_CLIENT_IP": "num_proxies"},  # DRF's is asked for
])
def test_w007_is_quiet_when_the_proxies_are_told_one_way(ratelimits):
    with override_settings(REST_FRAMEWORK={**COMPAT, "NUM_PROXIES": 1}, RATELIMITS=ratelimits):
        assert not {"ratelimits.W007", "ratelimits.W008"} & ids()
    with override_settings(REST_FRAMEWORK=COMPAT):  # no NUM_PROXIES to rely on
        assert "ratelimits.W007" not in ids()


def test_w008_drfs_client_address_without_num_proxies_trusts_anyone():
    with override_settings(REST_FRAMEWORK=COMPAT, RATELIMITS={"DRF_CLIENT_IP": "num_proxies"}):
        (msg,) = messages("ratelimits.W008")
    assert "X-Forwarded-For whoever sends it" in msg.msg
    assert "NUM_PROXIES" in msg.hint and "TRUSTED_PROXIES" in msg.hint


def test_drf_client_ip_takes_one_of_two_values():
    with override_settings(RATELIMITS={"DRF_CLIENT_IP": "drf"}):
        (msg,) = messages("ratelimits.E001")
    assert "'trusted_proxies'" in msg.msg and "'num_proxies'" in msg.msg


# -- W006: a lockout declared in code that anyone can aim ----------------------------------


@pytest.mark.parametrize(("key", "warned"), [
    ("post:username", True), ("query:email", True), ("header:X-Account", True),
    ("ip", False), ("user", False),
])
def test_w006_a_declared_lockout_keyed_by_what_the_client_sends(forget_declarations, key,
                                                               warned):
    from ratelimits.decorators import ratelimit

    ratelimit(name="login-locked", rate="5/15m", key=key, lockout=3600)
    found = messages("ratelimits.W006")
    assert [m.obj for m in found] == (["login-locked"] if warned else [])
    if warned:
        assert found[0].msg.startswith(f"Policy 'login-locked' locks out by {key}, a value "
                                       "the client sends: anyone who sends a victim's value")
        assert "declared in code with @ratelimit(name='login-locked')" in found[0].msg
        assert "silence ratelimits.W006" in found[0].hint


def test_w006_without_a_lockout_is_quiet(forget_declarations):
    from ratelimits.decorators import ratelimit

    ratelimit(name="login-counted", rate="5/15m", key="post:username")
    assert "ratelimits.W006" not in ids()
