"""Count what matters, through the request path: charge by outcome (`charge_on`,
`reset_on`), lockouts, cost per request, calendar windows. Django's own `LoginView`
and DRF's token view are the views, through the middleware, `@ratelimit` and
`PolicyThrottle`, on Redis and in process."""

from __future__ import annotations

import datetime as dt
import logging
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.test import Client, RequestFactory

from ratelimits.decorators import ratelimit
from ratelimits.models import Policy
from ratelimits.pipeline.declared import registry
from ratelimits.runtime import using_clock
from ratelimits.testing import Clock

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
TOKEN = "/api/token/"


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="right-horse")


def attempt(client, password, username="alice", path=LOGIN, **extra):
    return client.post(path, {"username": username, "password": password}, **extra).status_code


# -- charge_on: only failures count --------------------------------------------------------


def test_django_login_charges_only_failed_logins(client, make_policy, any_store, alice):
    make_policy(name="login-user", key="post:username", path=LOGIN, methods="POST",
                limit=3, period=900, charge_on="login_failed")
    # successes (302) are never charged: a strict limit lets the right password through
    assert [attempt(Client(), "right-horse") for _ in range(5)] == [302] * 5
    # failures (LoginView re-renders the form: 200) are
    assert [attempt(client, "wrong") for _ in range(3)] == [200, 200, 200]
    # at the limit: refused before the view, the right password too
    assert attempt(client, "right-horse") == 429
    assert attempt(client, "wrong") == 429
    # another username is its own client
    assert attempt(client, "wrong", username="bob") == 200


def test_the_async_stack_charges_failures_after_the_response(make_policy, any_store, alice):
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    make_policy(name="login-user", key="post:username", path=LOGIN, methods="POST",
                limit=2, period=900, charge_on="login_failed", reset_on="login")
    client = AsyncClient()

    async def attempts(*passwords):
        return [(await client.post(LOGIN, {"username": "alice", "password": p})).status_code
                for p in passwords]

    assert async_to_sync(attempts)("wrong", "right-horse", "wrong", "wrong", "right-horse") == [
        200, 302, 200, 200, 429]


def test_a_login_resets_the_count(client, make_policy, any_store, alice):
    make_policy(name="login-user", key="post:username", path=LOGIN, methods="POST",
                limit=3, period=900, charge_on="login_failed", reset_on="login")
    assert [attempt(client, "wrong") for _ in range(2)] == [200, 200]
    assert attempt(Client(), "right-horse") == 302  # clears the two failures
    assert [attempt(client, "wrong") for _ in range(3)] == [200, 200, 200]
    assert attempt(client, "wrong") == 429


# -- a reset is the account's own -----------------------------------------------------------


@pytest.mark.parametrize(("key", "reset_on", "who"), [
    ("ip", "login", "everyone behind one address"),
    ("global", "2xx", "every client, counted as one"),
    ("user_or_ip", "login", "clients that are not signed in by their address"),
    ("header:X-Device", "204", "whoever sends the same header value"),
    ("query:account", "login", "whoever sends the same query value"),
])
def test_a_reset_any_client_can_cause_is_refused(key, reset_on, who):
    policy = Policy(name="login-failures", mode="enforce", algorithm="sliding_log",
                    limit=20, period=900, key=key, path=LOGIN, methods="POST",
                    charge_on="login_failed", reset_on=reset_on)
    with pytest.raises(ValidationError) as caught:
        policy.full_clean()
    (message,) = caught.value.message_dict["reset_on"]
    assert f"a key of {key!r} counts {who}: an attacker would get that response" in message
    assert "key user, or post:username on a login form" in message


@pytest.mark.parametrize("key", ["user", "post:username", "call:tests.support.hooks.tenant"])
def test_a_reset_by_the_account_itself_is_accepted(key):
    Policy(name="login-failures", mode="enforce", algorithm="sliding_log", limit=5,
           period=900, key=key, path=LOGIN, methods="POST", charge_on="login_failed",
           reset_on="login").full_clean()


def test_a_reset_keyed_by_the_address_is_refused_in_code():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="reset_on: A reset clears the count"):
        ratelimit(name="otp-by-address", rate="3/10m", key="ip", charge_on="401",
                  reset_on="2xx")


