"""Replay of the policies that count what matters: `charge_on` and `reset_on` by the
logged status, lockouts and calendar windows, as the middleware would decide them."""

from __future__ import annotations

import pytest

from tests.management.test_commands import by_name, replay, run

pytestmark = pytest.mark.django_db


def logged(status, minute=0, second=0, ip="10.0.0.1", hour=22, day=14, path="/login/",
           user="-"):
    stamp = f"{day:02d}/Nov/2023:{hour:02d}:{minute:02d}:{second:02d} +0000"
    return f'{ip} - {user} [{stamp}] "POST {path} HTTP/1.1" {status} 12 "-" "curl/8"\n'


def test_replay_charges_only_the_statuses_charge_on_names(tmp_path, make_policy):
    make_policy(name="login-ip", path="/login/", limit=3, period=900, charge_on="401,403")
    lines = [logged(200, second=s) for s in range(10)]  # successes: never charged
    lines += [logged(401, second=10 + s) for s in range(3)]  # three failures: charged
    lines += [logged(200, second=20)]  # at the limit: refused, the right password too
    p = by_name(replay(tmp_path, lines))["login-ip"]
    assert (p["matched"], p["refused"]) == (14, 1)


def test_replay_resets_on_the_statuses_reset_on_names(tmp_path, make_policy):
    make_policy(name="otp-user", key="user", path="/login/", limit=2, period=900,
                charge_on="4xx", reset_on="204")
    statuses = [401, 204, 401, 401, 401]  # the 204 clears the first failure
    lines = [logged(code, second=s, user="alice") for s, code in enumerate(statuses)]
    p = by_name(replay(tmp_path, lines))["otp-user"]
    assert p["refused"] == 1  # only the last: two failures since the reset


def test_replay_holds_a_lockout_beyond_the_window(tmp_path, make_policy):
    make_policy(name="login-ip", path="/login/", limit=2, period=60, lockout=600)
    lines = [logged(200, second=s) for s in range(3)]  # the third is refused: locked
    lines += [logged(200, minute=5)]  # the window passed, the lockout has not
    lines += [logged(200, minute=10, second=3)]  # over
    p = by_name(replay(tmp_path, lines))["login-ip"]
    assert p["refused"] == 2


def test_replay_counts_a_calendar_day(tmp_path, make_policy, settings):
    settings.TIME_ZONE = "America/New_York"  # midnight there is 05:00 UTC in November
    make_policy(name="daily", path="/login/", limit=2, period=60, calendar="day")
    lines = [logged(200, hour=4, minute=58), logged(200, hour=4, minute=59),
             logged(200, hour=4, minute=59, second=30),  # the same local day: refused
             logged(200, hour=5, minute=0, second=1)]  # local midnight passed
    p = by_name(replay(tmp_path, lines))["daily"]
    assert p["refused"] == 1


def test_replay_reads_the_status_of_json_lines(tmp_path, make_policy):
    import json

    make_policy(name="login-ip", path="/login/", limit=1, period=900, charge_on="4xx")
    rows = [{"time": 1_700_000_000 + i, "ip": "10.0.0.1", "method": "POST",
             "path": "/login/", "status_code": code} for i, code in enumerate([200, 403, 200])]
    report = replay(tmp_path, [json.dumps(r) + "\n" for r in rows], name="access.jsonl")
    assert by_name(report)["login-ip"]["refused"] == 1


@pytest.mark.parametrize(("fields", "why"), [
    ({"charge_on": "login_failed"},
     "charge_on: an access log does not say whether a login failed"),
    ({"reset_on": "login", "charge_on": "4xx", "key": "user"},
     "reset_on: an access log does not say whether a login succeeded"),
    ({"cost_function": "tests.pipeline.test_counting.rows_asked"},
     "cost_function: an access log does not hold the request its cost is computed from"),
])
def test_replay_says_why_a_policy_cannot_be_replayed(tmp_path, make_policy, fields, why):
    make_policy(name="login-user", path="/login/", limit=3, period=900, **fields)
    (tmp_path / "access.log").write_text(logged(200))
    out = run("replay", str(tmp_path / "access.log"))
    assert f"Not replayed: login-user: {why}" in out
