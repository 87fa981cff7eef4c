"""`ratelimits import` and limits declared in code: a file neither makes a policy declared
that no code declares nor takes the flag, or the code's figures, from one that is."""

from __future__ import annotations

import io
import json
import types

import pytest
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.http import HttpResponse
from django.urls import path

from ratelimits.decorators import ratelimit
from ratelimits.models import Override, Policy
from ratelimits.ops.policy_files import export_policies
from ratelimits.pipeline.declared import registry
from tests.urls import hello

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimits", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def write(tmp_path, content) -> str:
    file = tmp_path / "policies.json"
    file.write_text(json.dumps(content))
    return str(file)


def refused(file: str) -> str:
    with pytest.raises(CommandError) as info:
        run("import", file)
    assert "nothing was changed" in str(info.value)
    return str(info.value)


@pytest.fixture
def site(settings, forget_declarations):
    """A view with @ratelimit(name="login", rate="2/m") at /login/, and /hello/ bare."""

    @ratelimit(name="login", rate="2/m", methods="POST")
    def login(request):
        return HttpResponse("in")

    urls = types.ModuleType("declared_import_urls")
    urls.urlpatterns = [path("login/", login), path("hello/", hello),
                        path("admin/", admin.site.urls)]
    settings.ROOT_URLCONF = urls
    registry.forget_written()
    yield
    registry.forget_written()


def test_declared_true_on_a_policy_of_ones_own_is_refused_and_it_keeps_limiting(
    client, make_policy, tmp_path, django_capture_on_commit_callbacks
):
    """The red team's file: the flag took the policy out of every snapshot (no code
    declares it), while `status` still said enforce and the admin could no longer
    delete it or edit its rate."""
    make_policy(name="p", limit=1, path="/hello/")
    content = export_policies()
    content["policies"][0]["declared"] = True
    before = export_policies()
    with django_capture_on_commit_callbacks(execute=True):
        message = refused(write(tmp_path, content))
    assert ("policy 1 'p': declared: true, but 'p' is a policy of your own here, not one "
            "declared in code, and an import does not make it one") in message
    assert export_policies() == before
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]


def test_declared_true_on_a_new_policy_no_code_declares_is_refused(make_policy, tmp_path):
    make_policy(name="kept", limit=5)
    before = export_policies()
    content = {**before, "policies": [*before["policies"], {
        "name": "ghost", "mode": "enforce", "limit": 5, "declared": True}]}
    message = refused(write(tmp_path, content))
    assert ("policy 2 'ghost': declared: true marks a policy declared in code (@ratelimit, "
            "a DRF compat throttle), and no code here declares 'ghost'") in message
    assert export_policies() == before


def test_a_declared_row_keeps_its_flag_and_the_codes_figures_and_takes_the_operators(
    client, site, tmp_path, django_capture_on_commit_callbacks
):
    client.post("/login/")  # the row is written
    content = export_policies()
    login = content["policies"][0]
    assert (login["name"], login["declared"], login["limit"]) == ("login", True, 2)
    login.update(declared=False, limit=50, mode="shadow", priority=4,
                 overrides=[{"match": "ip:192.0.2.1", "exempt": True}])
    file = write(tmp_path, content)

    out = run("import", file, "--dry-run")
    assert ("update login: mode 'enforce' -> 'shadow'; priority 0 -> 4 (declared in code, "
            "so the file's limit 50, declared False are not applied)") in out
    with django_capture_on_commit_callbacks(execute=True):
        run("import", file)
    row = Policy.objects.get(name="login")
    assert (row.declared, row.limit, row.mode, row.priority) == (True, 2, "shadow", 4)
    assert list(row.overrides.values_list("match", flat=True)) == ["ip:192.0.2.1"]

    with django_capture_on_commit_callbacks(execute=True):  # back to enforce, by a file
        login.update(mode="enforce", overrides=[])
        run("import", write(tmp_path, content))
    assert [client.post("/login/").status_code for _ in range(3)] == [200, 429, 429]


def test_a_policy_the_code_declares_but_has_not_written_is_created_declared(
    client, site, tmp_path, django_capture_on_commit_callbacks
):
    assert not Policy.objects.filter(name="login").exists()
    content = {"format": "ratelimits.policies", "version": 1, "policies": [
        {"name": "login", "declared": True, "mode": "shadow", "limit": 9, "period": 60,
         "overrides": [{"match": "ip:192.0.2.7", "limit": 5}]}]}
    with django_capture_on_commit_callbacks(execute=True):
        out = run("import", write(tmp_path, content))
    assert "create login (declared in code, so the file's limit 9 is not applied)" in out
    row = Policy.objects.get(name="login")
    assert (row.declared, row.limit, row.methods, row.scope, row.mode) == (
        True, 2, "POST", "code:login", "shadow")
    assert Override.objects.get().policy == row
    assert [client.post("/login/").status_code for _ in range(3)] == [200] * 3  # shadow


def test_delete_missing_leaves_a_declared_policy(client, site, make_policy, tmp_path):
    client.post("/login/")
    make_policy(name="stray")
    out = run("import", write(tmp_path, {"format": "ratelimits.policies", "version": 1,
                                         "policies": []}), "--delete-missing")
    assert out.splitlines() == [
        "unchanged login (declared in code, so not deleted; switch it off instead)",
        "delete stray",
        "Imported: 1 deleted, 1 unchanged.",
    ]
    assert list(Policy.objects.values_list("name", flat=True)) == ["login"]