def test_an_own_login_no_longer_clears_a_stored_per_address_count(
    client, any_store, alice, django_user_model, django_capture_on_commit_callbacks
):
    """A row saved before such resets were refused: an attacker who logs into its own
    account after every 19 guesses at alice's would never meet the limit of 20."""
    django_user_model.objects.create_user("mallory", password="mallorys-own")
    policy = Policy(name="login-per-address", mode="enforce", algorithm="sliding_log",
                    limit=20, period=900, key="ip", path=LOGIN, methods="POST",
                    charge_on="login_failed", reset_on="login", lockout=3600)
    with django_capture_on_commit_callbacks(execute=True):
        policy.save()  # as stored before: no full_clean()
    guesses = []
    for _ in range(25):
        guesses += [attempt(Client(), "guess") for _ in range(19)]
        attempt(Client(), "mallorys-own", username="mallory")
    assert guesses.count(200) == 20  # then the address is locked out
    assert set(guesses[20:]) == {429}


def test_status_classes_charge_drf_token_failures_through_the_throttle(
    make_policy, any_store, alice, settings
):
    """No middleware: PolicyThrottle decides, and the view's own response is charged."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "ratelimits" not in m]
    path = "/api/token-throttled/"
    make_policy(name="token-ip", key="ip", path=path, limit=2, period=600, charge_on="4xx")
    client = Client()
    assert [attempt(client, "right-horse", path=path) for _ in range(4)] == [200] * 4
    assert [attempt(client, "wrong", path=path) for _ in range(2)] == [400, 400]
    assert attempt(client, "right-horse", path=path) == 429


def test_login_failed_covers_the_drf_token_view(client, make_policy, any_store, alice):
    """DRF's token view calls authenticate() with the request: its failures send
    user_login_failed like Django's LoginView."""
    make_policy(name="token-user", key="post:username", path=TOKEN, limit=1, period=600,
                charge_on="login_failed")
    assert attempt(client, "wrong", path=TOKEN) == 400
    assert attempt(client, "right-horse", path=TOKEN) == 429


def test_a_refused_request_is_not_charged_by_its_429(
    client, make_policy, any_store, django_capture_on_commit_callbacks
):
    """A 429 of another policy is a 4xx the view never answered: nothing is charged."""
    make_policy(name="hello-4xx", path="/hello/", limit=1, period=600, charge_on="4xx")
    make_policy(name="hello-tight", path="/hello/", limit=1, period=600, priority=1)
    assert client.get("/hello/").status_code == 200
    assert client.get("/hello/").status_code == 429  # hello-tight's; hello-4xx not charged
    with django_capture_on_commit_callbacks(execute=True):
        Policy.objects.filter(name="hello-tight").delete()
    # hello-4xx still has its one unit: a 200 is never charged
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 200]


# -- lockout -----------------------------------------------------------------------------


def test_a_lockout_outlasts_the_window_and_reset_ends_it(client, make_policy, any_store):
    from ratelimits.ops.reset import reset_client

    policy = make_policy(name="login-ip", key="ip", path=LOGIN, methods="POST", limit=2,
                         period=60, charge_on="login_failed", lockout=600)
    with using_clock(Clock(1_800_000_000)) as clock:
        assert [attempt(client, "wrong") for _ in range(2)] == [200, 200]
        refused = client.post(LOGIN, {"username": "x", "password": "y"})
        assert refused.status_code == 429
        assert refused["Retry-After"] == "600"
        clock.advance(120)  # the window is long gone: the lockout still holds
        refused = client.post(LOGIN, {"username": "x", "password": "y"})
        assert (refused.status_code, refused["Retry-After"]) == (429, "480")
        reset_client(policy, "127.0.0.1")
        assert attempt(client, "wrong") == 200


@pytest.mark.parametrize(("key", "warned"), [
    ("post:username", True), ("get:email", True), ("header:X-Account", True),
    ("ip", False), ("user", False),
])
def test_the_admin_warns_of_a_lockout_an_attacker_can_aim(admin_client, key, warned):
    response = admin_client.post("/admin/ratelimits/policy/add/", {
        "name": "login-locked", "mode": "shadow", "rollout": 100,
        "algorithm": "fixed_window", "limit": 5, "period": 900, "cost": 1, "max_wait": 0,
        "warmup": 0, "counting": "shared", "key": key, "path": LOGIN,
        "on_error": "allow", "priority": 0, "lockout": 3600, "charge_on": "login_failed",
        "overrides-TOTAL_FORMS": 0, "overrides-INITIAL_FORMS": 0,
    }, follow=True)
    assert response.status_code == 200
    assert Policy.objects.filter(name="login-locked").exists()
    assert ("lock a victim out" in response.content.decode()) is warned


