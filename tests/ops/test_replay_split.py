"""A log split by client across processes gives the report one process gives, field for
field; logs and policies that must not be split are replayed in one process."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ratelimits.models import Policy
from ratelimits.ops.replay import Replayer, jobs_for, replay_file
from ratelimits.pipeline.compiled import compile_policy

STAMP = "{:02d}/Oct/2024:13:{:02d}:{:02d} +0000"


def compiled(name: str, key: str, **fields):
    values = {"mode": "enforce", "algorithm": "sliding_window", "limit": 20, "period": 60,
              "path": "*", **fields}
    return compile_policy(Policy(name=name, key=key, **values))


def write_log(log, lines: int = 6000, seed: int = 7) -> None:
    """Heavy and light clients, anonymous and named users, lines a little out of order,
    malformed lines and lines without a request, over about ten minutes."""
    rng = random.Random(seed)
    ips = [f"198.51.100.{i}" for i in range(40)] + [f"2001:db8:{i}::{i}" for i in range(10)]
    weights = [1 / (rank + 1) for rank in range(len(ips))]
    users = ["-", "-", "alice", "bob", "carol"]
    out = []
    for i in range(lines):
        second = i * 600 // lines - (rng.random() < 0.05) * rng.randrange(1, 4)  # late lines
        minute, sec = divmod(max(second, 0), 60)
        stamp = STAMP.format(10, minute, sec)
        roll = rng.random()
        if roll < 0.01:
            out.append("garbage that is not a log line\n")
            continue
        if roll < 0.02:
            out.append(f'10.9.9.9 - - [{stamp}] "-" 400 0 "-" "-"\n')
            continue
        ip = rng.choices(ips, weights)[0]
        path = rng.choice(["/", "/api/items/?page=2", "/login/", "/search/?q=x"])
        out.append(f'{ip} - {rng.choice(users)} [{stamp}] "GET {path} HTTP/1.1" 200 5 "-" "t"\n')
    log.write_text("".join(out))


def same(a, b) -> None:
    assert dataclasses.replace(a, seconds=0) == dataclasses.replace(b, seconds=0)


@pytest.mark.parametrize(
    "policies",
    [
        [compiled("per-ip", "ip"), compiled("burst", "ip", algorithm="gcra", limit=2, period=1,
                                            burst=4, mode="shadow")],
        [compiled("per-user", "user", limit=30), compiled("hourly", "user",
                                                          algorithm="fixed_window", limit=300,
                                                          period=3600)],
        [compiled("per-client", "user_or_ip", algorithm="token_bucket", limit=5, period=10)],
    ],
    ids=["ip", "user", "user_or_ip"],
)
def test_a_split_log_gives_the_same_report_field_for_field(tmp_path, policies):
    log = tmp_path / "access.log"
    write_log(log)
    assert jobs_for(str(log), policies, 2) == 2
    one = replay_file(str(log), policies, jobs=1, skip_bad=True, top=100)
    two = replay_file(str(log), policies, jobs=2, skip_bad=True, top=100)
    same(one, two)
    # The log exercises what the split must keep: offenders, peaks, late lines, bad lines,
    # lines without a request, and (under user keys) anonymous requests.
    assert one.out_of_order > 0 and one.bad_lines > 0 and one.no_request > 0
    for policy in one.policies:
        assert policy.peak_minute > 0
    assert len(one.policies[0].offenders) >= 3
    if policies[0].key_spec.kind == "user":
        assert all(p.unidentified > 0 for p in one.policies)
    # Each process decided a share of the clients (the split is real), and together all.
    shares = [
        Replayer(policies, shard=(k, 2)).run(log.read_text().splitlines(True), skip_bad=True)
        for k in range(2)
    ]
    matched = [sum(t.slots[0].per_sec.values()) for t in shares]
    assert min(matched) > 0.2 * sum(matched) and sum(matched) == one.policies[0].matched
    three = replay_file(str(log), policies, jobs=3, skip_bad=True, top=2)
    same(dataclasses.replace(one, policies=tuple(
        dataclasses.replace(p, offenders=p.offenders[:2]) for p in one.policies)), three)


def test_a_malformed_line_stops_a_split_replay_with_its_line_number(tmp_path):
    from ratelimits.ops.replay import LogError

    log = tmp_path / "access.log"
    write_log(log)
    bad = next(i for i, text in enumerate(log.read_text().splitlines(), 1)
               if text.startswith("garbage"))
    with pytest.raises(LogError, match=rf"access\.log:{bad}: not a combined-log line"):
        replay_file(str(log), [compiled("per-ip", "ip")], jobs=2)


def test_what_ties_clients_together_is_never_split(tmp_path):
    log = tmp_path / "access.log"
    write_log(log)
    path = str(log)
    per_ip = compiled("per-ip", "ip")
    assert jobs_for(path, [per_ip], 2) == 2
    assert jobs_for(path, [per_ip, compiled("site", "global")], 2) == 1
    assert jobs_for(path, [per_ip, compiled("per-user", "user")], 2) == 1  # a user's IPs
    assert jobs_for(path, [compiled("per-key", "query:k")], 2) == 1
    assert jobs_for("-", [per_ip], 2) == 1
    # Unless asked, a small file is replayed in one process.
    assert jobs_for(path, [per_ip]) == 1
    # A policy that is not replayed does not prevent a split.
    assert jobs_for(path, [per_ip, compiled("api", "header:X-Key")], 2) == 2
    with pytest.raises(ValueError, match="jobs must be 1 or more"):
        jobs_for(path, [per_ip], 0)
