"""`@ratelimit`: limits declared on views in code, rows in the admin, one decision."""

from __future__ import annotations

import types

import pytest
import redis
from asgiref.sync import async_to_sync
from django.apps import apps
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from ratelimits.decorators import ratelimit
from ratelimits.models import Override, Policy
from ratelimits.pipeline import evaluation
from ratelimits.pipeline.declared import registry
from ratelimits.testing import limited
from tests.pipeline.test_round_trips import commands

pytestmark = pytest.mark.django_db

MIDDLEWARE = "ratelimits.middleware.RateLimitMiddleware"


@pytest.fixture
def site(settings):
    """Decorated views at /login/, /search/ and /async/, declared for this test only."""
    before = dict(registry.declared)

    @ratelimit(name="login", rate="3/m", algorithm="sliding_log", methods="POST")
    def login(request):
        return HttpResponse("in")

    @method_decorator(ratelimit(name="search", rate="2/10m", key="ip"), name="dispatch")
    class Search(View):
        def get(self, request):
            return HttpResponse("found")

    @ratelimit(name="feed", rate="2/h", algorithm="gcra", burst=2)
    async def feed(request):
        return HttpResponse("fed")

    @ratelimit(name="export", rate="1/s", algorithm="token_bucket", max_wait=2, warmup=60)
    def export(request):
        return HttpResponse("exported")

    urls = types.ModuleType("decorated_urls")
    urls.urlpatterns = [path("login/", login), path("search/", Search.as_view()),
                        path("async/", feed), path("export/", export),
                        path("admin/", admin.site.urls)]
    settings.ROOT_URLCONF = urls
    registry.forget_written()
    yield
    registry.restore(before)
    registry.forget_written()


def _codes(client, n, url, method="get"):
    return [getattr(client, method)(url).status_code for _ in range(n)]


def test_a_function_view_is_limited_for_its_methods_only(client, site):
    assert _codes(client, 4, "/login/", "post") == [200, 200, 200, 429]
    assert _codes(client, 5, "/login/") == [200] * 5  # GET is not counted
    refused = client.post("/login/")
    assert refused["RateLimit-Policy"].startswith('"login"')
    assert int(refused["Retry-After"]) == 60


def test_a_class_view_with_method_decorator(client, site):
    assert _codes(client, 3, "/search/") == [200, 200, 429]


def test_an_async_view(async_client, site):
    async def three():
        return [(await async_client.get("/async/")).status_code for _ in range(3)]

    assert async_to_sync(three)() == [200, 200, 429]


def test_the_limit_is_a_policy_row_declared_in_code(client, admin_client, site):
    client.post("/login/")
    row = Policy.objects.get(name="login")
    assert (row.declared, row.algorithm, row.limit, row.period, row.methods, row.mode) == (
        True, "sliding_log", 3, 60, "POST", "enforce")
    page = admin_client.get(f"/admin/ratelimits/policy/{row.pk}/change/").content.decode()
    assert "Declared in code" in page
    assert 'name="limit"' not in page  # the code's figures are read-only here
    assert 'name="mode"' in page


def test_an_operator_switches_it_to_shadow_and_adds_an_override(
    client, site, django_capture_on_commit_callbacks
):
    assert _codes(client, 4, "/login/", "post")[-1] == 429
    row = Policy.objects.get(name="login")
    with django_capture_on_commit_callbacks(execute=True):
        row.mode = "shadow"
        row.save()
    assert _codes(client, 3, "/login/", "post") == [200] * 3
    with django_capture_on_commit_callbacks(execute=True):
        row.mode = "enforce"
        row.save()
        Override.objects.create(policy=row, match="ip:127.0.0.1", exempt=True)
    assert _codes(client, 5, "/login/", "post") == [200] * 5


def test_the_rate_stays_what_the_code_says(client, site, django_capture_on_commit_callbacks):
    client.post("/login/")
    with django_capture_on_commit_callbacks(execute=True):
        Policy.objects.filter(name="login").update(limit=100)
        Policy.objects.get(name="login").save()  # publish
    assert _codes(client, 3, "/login/", "post") == [200, 200, 429]


def test_one_store_call_per_request_with_the_middleware(client, site, private_redis, settings):
    settings.CACHES = {**settings.CACHES,
                       "default": {**settings.CACHES["default"], "LOCATION": private_redis.url}}
    Policy.objects.create(name="site", mode="enforce", algorithm="fixed_window", limit=100,
                          period=60, key="ip", path="*")
    assert client.get("/search/").status_code == 200  # snapshot and script loaded
    direct = redis.Redis.from_url(private_redis.url)
    before = commands(direct)
    assert client.get("/search/").status_code == 200
    after = commands(direct)
    assert after.get("fcall", 0) - before.get("fcall", 0) == 1
    assert after.get("evalsha", 0) == before.get("evalsha", 0)
    # and both policies counted it
    assert {r.name for r in Policy.objects.all()} >= {"site", "search"}
    assert _codes(client, 1, "/search/") == [429]  # search: 2 per 10 minutes