# -- cost per request ----------------------------------------------------------------------


def rows_asked(request):
    """A cost function named by path: the rows an export asks for."""
    return int(request.GET.get("rows", "1"))


def test_a_cost_function_named_by_path(client, make_policy, any_store, caplog):
    make_policy(name="export", path="/hello/", limit=100, period=3600,
                cost_function="tests.pipeline.test_counting.rows_asked")
    assert client.get("/hello/?rows=60").status_code == 200
    refused = client.get("/hello/?rows=50")
    assert refused.status_code == 429
    assert refused["RateLimit"].startswith('"export";r=40;')
    assert client.get("/hello/?rows=40").status_code == 200
    assert client.get("/hello/?rows=1").status_code == 429


def test_a_wrong_cost_is_logged_and_the_policy_cost_charged(client, make_policy, any_store,
                                                            caplog):
    make_policy(name="export", path="/hello/", limit=3, period=3600, cost=1,
                cost_function="tests.pipeline.test_counting.rows_asked")
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        assert client.get("/hello/?rows=-3").status_code == 200  # charged 1, not free
        assert client.get("/hello/?rows=abc").status_code == 200  # the function raised
    messages = [r.getMessage() for r in caplog.records]
    assert any("answered -3, not a positive integer" in m for m in messages)
    assert any("its cost function failed" in m for m in messages)
    # too costly to ever fit: it costs all the limit holds, so it needs a full allowance
    assert client.get("/hello/?rows=500").status_code == 429  # one unit is left
    fresh = Client(REMOTE_ADDR="10.0.0.9")
    assert fresh.get("/hello/?rows=500").status_code == 200
    assert fresh.get("/hello/?rows=1").status_code == 429


def test_a_stored_builtin_cost_function_is_not_called(
    client, any_store, caplog, django_capture_on_commit_callbacks
):
    """A row saved before the function's shape was checked: `sys.exit` would stop the
    worker on every request the policy matches, even in shadow."""
    policy = Policy(name="export", mode="shadow", algorithm="fixed_window", limit=100,
                    period=3600, key="ip", path="/hello/", cost_function="sys.exit")
    with django_capture_on_commit_callbacks(execute=True):
        policy.save()  # no full_clean(), as before
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 200]
    assert any("its cost function is not used: 'sys.exit' is a builtin" in r.getMessage()
               for r in caplog.records)


