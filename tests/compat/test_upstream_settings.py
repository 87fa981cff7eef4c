"""django-ratelimit's own settings, as a migrating site has them: `RATELIMIT_USE_CACHE`
is read as the store where it counts as upstream did, refused by a check that says what
to write where it cannot; `RATELIMIT_FAIL_OPEN` is the `on_error` a new compat policy
starts with, so the admin says what a store outage does to it."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import RequestFactory, override_settings

from ratelimits.compat.django_ratelimit.decorators import ratelimit
from ratelimits.models import Policy
from ratelimits.ops.dashboard import store_notice
from ratelimits.pipeline.declared import registry
from ratelimits.testing import START
from tests.redis_server import free_port

pytestmark = pytest.mark.django_db

rf = RequestFactory()
NOWHERE = {"BACKEND": "django_redis.cache.RedisCache",
           "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}


@pytest.fixture(autouse=True)
def _one_window(clock):
    clock.freeze(START)


def ids(**overrides):
    with override_settings(**overrides):
        return [m.id for m in run_checks() if m.id.startswith("ratelimits.")]


def test_use_cache_naming_a_redis_cache_is_the_store(redis_url):
    caches = {"default": NOWHERE,  # nothing answers there: counting there would fail
              "ratelimit": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}}
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="ratelimit"):
        @ratelimit(key="ip", rate="2/m", block=False)
        def view(request):
            return request.limited

        assert [view(rf.get("/")) for _ in range(3)] == [False, False, True]
    assert "ratelimits.E005" not in ids(CACHES=caches, RATELIMIT_USE_CACHE="ratelimit")
    assert "ratelimits.W009" not in ids(CACHES=caches, RATELIMIT_USE_CACHE="ratelimit")


def test_use_cache_naming_a_cache_shared_elsewhere_is_refused_with_what_to_write():
    caches = {**settings.CACHES,
              "ratelimit": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                            "LOCATION": "ratelimit_cache"}}
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="ratelimit"):
        (error,) = [m for m in run_checks() if m.id == "ratelimits.E005"]
        found = {m.id for m in run_checks()}
    assert "RATELIMIT_USE_CACHE = 'ratelimit' names a django.core.cache.backends.db." in (
        error.msg)
    assert "each process would count on its own" in error.msg
    assert "RATELIMITS = {'CACHE':" in error.hint and "remove RATELIMIT_USE_CACHE" in error.hint
    assert "ratelimits.W001" not in found  # E005 says it, with what to write


def test_use_cache_naming_a_per_process_cache_counts_in_process_as_upstream_did():
    caches = {**settings.CACHES,
              "ratelimit": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    found = ids(CACHES=caches, RATELIMIT_USE_CACHE="ratelimit")
    assert "ratelimits.E005" not in found and "ratelimits.W001" in found


def test_use_cache_beside_ratelimits_own_store_is_not_read_and_says_so():
    own = {**settings.RATELIMITS, "CACHE": "default"}
    with override_settings(RATELIMITS=own, RATELIMIT_USE_CACHE="local"):
        (warning,) = [m for m in run_checks() if m.id == "ratelimits.W009"]
    assert "RATELIMIT_USE_CACHE = 'local' is not read: RATELIMITS['CACHE'] = 'default'" in (
        warning.msg)
    assert "ratelimits.W009" not in ids(RATELIMITS=own, RATELIMIT_USE_CACHE="default")


def test_use_cache_naming_no_cache_is_an_error_naming_the_setting():
    with override_settings(RATELIMIT_USE_CACHE="fake-cache"):
        (error,) = [m for m in run_checks() if m.id == "ratelimits.E003"]
    assert error.msg.startswith("RATELIMIT_USE_CACHE (read as RATELIMITS['CACHE']) is "
                                "'fake-cache'")


@pytest.mark.parametrize(("fail_open", "on_error"), [(None, "deny"), (False, "deny"),
                                                     (True, "allow")])
def test_fail_open_is_the_on_error_a_compat_policy_starts_with(fail_open, on_error):
    extra = {} if fail_open is None else {"RATELIMIT_FAIL_OPEN": fail_open}
    with override_settings(**extra):
        @ratelimit(group="login", key="ip", rate="5/m", block=False)
        def view(request):
            return request.limited

        view(rf.get("/"))
        registry.write(force=True)
        row = Policy.objects.get(name__startswith="dr:login")
    assert (row.declared, row.on_error) == (True, on_error)
    notice = store_notice("ConnectionError", [row])
    said = {what: names for what, names in notice.groups}
    expected = "refusing every request" if on_error == "deny" else "admitting every request"
    assert [what for what in said if what.startswith(expected)] != []


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_during_an_outage_a_compat_policy_does_what_its_row_and_the_banner_say(
        on_error, django_capture_on_commit_callbacks):
    """The row's `on_error` decides, whatever `RATELIMIT_FAIL_OPEN` was when the row was
    made: an operator who switched a compat policy to `allow` in the admin is obeyed,
    as the banner says."""
    @ratelimit(group="outage", key="ip", rate="1/m", block=False)
    def view(request):
        return request.limited

    with override_settings(RATELIMIT_FAIL_OPEN=False):
        view(rf.get("/"))
        registry.write(force=True)
        row = Policy.objects.get(name__startswith="dr:outage")
        row.on_error = on_error  # the operator's, in the admin: published to every process
        with django_capture_on_commit_callbacks(execute=True):
            row.save()
        view(rf.get("/"))  # the change met
        with override_settings(CACHES={"default": NOWHERE}):
            limited = [view(rf.get("/")) for _ in range(3)]
    (said,) = [what for what, _ in store_notice("ConnectionError", [row]).groups]
    if on_error == "allow":
        assert limited == [False] * 3 and said.startswith("admitting every request")
    else:
        assert limited == [True] * 3 and said.startswith("refusing every request")
