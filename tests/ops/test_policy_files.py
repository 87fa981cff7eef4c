"""`manage.py ratelimits export` and `ratelimits import FILE`: policies as files."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from ratelimits.models import Policy

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimits", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def rows() -> dict[str, dict]:
    """Every policy as the file carries it (everything but id and the timestamps)."""
    from ratelimits.ops.policy_files import exported_fields

    return {p.name: {f: getattr(p, f) for f in exported_fields()}
            for p in Policy.objects.all()}


def test_export_then_import_elsewhere_gives_the_same_policies(make_policy, tmp_path):
    make_policy(name="login", mode="enforce", algorithm="sliding_log", limit=5, period=60,
                key="ip", path="/login/", methods="POST", on_error="deny", priority=3,
                description="five tries a minute")
    make_policy(name="api", mode="shadow", algorithm="token_bucket", limit=100,
                period=60, burst=20, cost=2, key="header:X-Api-Key", scope="items",
                rollout=25)
    make_policy(name="hot", algorithm="fixed_window", limit=10**6, period=60,
                key="global", batch=100, counting="shared")
    before = rows()
    path = tmp_path / "policies.json"
    call_command("ratelimits", "export", "--output", str(path), stderr=io.StringIO())
    data = json.loads(path.read_text())
    assert data["format"] == "ratelimits.policies" and data["version"] == 1
    assert [p["name"] for p in data["policies"]] == ["api", "hot", "login"]

    Policy.objects.all().delete()  # another environment: none of them yet
    out = run("import", str(path))
    assert "create api" in out and "Imported: 3 created." in out
    assert rows() == before
    # the same file again changes nothing
    assert "Imported: 3 unchanged." in run("import", str(path))
    assert rows() == before


def test_an_import_updates_by_name_and_says_what_changed(make_policy, tmp_path):
    make_policy(name="login", mode="shadow", limit=5, period=60)
    make_policy(name="other", limit=7)
    path = tmp_path / "p.json"
    path.write_text(run("export"))
    data = json.loads(path.read_text())
    login = next(p for p in data["policies"] if p["name"] == "login")
    login.update(mode="enforce", limit=10)
    data["policies"].append({**login, "name": "login-v2", "limit": 3})
    path.write_text(json.dumps(data))

    out = run("import", str(path), "--dry-run")
    assert "update login: mode 'shadow' -> 'enforce'; limit 5 -> 10" in out
    assert "create login-v2" in out and "unchanged other" in out
    assert "nothing written" in out
    assert Policy.objects.get(name="login").limit == 5  # the dry run wrote nothing
    assert not Policy.objects.filter(name="login-v2").exists()

    out = run("import", str(path))
    assert "Imported: 1 created, 1 updated, 1 unchanged." in out
    assert Policy.objects.get(name="login").limit == 10
    assert Policy.objects.get(name="login-v2").limit == 3


def test_delete_missing_removes_the_policies_the_file_does_not_name(make_policy, tmp_path):
    make_policy(name="keep")
    path = tmp_path / "p.json"
    path.write_text(run("export"))
    make_policy(name="stray")
    assert "delete stray" not in run("import", str(path))  # without the flag: kept
    assert Policy.objects.filter(name="stray").exists()
    out = run("import", str(path), "--delete-missing")
    assert "delete stray" in out and "1 deleted" in out
    assert list(Policy.objects.values_list("name", flat=True)) == ["keep"]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"limit": 0}, "policy 2 'b': limit: Ensure this value is greater than or equal to 1."),
        ({"algorithm": "gcra", "batch": 5}, "policy 2 'b': batch:"),
        ({"key": "ipx"}, "policy 2 'b': key:"),
        ({"colour": "red"}, "policy 2 'b': unknown field(s) colour; the fields are name,"),
        ({"name": "a"}, "policy 2: 'a' appears twice"),
        ({"overrides": [{"match": "ip:192.0.2.1", "limit": 0}]},
         "'ip:192.0.2.1': limit: 0 is not a limit: leave it empty"),
        ({"charge_on": "login_failed", "reset_on": "login"},
         "policy 2 'b': reset_on: A reset clears the count of the client that got the "
         "response, and a key of 'ip' counts everyone behind one address"),
        ({"cost_function": "sys.exit"},
         "policy 2 'b': cost_function: 'sys.exit' is a builtin, not a function written in"),
        ({"name": "A"}, "policy 2 'A': name: A policy named 'a' exists; names may not differ"),
        ({"overrides": [{"match": "ip:10.1.2.3/8", "exempt": True}]},
         "'ip:10.1.2.3/8': match: '10.1.2.3/8' has bits set past its /8: the network it "
         "falls in is 10.0.0.0/8"),
    ],
)
def test_a_refused_import_changes_nothing_and_names_the_policy_and_field(
    make_policy, tmp_path, edit, says
):
    make_policy(name="a", limit=5)
    make_policy(name="b", limit=5)
    before = rows()
    data = json.loads(run("export"))
    data["policies"][0]["limit"] = 50  # a valid change before the bad one ...
    data["policies"][1].update(edit)
    data["policies"].append({**data["policies"][0], "name": "c"})  # ... and a new one
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CommandError) as info:
        run("import", str(path))
    assert "nothing was changed" in str(info.value)
    assert says in str(info.value)
    assert rows() == before  # all or nothing


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ('{"policies": []}', "not a policy file"),
        ('{"format": "ratelimits.policies", "version": 9, "policies": []}', "version 9"),
        ('{"format": "ratelimits.policies", "version": 1, "policies": [{"limit": 5}]}',
         'policy 1: must be an object with a "name"'),
    ],
)
def test_a_file_that_is_not_a_policy_file_is_refused_clearly(tmp_path, text, says):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(CommandError) as info:
        run("import", str(path))
    assert says in str(info.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(CommandError, match=r"cannot read .*nope\.json"):
        run("import", str(tmp_path / "nope.json"))


def test_an_import_publishes_the_change_to_every_process(
    client, make_policy, tmp_path, django_capture_on_commit_callbacks
):
    make_policy(name="a", limit=100, path="/hello/")
    assert client.get("/hello/").status_code == 200
    data = json.loads(run("export"))
    data["policies"][0]["limit"] = 1
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with django_capture_on_commit_callbacks(execute=True):
        run("import", str(path))
    assert client.get("/hello/").status_code == 429  # the next request has the new limit


def test_overrides_travel_with_their_policy(make_policy, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from ratelimits.models import Override

    policy = make_policy(name="per-ip", limit=5, period=60)
    expires = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    Override.objects.create(policy=policy, match="ip:10.0.0.0/8", exempt=True, note="office")
    Override.objects.create(policy=policy, match="ip:192.0.2.10", limit=50, expires=expires)
    path = tmp_path / "p.json"
    path.write_text(run("export"))
    data = json.loads(path.read_text())
    assert [o["match"] for o in data["policies"][0]["overrides"]] == [
        "ip:10.0.0.0/8", "ip:192.0.2.10"]

    Policy.objects.all().delete()  # another environment
    out = run("import", str(path))
    assert "create per-ip override ip:192.0.2.10" in out
    found = {o.match: o for o in Override.objects.all()}
    assert found["ip:10.0.0.0/8"].exempt and found["ip:10.0.0.0/8"].note == "office"
    assert found["ip:192.0.2.10"].limit == 50 and found["ip:192.0.2.10"].expires == expires

    # the file's overrides are all of them: changed by match, the others deleted
    data["policies"][0]["overrides"] = [{"match": "ip:192.0.2.10", "limit": 80}]
    path.write_text(json.dumps(data))
    out = run("import", str(path))
    assert "update per-ip override ip:192.0.2.10: limit 50 -> 80" in out
    assert "delete per-ip override ip:10.0.0.0/8" in out
    assert list(Override.objects.values_list("match", "limit")) == [("ip:192.0.2.10", 80)]


def test_an_invalid_override_in_a_file_changes_nothing(make_policy, tmp_path):
    make_policy(name="per-ip", limit=5)
    data = json.loads(run("export"))
    data["policies"][0]["limit"] = 9
    data["policies"][0]["overrides"] = [{"match": "user:42", "limit": 50}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CommandError) as info:
        run("import", str(path))
    assert "policy 1 'per-ip' override 1 'user:42': match: This policy counts by ip" in str(
        info.value)
    assert Policy.objects.get(name="per-ip").limit == 5