def test_a_cost_function_raising_system_exit_is_a_failing_function(
    client, make_policy, any_store, caplog
):
    make_policy(name="export", path="/hello/", limit=3, period=3600,
                cost_function="tests.support.hooks.exits")
    with caplog.at_level(logging.ERROR, logger="ratelimits"):
        assert [client.get("/hello/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert any("its cost function failed" in r.getMessage() for r in caplog.records)


_factory = RequestFactory()


@pytest.fixture
def views():
    """Decorated views, declared for this test only."""
    before = dict(registry.declared)

    @ratelimit(name="bulk", rate="10/h", key="ip",
               cost=lambda request: len(request.POST.getlist("id")))
    def bulk(request):
        return HttpResponse("done")

    @ratelimit(name="daily-export", rate="2/d", key="ip", algorithm="fixed_window",
               calendar="day")
    def daily_export(request):
        return HttpResponse("exported")

    @ratelimit(name="otp", rate="2/10m", key="ip", charge_on="401", lockout=3600)
    def otp(request):
        return HttpResponse(status=204 if request.POST.get("code") == "123456" else 401)

    @ratelimit(name="lookup", rate="3/10m", key="ip", charge_on="404")
    def lookup(request):
        if request.GET.get("code") == "forbidden":
            raise PermissionDenied
        if request.GET.get("code") != "246810":
            raise Http404("no such code")
        return HttpResponse("found")

    @ratelimit(name="alookup", rate="3/10m", key="ip", charge_on="404")
    async def alookup(request):
        if request.GET.get("code") != "246810":
            raise Http404("no such code")
        return HttpResponse("found")

    registry.forget_written()
    yield {"bulk": bulk, "otp": otp, "daily_export": daily_export, "lookup": lookup,
           "alookup": alookup}
    registry.restore(before)
    registry.forget_written()


def test_the_decorator_takes_a_cost_function(any_store, views):
    def post(n):
        return views["bulk"](_factory.post("/bulk/", {"id": list(range(n))}))

    assert post(7).status_code == 200
    refused = post(4)
    assert refused.status_code == 429
    assert post(3).status_code == 200


def test_the_decorator_charges_by_outcome_with_a_lockout(any_store, views):
    with using_clock(Clock(1_800_000_000)):
        def code(value):
            return views["otp"](_factory.post("/otp/", {"code": value}))

        assert [code("123456").status_code for _ in range(3)] == [204] * 3
        assert [code("000000").status_code for _ in range(2)] == [401, 401]
        refused = code("123456")
        assert (refused.status_code, refused["Retry-After"]) == (429, "3600")


@pytest.mark.parametrize("view", ["lookup", "alookup"])
def test_the_decorator_charges_a_raised_exception_as_the_response_django_makes(
    any_store, views, view
):
    """Without the middleware, a view that raises Http404 is charged as the 404 Django
    answers; three, and the next is refused before the view."""
    call = views[view] if view == "lookup" else async_to_sync(views[view])
    for _ in range(3):
        with pytest.raises(Http404):
            call(_factory.get("/lookup/?code=000000"))
    refused = call(_factory.get("/lookup/?code=246810"))
    assert refused.status_code == 429


def test_the_decorator_does_not_charge_a_raised_exception_charge_on_does_not_name(
    any_store, views
):
    """A PermissionDenied is the 403 Django answers: a policy charging 404s takes it
    back, so a client raising it five times is still served."""
    for _ in range(5):
        with pytest.raises(PermissionDenied):
            views["lookup"](_factory.get("/lookup/?code=forbidden"))
    assert views["lookup"](_factory.get("/lookup/?code=246810")).status_code == 200


# -- calendar ----------------------------------------------------------------------------


def test_the_decorator_counts_a_calendar_day(any_store, views, settings):
    settings.TIME_ZONE = "America/Los_Angeles"
    evening = dt.datetime(2027, 1, 15, 22, 0, tzinfo=ZoneInfo("America/Los_Angeles"))
    with using_clock(Clock(evening.timestamp())) as clock:
        def export():
            return views["daily_export"](_factory.get("/export/"))

        assert [export().status_code for _ in range(2)] == [200, 200]
        refused = export()
        assert (refused.status_code, refused["Retry-After"]) == (429, "7200")
        clock.advance(7200)  # midnight in Los Angeles
        assert export().status_code == 200


def test_a_daily_quota_resets_at_local_midnight(client, make_policy, any_store, settings):
    settings.TIME_ZONE = "Europe/Paris"
    make_policy(name="daily", path="/hello/", limit=2, period=60, calendar="day")
    policy = Policy.objects.get(name="daily")
    assert policy.period == 86_400 and policy.human_rate() == "2 per calendar day"
    before = dt.datetime(2027, 3, 27, 23, 59, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    with using_clock(Clock(before)) as clock:
        assert [client.get("/hello/").status_code for _ in range(2)] == [200, 200]
        refused = client.get("/hello/")
        assert (refused.status_code, refused["Retry-After"]) == (429, "60")
        clock.advance(60)
        assert client.get("/hello/").status_code == 200


# -- the policy's own validation -----------------------------------------------------------


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"charge_on": "4x"}, "charge_on", "'4x' is not a status code"),
    ({"reset_on": "login_failed"}, "reset_on", "or 'login'"),
    ({"calendar": "day", "algorithm": "sliding_window"}, "calendar",
     "applies only to fixed_window"),
    ({"lockout": 60, "batch": 2}, "lockout", "nor with a batch"),
    ({"charge_on": "4xx", "algorithm": "concurrency"}, "charge_on", "holds a slot"),
    ({"cost_function": "no.such.module.fn"}, "cost_function", "cannot be imported"),
    ({"cost_function": "."}, "cost_function", "cannot be imported (ValueError"),
    ({"cost_function": "ratelimits.conf.SETTINGS"}, "cost_function", "is not a function"),
    ({"cost_function": "sys.exit"}, "cost_function",
     "'sys.exit' is a builtin, not a function written in Python; give a module-level"),
    ({"cost_function": "collections.OrderedDict"}, "cost_function", "is a class, not a"),
    ({"cost_function": "tests.support.hooks.teapot"}, "cost_function",
     "takes (request, rejection): it must take the request as its one argument"),
    ({"key": "call:sys.exit"}, "key", "'sys.exit' is a builtin, not a function written in"),
    ({"key": "call:no_such_module_xyz.fn"}, "key", "cannot be imported (ModuleNotFound"),
    ({"charge_on": "4xx", "reset_on": "4xx"}, "reset_on", "both name 4xx: each such"),
    ({"charge_on": "401,403", "reset_on": "2xx,403"}, "reset_on", "both name 403:"),
    ({"charge_on": "4xx,500", "reset_on": "404,5xx"}, "reset_on", "both name 404, 500:"),
    ({"lockout": 2**40}, "lockout", "at most 2592000 seconds (30 days)"),
])
def test_the_new_fields_are_refused_with_what_to_fix(fields, field, words):
    values = {"name": "p", "mode": "enforce", "algorithm": "fixed_window", "limit": 10,
              "period": 60, "key": "ip"}
    policy = Policy(**{**values, **fields})
    with pytest.raises(ValidationError) as caught:
        policy.full_clean()
    assert words in " ".join(caught.value.message_dict[field])


