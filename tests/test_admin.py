"""The Policy admin: the list, the mode actions (which publish the change), permissions,
declared policies' views and the overrides inline."""

from __future__ import annotations

import types
from datetime import datetime, timezone

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.http import HttpResponse
from django.urls import include, path, re_path
from django.utils.decorators import method_decorator
from django.views import View

from ratelimits.decorators import ratelimit
from ratelimits.models import Override, Policy
from ratelimits.pipeline.declared import registry

pytestmark = pytest.mark.django_db
URL = "/admin/ratelimits/policy/"


def test_changelist_shows_the_human_rate_and_filters(admin_client, make_policy):
    make_policy(name="tokens", algorithm="token_bucket", limit=100, period=60, burst=20)
    make_policy(name="slow", limit=100, period=600, methods="POST")
    page = admin_client.get(URL).content.decode()
    assert "100 per minute, burst 20" in page and "100 per 10 minutes" in page
    assert "POST" in page and "By mode" in page and "By algorithm" in page
    found = admin_client.get(URL, {"q": "tokens"}).content.decode()
    assert "tokens" in found and "100 per 10 minutes" not in found


def test_add_form_shows_validation_messages_on_the_field(admin_client):
    response = admin_client.post(
        URL + "add/",
        {
            "name": "x",
            "mode": "shadow",
            "algorithm": "fixed_window",
            "limit": 5,
            "period": 60,
            "burst": 3,
            "cost": 1,
            "key": "ip",
            "path": "*",
            "methods": "",
            "scope": "",
            "on_error": "allow",
            "counting": "shared",
            "rollout": 100,
            "priority": 0,
            "max_wait": 0,
            "warmup": 0,
            "lockout": 0,
        },
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "has no burst" in errors["burst"][0]


@pytest.mark.parametrize(
    ("action", "mode"),
    [("switch_to_enforce", "enforce"), ("switch_to_shadow", "shadow"), ("turn_off", "off")],
)
def test_actions_switch_mode_publish_and_record_history(
    admin_client, make_policy, action, mode, client, django_capture_on_commit_callbacks
):
    from ratelimits.pipeline.engines import get_engine

    a = make_policy(name="a", mode="shadow" if mode != "shadow" else "enforce", limit=1)
    b = make_policy(name="b", mode="enforce", limit=1, path="/other/")
    before = get_engine().bump_version()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(URL, {"action": action, "_selected_action": [a.pk, b.pk]})
    assert response.status_code == 302
    assert set(Policy.objects.values_list("mode", flat=True)) == {mode}
    assert get_engine().bump_version() >= before + 2  # the action bumped once
    assert LogEntry.objects.filter(object_id=str(a.pk)).exists()


def test_turn_off_takes_effect_on_the_next_request(
    admin_client, make_policy, django_capture_on_commit_callbacks
):
    policy = make_policy(name="a", limit=1, path="/hello/")  # "*" would cover the admin too
    assert admin_client.get("/hello/").status_code == 200
    assert admin_client.get("/hello/").status_code == 429
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(URL, {"action": "turn_off", "_selected_action": [policy.pk]})
    assert admin_client.get("/hello/").status_code == 200


def test_staff_without_model_permissions_is_refused(client, staff, make_policy):
    policy = make_policy(name="a", limit=100)
    assert client.get(URL).status_code == 403
    assert client.get(f"{URL}{policy.pk}/change/").status_code == 403
    response = client.post(URL, {"action": "turn_off", "_selected_action": [policy.pk]})
    assert response.status_code == 403
    assert Policy.objects.get().mode == "enforce"


def test_view_only_staff_cannot_run_the_actions(client, staff, make_policy):
    staff.user_permissions.add(Permission.objects.get(codename="view_policy"))
    policy = make_policy(name="a", limit=100)
    page = client.get(URL)
    assert page.status_code == 200 and "turn_off" not in page.content.decode()
    client.post(URL, {"action": "turn_off", "_selected_action": [policy.pk]})
    assert Policy.objects.get().mode == "enforce"


def test_edits_are_recorded_with_old_and_new_values(admin_client, make_policy):
    policy = make_policy(name="login", limit=5, period=60, path="/login/")
    form = admin_client.get(f"{URL}{policy.pk}/change/").context["adminform"].form
    data = {
        k: v for k, v in form.initial.items() if v is not None and k not in ("created", "updated")
    }
    data.update(limit=10, mode="shadow")
    data.update({"overrides-TOTAL_FORMS": 0, "overrides-INITIAL_FORMS": 0})  # the inline
    response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    assert response.status_code == 302, response.content
    entry = LogEntry.objects.filter(object_id=str(policy.pk)).latest("action_time")
    message = entry.get_change_message()
    assert "Limit from 5 to 10" in message
    assert "Mode from 'enforce' to 'shadow'" in message


@pytest.mark.parametrize("pk", ["abc", "999999", "1.5"])
def test_reset_client_of_a_malformed_or_missing_id_is_404(admin_client, make_policy, pk):
    make_policy(name="login", limit=1)
    response = admin_client.post(f"{URL}{pk}/reset-client/", {"identity": "192.0.2.9"})
    assert response.status_code == 404


def test_enforcing_a_policy_over_the_admin_warns_the_operator(admin_client, make_policy):
    over = make_policy(name="everything", mode="shadow", path="*")
    spared = make_policy(name="forms", mode="shadow", path="*", methods="POST")
    response = admin_client.post(URL, {"action": "switch_to_enforce",
                                       "_selected_action": [over.pk, spared.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    warnings = [m for m in shown if "limits GET requests to the admin" in m]
    assert len(warnings) == 1 and "'everything'" in warnings[0]
    assert "ratelimits reset" in warnings[0]  # how to get back in


# -- a declared policy names the views it is declared on -------------------------------------


@pytest.fixture
def decorated_site(settings, forget_declarations):
    """Views with @ratelimit at /login/ (a function), /search/ and /find/ (one class-based
    view, twice), and a declaration no URL reaches."""
    registry.forget_written()

    @ratelimit(name="login", rate="3/m", methods="POST")
    def login(request):
        return HttpResponse("in")

    @method_decorator(ratelimit(name="search", rate="2/10m", key="user_or_ip"), name="get")
    class Search(View):
        def get(self, request):
            return HttpResponse("found")

    @ratelimit(name="orphan", rate="1/s")
    def orphan(request):  # pragma: no cover - no URL reaches it
        return HttpResponse("unreachable")

    urls = types.ModuleType("decorated_admin_urls")
    urls.urlpatterns = [path("login/", login), path("search/", Search.as_view()),
                        path("api/", include([re_path(r"^find/$", Search.as_view())])),
                        path("admin/", admin.site.urls)]
    settings.ROOT_URLCONF = urls
    registry.write(force=True)
    yield
    registry.forget_written()


def test_a_declared_policy_names_the_views_it_is_declared_on(admin_client, decorated_site):
    response = admin_client.get(URL)
    page = response.content.decode()
    assert "views with @ratelimit</td>" not in page  # the old text, as if on every view
    assert ('ip, on POST /login/ <span title="@ratelimit on '
            'tests.test_admin.decorated_site.login">(view login)</span>') in page
    assert ('user_or_ip, on any /search/, /api/find/ <span title="@ratelimit on '
            'tests.test_admin.decorated_site.Search">(view Search)</span>') in page
    assert "ip, on any views declaring &quot;orphan&quot; in code" in page
    login = Policy.objects.get(name="login")
    form = admin_client.get(f"{URL}{login.pk}/change/").content.decode()
    assert "It is declared on tests.test_admin.decorated_site.login, at /login/." in form


# -- the overrides inline -------------------------------------------------------------------


def test_an_adaptive_policy_shows_no_overrides_inline(admin_client, make_policy):
    adaptive = make_policy(name="backend", algorithm="adaptive", key="global", limit=16,
                           floor=2, period=10)
    fixed = make_policy(name="login", path="/login/")
    assert 'id="overrides-group"' not in admin_client.get(
        f"{URL}{adaptive.pk}/change/").content.decode()
    assert 'id="overrides-group"' in admin_client.get(f"{URL}{fixed.pk}/change/").content.decode()


def test_a_policy_switched_to_adaptive_keeps_no_overrides(admin_client, make_policy):
    policy = make_policy(name="backend", key="global", limit=16, period=10)
    override = Override.objects.create(policy=policy, match="tier:gold", limit=100)
    data = _form_data(admin_client, policy)
    data.update(algorithm="adaptive", floor=2, **_inline([override]))
    response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    assert response.status_code == 200  # the form again, with what to fix
    errors = response.context["inline_admin_formsets"][0].formset.non_form_errors()
    assert "takes no overrides: delete them" in str(errors)
    assert Policy.objects.get(pk=policy.pk).algorithm == "fixed_window"

    data.update(**_inline([override], delete=True))  # deleted in the same save: accepted
    assert admin_client.post(f"{URL}{policy.pk}/change/", data).status_code == 302
    assert Policy.objects.get(pk=policy.pk).algorithm == "adaptive"
    assert not Override.objects.exists()


def test_the_overrides_inline_is_narrow(admin_client, make_policy):
    """No burst column under an algorithm without one, short inputs, and one date-and-time
    input instead of the admin's two with their shortcuts."""
    window = make_policy(name="login", path="/login/")
    bucket = make_policy(name="api", algorithm="token_bucket", burst=20, path="/api/")
    Override.objects.create(policy=window, match="ip:192.0.2.10", limit=10)
    page = admin_client.get(f"{URL}{window.pk}/change/").content.decode()
    assert 'name="overrides-0-burst"' not in page and "column-burst" not in page
    assert 'type="datetime-local" name="overrides-0-expires"' in page
    assert 'name="overrides-0-expires_0"' not in page  # not the split date, time inputs
    assert 'size="22"' in page
    assert "column-burst" in admin_client.get(f"{URL}{bucket.pk}/change/").content.decode()


def test_an_override_expiry_typed_in_the_browsers_picker_is_saved(
    admin_client, make_policy, settings
):
    settings.TIME_ZONE = "Europe/Paris"
    policy = make_policy(name="login", path="/login/")
    data = _form_data(admin_client, policy)
    data.update({"overrides-TOTAL_FORMS": 1, "overrides-INITIAL_FORMS": 0,
                 "overrides-0-match": "ip:192.0.2.10", "overrides-0-limit": 10,
                 "overrides-0-expires": "2031-05-04T18:30", "overrides-0-note": "ticket 12"})
    response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    assert response.status_code == 302, response.context["inline_admin_formsets"][0].formset.errors
    expires = Override.objects.get().expires
    assert expires == datetime(2031, 5, 4, 16, 30, tzinfo=timezone.utc)  # 18:30 in Paris
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    assert 'value="2031-05-04T18:30"' in page  # shown back as typed


def _form_data(admin_client, policy) -> dict:
    """The change form's fields as the page holds them, with an empty overrides inline."""
    form = admin_client.get(f"{URL}{policy.pk}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items()
            if v is not None and k not in ("created", "updated")}
    data.update({"overrides-TOTAL_FORMS": 0, "overrides-INITIAL_FORMS": 0})
    return data


def _inline(overrides, *, delete: bool = False) -> dict:
    """The inline's fields for `overrides` as saved, unchanged (or ticked for deletion)."""
    data = {"overrides-TOTAL_FORMS": len(overrides), "overrides-INITIAL_FORMS": len(overrides)}
    for i, o in enumerate(overrides):
        data.update({f"overrides-{i}-id": o.pk, f"overrides-{i}-policy": o.policy_id,
                     f"overrides-{i}-match": o.match, f"overrides-{i}-limit": o.limit or ""})
        if delete:
            data[f"overrides-{i}-DELETE"] = "on"
    return data
