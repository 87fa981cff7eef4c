"""`manage.py ratelimits status | reset | replay`, against the real Redis and database."""

from __future__ import annotations

import gzip
import io
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db

T = "10/Oct/2024:13:55:{:02d} +0000"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimits", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def line(ip="10.0.0.1", second=0, method="GET", path="/hello/", user="-", stamp=None):
    stamp = stamp or T.format(second)
    return f'{ip} - {user} [{stamp}] "{method} {path} HTTP/1.1" 200 12 "-" "curl/8"\n'


def replay(tmp_path, lines, *args, name="access.log"):
    """Replay `lines` (text, or bytes written as is) and return the JSON report."""
    path = tmp_path / name
    if isinstance(lines, bytes):
        path.write_bytes(lines)
    else:
        path.write_text("".join(lines))
    return json.loads(run("replay", str(path), "--json", *args))


def by_name(report):
    return {p["name"]: p for p in report["policies"]}


# -- status -----------------------------------------------------------------------------


def test_status_shows_each_policy_with_its_last_hour(client, make_policy):
    make_policy(name="hello-ip", limit=2, period=600, path="/hello/")
    make_policy(name="watch", mode="shadow", limit=1, period=60, path="/hello/")
    make_policy(name="idle", mode="off", limit=100, period=60)
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]

    text = run("status")
    rows = {row.split()[0]: row for row in text.splitlines()[1:]}
    assert text.splitlines()[0].split()[:6] == ["policy", "mode", "rollout", "algorithm",
                                                "rate", "key"]
    # admitted, rejected, would-reject, refused share
    assert rows["hello-ip"].split()[-4:] == ["2", "1", "0", "33.3%"]
    assert "2 per 10 minutes" in rows["hello-ip"]
    # watch admitted the first; the second it would have refused; the third was refused by
    # hello-ip, so watch was spared (it would have refused it too, but nothing was charged).
    assert rows["watch"].split()[-4:] == ["1", "0", "2", "66.7%"]
    assert rows["idle"].split()[-4:] == ["0", "0", "0", "—"]

    data = json.loads(run("status", "--json"))
    hour = {p["name"]: p["last_hour"] for p in data["policies"]}
    assert hour["hello-ip"]["admitted"] == 2 and hour["hello-ip"]["rejected"] == 1
    assert hour["idle"]["refused_share"] is None
    assert [p["name"] for p in data["policies"]] == ["hello-ip", "idle", "watch"]
    assert {(p["max_wait"], p["warmup"]) for p in data["policies"]} == {(0, 0)}


def test_status_gives_an_adaptive_policys_learnt_limit_and_latency(client, make_policy):
    make_policy(name="busy", algorithm="adaptive", limit=8, floor=2, key="global",
                path="/hello/")
    make_policy(name="hello-ip", limit=100, path="/hello/")
    for _ in range(3):
        assert client.get("/hello/").status_code == 200
    data = json.loads(run("status", "--json"))
    rows = {p["name"]: p for p in data["policies"]}
    busy = rows["busy"]
    assert (busy["algorithm"], busy["floor"], busy["rate"]) == (
        "adaptive", 2, "2 to 8 at a time, learnt")
    assert busy["last_hour"]["admitted"] == 3
    assert 2 <= busy["last_hour"]["mean_limit"] <= 8
    assert 0 < busy["last_hour"]["latency_ms"] < 5_000
    assert rows["hello-ip"]["last_hour"]["mean_limit"] is None  # no samples: a rate


# -- reset ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["127.0.0.1", "ip:127.0.0.1"])
def test_reset_lets_a_refused_client_through_again(client, make_policy, key):
    make_policy(name="hello-ip", limit=1, period=3600, path="/hello/")
    make_policy(name="other", limit=1, period=3600, path="/login/")
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    client.get("/login/")
    out = run("reset", "hello-ip", "--key", key)
    assert "ip:127.0.0.1" in out and "hello-ip" in out
    assert client.get("/hello/").status_code == 200
    assert client.get("/login/").status_code == 429  # other policies keep their state


