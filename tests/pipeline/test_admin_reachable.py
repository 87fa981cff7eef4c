"""The admin stays reachable for its own users whatever the policies say (issue 29, #13).

A policy over the admin used to lock its operators out: once it refused them they could
not open the admin to undo it, and only the command line recovered. Now the pages an
admin site serves to the users it lets in (active staff) are left alone by every policy,
unless `RATELIMITS["LIMIT_ADMIN"]`. Its login page stays limited (passwords are guessed
there), and so is everyone the admin turns away."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin import AdminSite
from django.core.checks import run_checks
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from ratelimits.models import Mode, Policy
from ratelimits.testing import START

pytestmark = pytest.mark.django_db
LIST = "/admin/ratelimits/policy/"
ONE_A_DAY = {"name": "everything", "key": "global", "limit": 1, "period": 86400, "path": "*"}


@pytest.fixture
def spent(make_policy, client, clock):
    """A global enforced policy of 1 a day on every path, its one request spent by an
    anonymous client: every other request the policy sees is refused for a day."""
    clock.freeze(START)
    policy = make_policy(**ONE_A_DAY)
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    return policy


def test_staff_use_the_admin_under_a_global_limit_of_one_a_day_and_switch_it_off(
    spent, admin_client, client, django_capture_on_commit_callbacks
):
    pages = [LIST, f"{LIST}{spent.pk}/change/", "/admin/", "/admin/ratelimits/override/",
             f"{LIST}?mode__exact=enforce"]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        assert "RateLimit" not in response and "Retry-After" not in response
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(LIST, {"action": "turn_off",
                                            "_selected_action": [spent.pk]})
    assert response.status_code == 302
    spent.refresh_from_db()
    assert spent.mode == Mode.OFF
    assert client.get("/hello/").status_code == 200  # the site is open again


def test_staff_can_save_the_policys_page(spent, admin_client, django_capture_on_commit_callbacks):
    form = admin_client.get(f"{LIST}{spent.pk}/change/").context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None}
    data.update({"mode": "shadow", "overrides-TOTAL_FORMS": 0,
                 "overrides-INITIAL_FORMS": 0})
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"{LIST}{spent.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    spent.refresh_from_db()
    assert spent.mode == Mode.SHADOW


def test_the_admins_login_page_stays_limited(spent, client, admin_user):
    login = "/admin/login/"
    assert client.get(login).status_code == 429  # the form, for a signed-out operator
    assert client.post(login, {"username": "admin", "password": "guess"}).status_code == 429
    # a signed-in staff user posting other credentials is limited there too
    client.force_login(admin_user)
    assert client.post(login, {"username": "root", "password": "guess"}).status_code == 429
    assert client.get("/admin/").status_code == 200


def test_whoever_the_admin_turns_away_stays_limited(spent, client, django_user_model):
    assert client.get("/admin/").status_code == 429  # anonymous
    assert client.get(LIST).status_code == 429
    client.force_login(django_user_model.objects.create_user("member"))  # signed in, not staff
    assert client.get("/admin/").status_code == 429
    inactive = django_user_model.objects.create_user("gone", is_staff=True, is_active=False)
    client.force_login(inactive)
    assert client.get("/admin/").status_code == 429


def test_staff_are_limited_on_the_rest_of_the_site(spent, admin_client):
    assert admin_client.get("/hello/").status_code == 429


def test_staff_requests_to_the_admin_are_not_counted(make_policy, admin_client, client, clock):
    clock.freeze(START)
    make_policy(name="per-site", key="global", limit=2, period=60, path="*")
    for _ in range(5):
        assert admin_client.get(LIST).status_code == 200
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]


def test_limit_admin_limits_the_admin_like_any_path(spent, admin_client, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "LIMIT_ADMIN": True}
    refused = admin_client.get(LIST)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 3600


def test_the_admin_is_found_where_the_urlconf_puts_it(spent, admin_client, client):
    with override_settings(ROOT_URLCONF="tests.support.urls_backoffice"):
        assert admin_client.get("/backoffice/ratelimits/policy/").status_code == 200
        assert client.get("/backoffice/").status_code == 429  # anonymous


def test_staff_reach_the_admin_on_the_async_stack(spent, async_client, admin_user):
    """Under ASGI the admin user is loaded in a thread, never on the event loop."""
    async_client.force_login(admin_user)

    async def pages():
        return [(await async_client.get(url)).status_code
                for url in (LIST, "/admin/login/", "/hello/")]

    assert async_to_sync(pages)() == [200, 429, 429]


class OpenSite(AdminSite):
    """A site of its own whose rule lets in any signed-in user."""

    def has_permission(self, request):
        return request.user.is_active and request.user.is_authenticated


class BrokenSite(AdminSite):
    def has_permission(self, request):
        raise RuntimeError("the permission service is down")


urlpatterns = [path("hello/", lambda request: HttpResponse("hello")),
               path("open/", OpenSite(name="open").urls),
               path("broken/", BrokenSite(name="broken").urls)]


def test_a_site_of_your_own_lets_in_whom_its_has_permission_lets_in(
    spent, client, django_user_model
):
    client.force_login(django_user_model.objects.create_user("member"))
    with override_settings(ROOT_URLCONF=__name__):
        assert client.get("/open/").status_code == 200
        assert client.get("/open/login/").status_code == 429  # its login page is limited


def test_a_has_permission_that_fails_is_logged_and_the_request_limited(
    spent, admin_client, caplog
):
    with override_settings(ROOT_URLCONF=__name__):
        assert admin_client.get("/broken/").status_code == 429
    assert "could not tell whether /broken/ is an admin user's page" in caplog.text


# -- check ratelimits.W004 says what is left of the lockout ---------------------------------


def w004(**fields):
    Policy.objects.create(**{"mode": "enforce", "algorithm": "fixed_window", "limit": 5,
                             "period": 60, "key": "ip", "name": "p", "path": "*", **fields})
    return [m for m in run_checks(databases=["default"]) if m.id == "ratelimits.W004"]


def test_w004_says_staff_pass_and_the_login_page_is_what_can_still_keep_you_out():
    (msg,) = w004()
    assert "signed-in staff" in msg.msg and "LIMIT_ADMIN" in msg.msg
    assert "signing in" in msg.msg and "reset" in msg.hint


def test_w004_under_limit_admin_says_the_admin_itself_locks_you_out(settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "LIMIT_ADMIN": True}
    (msg,) = w004()
    assert "cannot open the admin" in msg.msg and "LIMIT_ADMIN" in msg.hint
