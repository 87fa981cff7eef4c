"""The Policy admin: the list, the mode actions (which publish the change) and permissions."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission

from ratelimits.models import Policy

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