# -- through PolicyThrottle: lockout, cost and calendar on a DRF scope ----------------------


def test_the_throttle_applies_lockout_cost_and_calendar(client, make_policy, any_store,
                                                        settings):
    settings.TIME_ZONE = "Asia/Tokyo"
    make_policy(name="items-locked", scope="items", limit=2, period=60, lockout=900)
    make_policy(name="items-cost", scope="items", limit=20, period=3600,
                cost_function="tests.pipeline.test_counting.rows_asked")
    make_policy(name="items-daily", scope="items", limit=4, calendar="day")
    late = dt.datetime(2027, 1, 15, 23, 0, tzinfo=ZoneInfo("Asia/Tokyo")).timestamp()
    with using_clock(Clock(late)) as clock:
        assert client.get("/api/items/?rows=8").status_code == 200
        assert client.get("/api/items/?rows=13").status_code == 429  # 8 + 13 > 20
        assert client.get("/api/items/?rows=2").status_code == 200
        refused = client.get("/api/items/")  # items-locked's third in its minute
        assert (refused.status_code, refused["Retry-After"]) == (429, "900")
        clock.advance(900)  # 23:15 in Tokyo: the lockout is over
        assert [client.get("/api/items/").status_code for _ in range(2)] == [200, 200]
        refused = client.get("/api/items/")  # the day's fifth: refused until midnight
        assert (refused.status_code, refused["Retry-After"]) == (429, "2700")
        clock.advance(2700)
        assert client.get("/api/items/").status_code == 200
    assert Policy.objects.get(name="items-daily").human_rate() == "4 per calendar day"


# -- what operators see ---------------------------------------------------------------------


def test_status_and_the_admin_list_show_what_was_charged_after_the_response(
    client, make_policy, alice, admin_client
):
    import io
    import json

    from django.core.management import call_command

    from ratelimits.pipeline.engines import get_engine

    make_policy(name="login-user", key="post:username", path=LOGIN, methods="POST",
                limit=5, period=900, charge_on="login_failed", lockout=60)
    statuses = [attempt(client, p) for p in ("wrong", "wrong", "right-horse", "wrong")]
    assert statuses == [200, 200, 302, 200]
    get_engine().flush()  # the tally, sent now rather than within a second
    out = io.StringIO()
    call_command("ratelimits", "status", "--json", stdout=out)
    (row,) = [p for p in json.loads(out.getvalue())["policies"] if p["name"] == "login-user"]
    assert (row["charge_on"], row["lockout"]) == ("login_failed", 60)
    assert (row["last_hour"]["admitted"], row["last_hour"]["charged"]) == (4, 3)
    page = admin_client.get("/admin/ratelimits/policy/").content.decode()
    assert "3 charged after their response (login_failed)" in page


def test_a_per_process_policy_charges_failures_in_its_process(client, make_policy, alice):
    make_policy(name="login-node", key="post:username", path=LOGIN, methods="POST", limit=2,
                period=900, counting="per_process", charge_on="login_failed",
                reset_on="login")
    assert attempt(client, "wrong") == 200
    assert attempt(Client(), "right-horse") == 302  # clears the failure, in this process
    assert [attempt(client, "wrong") for _ in range(3)] == [200, 200, 429]