def test_reset_takes_the_client_after_the_policy_name_as_the_demo_page_writes_it(
    client, make_policy
):
    """`ratelimits reset admin-login-failures 127.0.0.1`, as docs/demo.md has it."""
    make_policy(name="hello-ip", limit=1, period=3600, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    out = run("reset", "hello-ip", "127.0.0.1")
    assert out.startswith("Reset ip:127.0.0.1 under policy hello-ip")
    assert client.get("/hello/").status_code == 200
    assert "Reset ip:127.0.0.1" in run("reset", "hello-ip", "127.0.0.1", "--key", "127.0.0.1")
    with pytest.raises(CommandError, match=r"two clients given, '127\.0\.0\.1' and --key "
                       r"'127\.0\.0\.2': give one"):
        run("reset", "hello-ip", "127.0.0.1", "--key", "127.0.0.2")


def test_reset_without_a_key_refuses_and_names_recent_offenders(client, make_policy):
    make_policy(name="hello-ip", limit=1, period=3600, path="/hello/")
    client.get("/hello/")
    client.get("/hello/")
    with pytest.raises(CommandError, match=r"--key .*ip:127\.0\.0\.1 \(1\)"):
        run("reset", "hello-ip")


def test_reset_of_an_unknown_policy_names_it_and_similar_ones(make_policy):
    make_policy(name="hello-ip")
    make_policy(name="login-ip")
    with pytest.raises(CommandError, match=r"'helo-ip'.*did you mean hello-ip"):
        run("reset", "helo-ip", "--key", "1.2.3.4")


def test_reset_of_a_user_policy_accepts_the_bare_user_id(make_policy):
    make_policy(name="per-user", key="user")
    out = run("reset", "per-user", "--key", "7")
    assert "user:7" in out


# -- replay -----------------------------------------------------------------------------


def test_replay_counts_would_be_rejections_in_one_second(tmp_path, make_policy):
    make_policy(name="per-second", algorithm="fixed_window", limit=3, period=1)
    report = replay(tmp_path, [line(second=5) for _ in range(5)])
    p = by_name(report)["per-second"]
    assert (p["matched"], p["refused"], p["peak_second"], p["peak_minute"]) == (5, 2, 5, 5)
    assert p["offenders"] == [["ip:10.0.0.1", 2]]
    assert report["format"] == "combined" and report["requests"] == 5


def test_replay_charges_nothing_when_an_enforced_policy_refuses_and_counts_shadow(
    tmp_path, make_policy
):
    make_policy(name="a-tight", limit=2, period=3600)
    make_policy(name="b-loose", limit=3, period=3600)
    make_policy(name="c-shadow", mode="shadow", limit=1, period=3600)
    report = by_name(replay(tmp_path, [line(second=s) for s in range(5)]))
    assert report["a-tight"]["refused"] == 3
    # Had a refused request been charged, b-loose would have refused the fourth and fifth.
    assert report["b-loose"]["refused"] == 0
    # The shadow policy counts what it would refuse, and never blocks: a-tight still
    # admitted the second request.
    assert report["c-shadow"]["refused"] == 4
    assert report["c-shadow"]["mode"] == "shadow"


def test_replay_text_output_and_top_offenders(tmp_path, make_policy):
    make_policy(name="per-ip", limit=1, period=60)
    clients = ["10.0.0.9", "10.0.0.9", "10.0.0.2", "10.0.0.3", "10.0.0.2", "10.0.0.9", "10.0.0.9"]
    seconds = [0, 1, 1, 1, 2, 2, 3]
    lines = [line(ip=ip, second=s) for ip, s in zip(clients, seconds, strict=True)]
    (tmp_path / "access.log").write_text("".join(lines))
    out = run("replay", str(tmp_path / "access.log"), "--top", "2")
    assert "7 requests from 2024-10-10 13:55:00 UTC to 2024-10-10 13:55:03 UTC" in out
    table = out.split("Top offenders of per-ip:")[1].splitlines()
    assert table[2].split() == ["ip:10.0.0.9", "3"]
    assert table[3].split() == ["ip:10.0.0.2", "1"]
    assert "10.0.0.3" not in out
    row = next(r for r in out.splitlines() if r.startswith("per-ip"))
    assert row.split() == ["per-ip", "enforce", "7", "4", "57.1%", "3", "7"]


def test_replay_matches_path_and_method_like_the_middleware(tmp_path, make_policy):
    make_policy(name="login", limit=100, period=60, path="/login/", methods="POST")
    lines = [
        line(method="POST", path="/login/"),
        line(method="POST", path="/LOGIN?next=/x"),  # case, trailing slash, query
        line(method="POST", path="//login/./"),
        line(method="POST", path="/%6cogin/"),  # percent-encoded
        line(method="GET", path="/login/"),  # another method
        line(method="POST", path="/login/more/"),  # another path
        line(method="POST", path="http://example.com/login/"),  # absolute form
    ]
    assert by_name(replay(tmp_path, lines))["login"]["matched"] == 5


def test_replay_groups_ipv6_clients_by_64(tmp_path, make_policy):
    make_policy(name="per-ip", limit=2, period=60)
    lines = [line(ip=f"2001:db8:1:2::{i}") for i in range(3)] + [line(ip="2001:db8:1:3::1")]
    p = by_name(replay(tmp_path, lines))["per-ip"]
    assert p["refused"] == 1
    assert p["offenders"] == [["ip:2001:db8:1:2::/64", 1]]


def test_replay_json_lines_with_users_and_both_time_forms(tmp_path, make_policy):
    make_policy(name="per-user", key="user", limit=1, period=60)
    make_policy(name="per-client", key="user_or_ip", limit=10, period=60)
    rows = [
        {
            "time": "2024-10-10T13:55:00Z",
            "ip": "10.0.0.1",
            "method": "GET",
            "path": "/a",
            "user": "alice",
        },
        {
            "time": 1728568500.5,
            "client_ip": "10.0.0.1",
            "method": "GET",
            "path": "/a",
            "user": "alice",
        },
        {
            "time": "2024-10-10T15:55:01+02:00",
            "remote_addr": "10.0.0.1",
            "method": "GET",
            "path": "/a",
        },
    ]
    report = replay(tmp_path, [json.dumps(r) + "\n" for r in rows], name="access.jsonl")
    assert report["format"] == "json"
    policies = by_name(report)
    assert policies["per-user"]["matched"] == 2 and policies["per-user"]["refused"] == 1
    assert policies["per-user"]["unidentified"] == 1  # the anonymous line
    assert policies["per-client"]["matched"] == 3
    assert report["first"] == 1728568500.0 and report["last"] == 1728568501.0


def test_replay_reports_and_skips_policies_it_cannot_replay(tmp_path, make_policy):
    make_policy(name="per-ip", limit=1, period=60)
    make_policy(name="api-key", key="header:X-Api-Key", limit=1, period=60)
    make_policy(name="items", scope="items", limit=1, period=60)
    make_policy(name="in-flight", algorithm="concurrency", limit=1, period=60)
    (tmp_path / "access.log").write_text(line() + line())
    out = run("replay", str(tmp_path / "access.log"))
    assert out.count("Not replayed: api-key: key header:X-Api-Key") == 1
    assert "Not replayed: items: DRF scope 'items'" in out
    assert "Not replayed: in-flight: concurrency" in out
    assert "api-key" not in out.split("Not replayed: in-flight")[1]
    report = replay(tmp_path, [line(), line()])
    assert list(by_name(report)) == ["per-ip"]


def test_replay_query_keys_read_the_logged_query_string(tmp_path, make_policy):
    make_policy(name="per-key", key="query:api_key", limit=1, period=60)
    lines = [
        line(path="/a?api_key=k1"),
        line(path="/b?x=1&api_key=k1"),
        line(path="/a?api_key=k2"),
        line(path="/a"),
    ]
    p = by_name(replay(tmp_path, lines))["per-key"]
    assert (p["matched"], p["refused"], p["unidentified"]) == (3, 1, 1)
    assert p["offenders"] == [["query:k1", 1]]


def test_replay_malformed_line_names_file_and_line(tmp_path, make_policy):
    make_policy(limit=10, period=60)
    (tmp_path / "access.log").write_text(line() + "\n" + "garbage here\n" + line())
    with pytest.raises(CommandError, match=r"access\.log:3: not a combined-log line: 'garbage"):
        run("replay", str(tmp_path / "access.log"))


def test_replay_bad_timestamp_is_malformed(tmp_path, make_policy):
    make_policy(limit=10, period=60)
    (tmp_path / "access.log").write_text(line(stamp="10/Foo/2024:13:55:00 +0000"))
    with pytest.raises(CommandError, match=r"access\.log:1: bad timestamp"):
        run("replay", str(tmp_path / "access.log"))


def test_replay_skip_bad_counts_and_lists_the_first_lines(tmp_path, make_policy):
    make_policy(name="p", limit=10, period=60)
    lines = [line(), "oops\n", line(), "nope\n", '{"not": "combined"}\n', line()]
    report = replay(tmp_path, lines, "--skip-bad")
    assert (report["bad_lines"], report["bad_examples"]) == (3, [2, 4, 5])
    assert by_name(report)["p"]["matched"] == 3
    (tmp_path / "t.log").write_text("".join(lines))
    assert "3 malformed lines skipped (lines 2, 4, 5)" in run(
        "replay", str(tmp_path / "t.log"), "--skip-bad"
    )


def test_replay_reads_gzip(tmp_path, make_policy):
    make_policy(name="p", limit=2, period=60)
    data = gzip.compress("".join(line() for _ in range(3)).encode())
    p = by_name(replay(tmp_path, data, name="access.log.gz"))["p"]
    assert (p["matched"], p["refused"]) == (3, 1)


def test_replay_out_of_order_lines_run_at_the_latest_time(tmp_path, make_policy):
    make_policy(name="p", limit=2, period=1)
    # Seconds 3, 3, then a line from second 2: replayed at 3, so it is the third in 3.
    report = replay(tmp_path, [line(second=3), line(second=3), line(second=2)])
    assert report["out_of_order"] == 1
    assert by_name(report)["p"]["refused"] == 1


def test_replay_lines_without_a_request_are_counted_not_replayed(tmp_path, make_policy):
    make_policy(name="p", limit=1, period=60)
    probe = '10.0.0.1 - - [10/Oct/2024:13:55:00 +0000] "-" 400 0 "-" "-"\n'
    tls = '10.0.0.1 - - [10/Oct/2024:13:55:00 +0000] "\\x16\\x03\\x01" 400 0\n'
    report = replay(tmp_path, [probe, tls, line()])
    assert (report["no_request"], report["requests"]) == (2, 1)
    assert by_name(report)["p"]["refused"] == 0


def test_replay_policy_option_selects_and_validates(tmp_path, make_policy):
    make_policy(name="one", limit=1, period=60)
    make_policy(name="two", limit=5, period=60)
    make_policy(name="dormant", mode="off", limit=1, period=60)
    report = replay(tmp_path, [line(), line()], "--policy", "two", "dormant")
    policies = by_name(report)
    assert set(policies) == {"two", "dormant"}
    # An off policy named explicitly is observed as shadow: it never blocks "two".
    assert policies["dormant"]["refused"] == 1 and policies["two"]["refused"] == 0
    with pytest.raises(CommandError, match="'tw0'"):
        replay(tmp_path, [line()], "--policy", "tw0")


def test_replay_common_log_format_and_missing_file(tmp_path, make_policy):
    make_policy(name="p", limit=1, period=60)
    common = '10.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 -\n'
    report = replay(tmp_path, [common, common])
    assert by_name(report)["p"]["refused"] == 1
    assert report["first"] == 971211336.0
    with pytest.raises(CommandError, match="cannot read"):
        run("replay", str(tmp_path / "missing.log"))


def test_replay_progress_on_request(tmp_path, make_policy):
    make_policy(name="p", limit=1, period=60)
    (tmp_path / "access.log").write_text(line())
    err = io.StringIO()
    call_command(
        "ratelimits",
        "replay",
        str(tmp_path / "access.log"),
        "--progress",
        stdout=io.StringIO(),
        stderr=err,
    )
    assert "replay: 100%" in err.getvalue()


def _status_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and each policy's cells of `status`'s table (cells are split on two
    spaces: a rate reads "2 per 10 minutes")."""
    lines = text.splitlines()
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines if line.strip()]
    header = cells[0]
    return header, {row[0]: row for row in cells[1:] if len(row) > 1}


def _scoped_and_rolled_out(make_policy) -> None:
    make_policy(name="hello", path="/hello/", limit=5, period=60)
    make_policy(name="items", path="*", scope="items", limit=10, period=60, rollout=25)


def test_status_shows_scope_and_rollout_with_the_store(client, make_policy):
    _scoped_and_rolled_out(make_policy)
    assert client.get("/hello/").status_code == 200
    header, rows = _status_table(run("status"))
    assert header == ["policy", "mode", "rollout", "algorithm", "rate", "key", "path", "scope",
                      "admitted", "rejected", "would reject", "refused"]
    cell = {name: dict(zip(header, row, strict=True)) for name, row in rows.items()}
    assert (cell["items"]["scope"], cell["items"]["rollout"]) == ("items", "25%")
    assert (cell["hello"]["scope"], cell["hello"]["rollout"]) == ("-", "100%")
    assert cell["hello"]["admitted"] == "1"  # the store's figures: this test's request
    data = json.loads(run("status", "--json"))
    assert data["shared"] is True
    assert {p["name"]: (p["scope"], p["rollout"]) for p in data["policies"]} == {
        "hello": ("", 100), "items": ("items", 25)}


def test_status_on_the_in_process_engine_says_it_cannot_know_instead_of_zeros(
    memory_store, client, make_policy
):
    _scoped_and_rolled_out(make_policy)
    # requests this process served: still nothing a command run elsewhere could read
    assert client.get("/hello/").status_code == 200
    text = run("status")
    header, rows = _status_table(text)
    assert header == ["policy", "mode", "rollout", "algorithm", "rate", "key", "path", "scope"]
    assert rows["items"][-1] == "items" and rows["items"][2] == "25%"
    assert rows["hello"][-1] == "-" and rows["hello"][2] == "100%"
    # no figure column, no zero: one line says why and what to do
    assert not re.search(r"\b0\b", "\n".join(text.splitlines()[1:3]))
    (why,) = [line for line in text.splitlines() if "in-process engine" in line]
    assert "the counts live inside the server processes" in why
    assert "a command cannot see" in why
    for store in ("Redis", "PostgreSQL", "['STORE']"):
        assert store in why
    data = json.loads(run("status", "--json"))
    assert data["shared"] is False and data["error"] is None
    assert [p["last_hour"] for p in data["policies"]] == [None, None]  # unknown, not zeros
    assert {p["name"]: (p["scope"], p["rollout"]) for p in data["policies"]} == {
        "hello": ("", 100), "items": ("items", 25)}


def test_replay_jobs_option_splits_and_gives_the_same_report(tmp_path, make_policy):
    make_policy(name="per-ip", limit=2, period=60)
    lines = [line(ip=f"10.0.0.{i % 7}", second=i % 60) for i in range(300)]
    one = replay(tmp_path, lines, "--jobs", "1", "--top", "10")
    two = replay(tmp_path, lines, "--jobs", "2", "--top", "10")
    assert by_name(one)["per-ip"]["refused"] > 0
    assert {**one, "seconds": 0} == {**two, "seconds": 0}
    with pytest.raises(CommandError, match="--jobs must be 1 or more"):
        replay(tmp_path, lines, "--jobs", "0")