def test_without_the_middleware_the_decorator_answers_alone(client, site, settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE]
    ok = client.post("/login/")
    assert ok["RateLimit"].startswith('"login";r=2')
    assert _codes(client, 3, "/login/", "post") == [200, 200, 429]


def test_declared_limits_apply_inside_the_test_helpers(client, site):
    with limited():
        assert _codes(client, 4, "/login/", "post") == [200, 200, 200, 429]
    assert not Policy.objects.filter(name="login").exists()  # nothing written


def test_a_declared_wait_and_warm_up_reach_the_row_and_the_requests(
    client, admin_client, site, waits
):
    with limited(clock=waits):
        # cold: the warm-up paces at a third of the rate, and the second request waits
        # for its turn (3 s) beyond max_wait (2 s): refused, and nothing slept
        assert _codes(client, 2, "/export/") == [200, 429]
        assert waits.slept == []
    client.get("/export/")
    row = Policy.objects.get(name="export")
    assert (row.algorithm, row.max_wait, row.warmup) == ("token_bucket", 2, 60)
    assert row.human_rate() == "1 per second, waits up to 2 s, warm-up 60 s"
    page = admin_client.get(f"/admin/ratelimits/policy/{row.pk}/change/").content.decode()
    assert 'name="max_wait"' not in page and 'name="warmup"' not in page  # the code's


def test_migrate_writes_the_declared_rows(site):
    receiver = apps.get_app_config("ratelimits")
    from ratelimits.receivers import _write_declared

    _write_declared(sender=receiver)
    assert set(Policy.objects.filter(declared=True).values_list("name", flat=True)) >= {
        "login", "search", "feed"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "5 a minute"}, "is not N/<unit>"),
        ({"rate": "5/m", "algorithm": "fixed_window", "burst": 3}, "burst: Fixed window has"),
        ({"rate": "5/m", "key": "cookie:x"}, "key:"),
        ({"rate": "5/m", "mode": "loud"}, "mode 'loud'"),
        ({"rate": "5/m", "methods": "GET,P0ST"}, "methods:"),
        ({"rate": "5/m", "max_wait": 1}, "max_wait: Sliding window cannot take a max wait"),
    ],
)
def test_a_mistake_is_refused_at_import_with_what_to_fix(kwargs, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        ratelimit(name="bad", **kwargs)
    assert "bad" not in registry.declared


def test_one_name_with_two_rates_is_refused(site):
    ratelimit(name="login", rate="3/m", algorithm="sliding_log", methods="POST")  # same: fine
    with pytest.raises(ImproperlyConfigured, match="declared twice"):
        ratelimit(name="login", rate="4/m", algorithm="sliding_log", methods="POST")


def test_a_name_taken_by_an_operators_policy_still_limits_and_says_so(client, site, caplog):
    Policy.objects.create(name="login", mode="shadow", algorithm="fixed_window", limit=100,
                          period=60, key="ip", path="/elsewhere/")
    assert _codes(client, 4, "/login/", "post") == [200, 200, 200, 429]
    assert "a policy of that name exists and was not declared in code" in caplog.text
    assert not Policy.objects.get(name="login").declared  # the operator's row is untouched


# -- django-ratelimit's semantics on the native decorator ----------------------------------


class Refused(Exception):
    """What a `raise_on_refusal` test view raises."""



def test_block_false_runs_the_view_flagged_and_charges_nothing(rf, forget_declarations):
    @ratelimit(name="lenient", rate="2/m", block=False)
    @ratelimit(name="strict-hour", rate="100/h")
    def view(request):
        return request.limited  # not a response: no headers, no crash

    assert [view(rf.get("/")) for _ in range(4)] == [False, False, True, True]
    # the refused requests were not charged to "lenient", but the site's other policy
    # ("strict-hour", decided again without it) counted all four (and this read, one)
    assert evaluation.evaluate(rf.get("/"), scopes=frozenset({"code:strict-hour"}),
                               sender=object).outcomes[0].result.remaining == 95


def test_raise_on_refusal_and_any_method_order(rf, forget_declarations):
    @ratelimit(name="raising", rate="1/m", methods=["POST", "GET"], raise_on_refusal=Refused)
    def view(request):
        return "ran"

    @ratelimit(name="raising", rate="1/m", methods=["GET", "POST"], raise_on_refusal=Refused)
    def other(request):
        return "ran"

    assert view(rf.get("/")) == "ran"
    with pytest.raises(Refused):
        other(rf.post("/"))


def test_a_key_function(rf, forget_declarations):
    @ratelimit(name="by-tenant", rate="1/m", key=lambda r: r.GET.get("tenant"), block=False)
    def view(request):
        return request.limited

    assert [view(rf.get("/?tenant=a")), view(rf.get("/?tenant=a")),
            view(rf.get("/?tenant=b")), view(rf.get("/"))] == [False, True, False, False]
