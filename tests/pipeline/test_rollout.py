"""Gradual rollout: an enforced policy enforced for a stable share of its clients, the
others counted as in shadow."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from ratelimits.models import Policy
from ratelimits.ops import observe
from ratelimits.pipeline.compiled import compile_policy, in_rollout

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
URL = "/admin/ratelimits/policy/"


def compiled(**fields):
    values = {"name": "api", "mode": "enforce", "algorithm": "fixed_window", "limit": 10,
              "period": 60, "key": "user", "path": "*", "pk": 1, **fields}
    return compile_policy(Policy(**values))


@pytest.mark.parametrize("rollout", [1, 5, 25, 50, 90])
def test_the_enforced_share_is_the_rollout_within_three_points(rollout):
    policy = compiled(rollout=rollout)
    enforced = sum(not policy.limit_for(f"user:{i}").shadow for i in range(10_000))
    assert abs(enforced / 100 - rollout) <= 3, enforced


def test_a_client_keeps_its_draw_and_stays_in_as_the_rollout_rises():
    clients = [f"ip:203.0.113.{i}" for i in range(200)] + [f"user:{i}" for i in range(800)]
    previous: set[str] = set()
    for rollout in (1, 5, 25, 50, 100):
        policy = compiled(rollout=rollout)
        now_in = {c for c in clients if not policy.limit_for(c).shadow}
        assert now_in == {c for c in clients if not policy.limit_for(c).shadow}  # stable
        assert previous <= now_in  # nobody enforced at 5% is let go at 25%
        previous = now_in
    assert previous == set(clients)  # 100%: everyone


def _draws_in_another_interpreter(clients: list[str], secret: str) -> str:
    """in_rollout("api", client, 25) for each client, as "0"/"1", drawn by a new
    interpreter (its own hash seed) with the test settings and SECRET_KEY `secret`."""
    code = (
        "from django.conf import settings; "
        f"settings.SECRET_KEY = {secret!r}; "
        "from ratelimits.pipeline.compiled import in_rollout; "
        f"print(''.join('1' if in_rollout('api', c, 25) else '0' for c in {clients!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "",
                              "DJANGO_SETTINGS_MODULE": "tests.settings"})
    return out.stdout.strip()


def test_every_process_draws_the_same_clients(settings):
    """Another interpreter (a restart, another machine) with the same SECRET_KEY picks
    the very same clients; one with another key picks others."""
    clients = [f"user:{i}" for i in range(500)]
    here = "".join("1" if in_rollout("api", c, 25) else "0" for c in clients)
    assert _draws_in_another_interpreter(clients, settings.SECRET_KEY) == here
    assert 0 < here.count("1") < len(here)
    assert _draws_in_another_interpreter(clients, "another-site") != here


# -- the draw is keyed with a secret (issue 29, #8b) --------------------------------------


def _public_draw(name: str, identity: str) -> int:
    """The draw anyone could compute from the policy's name and their own identity, as
    the app drew it before it was keyed with a secret."""
    raw = name.encode() + b"\0" + identity.encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big") % 100


def test_values_a_client_picks_to_be_outside_the_share_are_not_outside_it():
    """A client keyed by a header it chooses picks values whose public draw is outside a
    10% rollout: without the secret, a tenth of them are in all the same."""
    chosen = [f"header:key-{i}" for i in range(20_000)
              if _public_draw("api", f"header:key-{i}") >= 10][:5000]
    enforced = sum(in_rollout("api", value, 10) for value in chosen)
    assert abs(enforced / len(chosen) * 100 - 10) <= 3, enforced


def test_picked_api_keys_are_still_refused_over_the_wire(client, make_policy):
    """The attack end to end: 100 X-Api-Key values whose public draw is outside the 10%,
    two requests each against a limit of one; those the secret draw takes in are
    refused."""
    make_policy(name="api", limit=1, path="/hello/", key="header:X-Api-Key", rollout=10)
    chosen = [f"key-{i}" for i in range(1000) if _public_draw("api", f"header:key-{i}") >= 10]
    refused = [k for k in chosen[:100]
               if [client.get("/hello/", HTTP_X_API_KEY=k).status_code for _ in range(2)]
               == [200, 429]]
    assert refused  # some of the picked keys are enforced after all
    assert refused == [k for k in chosen[:100] if in_rollout("api", f"header:{k}", 10)]


def test_another_secret_key_draws_other_clients_and_keeps_the_share(settings):
    clients = [f"user:{i}" for i in range(10_000)]
    before = {c for c in clients if in_rollout("api", c, 25)}
    settings.SECRET_KEY = "another-site"
    after = {c for c in clients if in_rollout("api", c, 25)}
    assert before != after
    assert abs(len(after) / 100 - 25) <= 3
    assert after <= {c for c in clients if in_rollout("api", c, 50)}  # still only grows


# -- a global key has one client: no share of it (issue 29, #8a) -------------------------


@pytest.mark.parametrize("fields", [
    {"mode": "enforce", "rollout": 1},
    {"mode": "enforce", "rollout": 99},
    {"mode": "shadow", "rollout": 10},  # enforced later with a click: refused now
    {"mode": "enforce", "rollout": 50, "algorithm": "adaptive", "limit": 64, "period": 10},
])
def test_a_rollout_below_100_on_a_global_key_is_refused_saying_what_to_do(fields):
    policy = Policy(**{"name": "all", "algorithm": "fixed_window", "limit": 5, "period": 60,
                       "key": "global", "path": "*", **fields})
    with pytest.raises(ValidationError) as info:
        policy.full_clean()
    (message,) = info.value.message_dict["rollout"]
    assert "for everyone or for no one" in message and "Set rollout to 100" in message
    assert "shadow" in message and "user" in message


def test_a_global_key_at_100_and_a_client_key_at_10_are_fine():
    Policy(name="all", mode="enforce", algorithm="fixed_window", limit=5, period=60,
           key="global", path="*", rollout=100).full_clean()
    Policy(name="some", mode="enforce", algorithm="fixed_window", limit=5, period=60,
           key="ip", path="*", rollout=10).full_clean()


def test_a_global_policy_saved_with_a_rollout_before_the_rule_is_enforced_for_no_one(
    client, caplog, django_capture_on_commit_callbacks
):
    """A row saved around clean() (an older version, update()): every request is watched
    as in shadow, whatever its one draw would give, and the log says why."""
    name = next(f"all-{i}" for i in range(100) if in_rollout(f"all-{i}", "global", 50))
    with django_capture_on_commit_callbacks(execute=True):
        Policy.objects.create(name=name, mode="enforce", algorithm="fixed_window", limit=1,
                              period=60, key="global", path="/hello/", rollout=50)
    with caplog.at_level("INFO", logger="ratelimits"):
        assert [client.get("/hello/").status_code for _ in range(3)] == [200] * 3
    assert f"policy {name!r} is enforced for no client until its rollout is 100" in caplog.text
    assert f"shadow policy {name} would reject" in caplog.text


def test_shadow_and_off_policies_are_not_changed_by_a_rollout():
    assert compiled(mode="shadow", rollout=100).limit_for("user:1").shadow
    assert all(compiled(mode="shadow", rollout=5).limit_for(f"user:{i}").shadow
               for i in range(50))


def _ips(rollout: int) -> tuple[str, str]:
    """A client address the policy "half" enforces, and one it leaves in shadow."""
    inside = outside = None
    for i in range(1, 250):
        ip = f"198.51.100.{i}"
        if in_rollout("half", f"ip:{ip}", rollout):
            inside = inside or ip
        else:
            outside = outside or ip
        if inside and outside:
            return inside, outside
    raise AssertionError("no client on each side")


def test_requests_of_clients_outside_the_rollout_pass_and_count_as_would_reject(
    client, make_policy, any_store
):
    make_policy(name="half", limit=2, path="/hello/", rollout=50)
    inside, outside = _ips(50)
    got_in = [client.get("/hello/", REMOTE_ADDR=inside).status_code for _ in range(4)]
    got_out = [client.get("/hello/", REMOTE_ADDR=outside).status_code for _ in range(4)]
    assert got_in == [200, 200, 429, 429]
    assert got_out == [200, 200, 200, 200]
    assert observe.last_hour(["half"])["half"] == observe.PolicyCounts(
        admitted=4, rejected=2, would_reject=2)


def test_a_client_outside_the_rollout_is_watched_as_in_shadow(client, make_policy, caplog):
    # its log line and signal are a shadow policy's, and it gets no rate-limit headers
    from ratelimits import signals

    make_policy(name="half", limit=1, path="/hello/", rollout=50)
    _, outside = _ips(50)
    sent = []

    def record(signal, **kwargs):
        sent.append(signal)

    signals.request_limited.connect(record)
    signals.request_would_be_limited.connect(record)
    try:
        with caplog.at_level("INFO", logger="ratelimits"):
            responses = [client.get("/hello/", REMOTE_ADDR=outside) for _ in range(2)]
    finally:
        signals.request_limited.disconnect(record)
        signals.request_would_be_limited.disconnect(record)
    assert [r.status_code for r in responses] == [200, 200]
    assert sent == [signals.request_would_be_limited]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "shadow policy half would reject" in caplog.records[0].getMessage()
    assert all("RateLimit" not in r for r in responses)


def test_during_an_outage_deny_refuses_only_the_clients_in_the_rollout(
    client, make_policy, settings
):
    settings.RATELIMITS = {**settings.RATELIMITS, "REDIS_URL": "redis://127.0.0.1:9/0"}
    make_policy(name="half", limit=5, path="/hello/", rollout=50, on_error="deny")
    inside, outside = _ips(50)
    assert client.get("/hello/", REMOTE_ADDR=inside).status_code == 503
    assert client.get("/hello/", REMOTE_ADDR=outside).status_code == 200


def test_the_list_shows_the_rollout_and_the_action_raises_it_in_steps(
    admin_client, make_policy, django_capture_on_commit_callbacks
):
    from ratelimits.pipeline.engines import get_engine

    policy = make_policy(name="half", limit=2, path="/hello/", rollout=1)
    page = admin_client.get(URL).content.decode()
    assert "enforce, 1% of clients" in page
    before = get_engine().bump_version()
    seen = []
    for _ in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            response = admin_client.post(URL, {"action": "raise_rollout",
                                               "_selected_action": [policy.pk]})
        assert response.status_code == 302
        policy.refresh_from_db()
        seen.append(policy.rollout)
    assert seen == [5, 25, 50, 100, 100]
    assert get_engine().bump_version() >= before + 5  # each raise published
    assert "1% of clients" not in admin_client.get(URL).content.decode()


@pytest.mark.parametrize("rollout", [0, 101])
def test_a_rollout_outside_1_to_100_is_refused_with_one_message(rollout):
    policy = Policy(name="x", mode="enforce", algorithm="fixed_window", limit=5, period=60,
                    key="ip", path="*", rollout=rollout)
    with pytest.raises(Exception) as info:
        policy.full_clean()
    assert len(info.value.message_dict["rollout"]) == 1
