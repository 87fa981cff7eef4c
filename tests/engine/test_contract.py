"""The Lua contract, written once: generated constants and one argument encoder."""

from __future__ import annotations

import re
import time

import pytest

from ratelimits.engine import Limit, MemoryEngine, RedisEngine, constants, contract, layout, scripts
from ratelimits.engine.contract import encode
from ratelimits.engine.keynames import base_key, cell, client_key, clock_of, lock_key
from ratelimits.engine.layout import LIMIT_SPEC, LUA_CONSTANTS, PLAN_FLAGS
from ratelimits.engine.types import RESERVE
from tests.engine.conftest import T0


def test_the_script_carries_the_python_constants_once():
    source = scripts.batch_source()
    assert LUA_CONSTANTS["STATS_TTL"] == constants.STATS_TTL == 25 * 3600
    assert LUA_CONSTANTS["OFFENDERS"] == constants.OFFENDERS_CAP
    for name, value in LUA_CONSTANTS.items():
        # declared once, with the Python value: no Lua file mirrors it by hand
        assert re.findall(rf"^local {name} = (.*)$", source, re.M) == [repr(value)], name
    for i, field in enumerate(LIMIT_SPEC, 3):  # after the spec's start and end
        assert f"local SPEC_{field.upper()} = {i}\n" in source


def parsed(args: list) -> tuple[dict, list[dict], list]:
    """A batch call's ARGV read as the contract lays it out: the plan's head, its limits'
    specs, and the values after the plan."""
    plan, rest = args[0].encode(), args[1:]  # Lua counts a text's length in bytes
    flags = dict(zip(PLAN_FLAGS, (c == ord("1") for c in plan[:len(PLAN_FLAGS)]), strict=True))
    at, texts = len(PLAN_FLAGS), []
    for _ in range(2):
        colon = plan.index(b":", at)
        size = int(plan[at:colon])
        texts.append(plan[colon + 1:colon + 1 + size].decode())
        at = colon + 1 + size
    values = plan[at:].decode().split("|")[1:]
    per = len(LIMIT_SPEC)
    specs = [dict(zip(LIMIT_SPEC, values[i:i + per], strict=True))
             for i in range(0, len(values), per)]
    return {**flags, "version_key": texts[0], "stats_prefix": texts[1]}, specs, rest


def test_the_script_obeys_a_changed_constant(redis_client, monkeypatch):
    """The offenders cap reaches Redis from Python: shrink it and the list shrinks."""
    monkeypatch.setitem(layout.LUA_CONSTANTS, "OFFENDERS", 3)
    scripts.batch_source.cache_clear()
    scripts.batch_library.cache_clear()
    scripts.offend_source.cache_clear()  # the offenders' script, sent with the counts
    try:
        engine = RedisEngine(redis_client)
        for i in range(6):
            limit = Limit(f"c{i}", "fixed_window", 1, 60, name="p")
            engine.evaluate([limit], now=T0)
            engine.evaluate([limit], now=T0)
        assert len(engine.offenders("p", int(T0 // 3600), n=50)) == 3
    finally:
        scripts.batch_source.cache_clear()
        scripts.batch_library.cache_clear()
        scripts.offend_source.cache_clear()


def test_encode_puts_each_value_where_its_name_says():
    limits = [
        Limit("10.0.0.1", "sliding_log", 5, 60, cost=2, name="a"),
        Limit("x" * 500, "leaky_bucket", 9, 1.5, shadow=True, name="b", max_wait=0.25),
        Limit("u", "fixed_window", 100, 86_400, name="c", lockout=90, stage=RESERVE,
              calendar="day", zone="Asia/Tokyo"),
    ]
    keys, args, token = encode(limits, prefix="rl:", now=T0, version_key="v", stats=True)
    # the base keys, then every other key the script may touch: the calendar window's
    # hash (the day holding T0 in Tokyo, by its start in seconds), its lockout, the version
    key, field = cell("rl:", limits[2])
    tokyo_midnight_s = T0 // 86_400 * 86_400 - 9 * 3600
    assert keys == [*(base_key("rl:", lim) for lim in limits),
                    f"{key}:{tokyo_midnight_s:.0f}", lock_key(key, field), "v"]
    head, specs, rest = parsed(args)
    assert head == {"has_now": True, "has_token": True, "version_key": "v",
                    "stats_prefix": "rl:s:"}
    assert token  # sliding_log names its members after the request's token
    # the call's own values: its time, its token, the window limit's field
    assert rest == [1_800_000_000_000_000, token, cell("rl:", limits[2])[1]]
    assert len(specs) == len(limits)
    assert specs[1] == {"algorithm": "leaky_bucket", "limit": "9", "period_us": "1500000",
                        "burst": "0", "cost": "1", "shadow": "1", "warmup_us": "0",
                        "wait_us": "250000", "lockout_us": "0", "stage": "0",
                        "cal0": "0", "cal1": "0", "cal2": "0"}
    third = specs[2]
    # T0 is 2027-01-15 08:00 UTC, 17:00 in Tokyo (UTC+9, no daylight saving): the day
    # began at 15:00 UTC the day before, and the next one ends a day after it
    day = 86_400 * 1_000_000
    tokyo_midnight = (T0 // 86_400 * 86_400 - 9 * 3600) * 1_000_000
    assert (int(third["cal0"]), int(third["cal1"]), int(third["cal2"])) == (
        tokyo_midnight, tokyo_midnight + day, tokyo_midnight + 2 * day)
    assert (third["lockout_us"], third["stage"]) == ("90000000", str(RESERVE))


def test_a_plan_repeats_from_call_to_call():
    """All that changes between two calls of the same policies is after the plan: the
    script parses a plan once (see lua/check_all.lua)."""
    a, b = Limit("10.0.0.1", "gcra", 5, 60, name="p"), Limit("10.0.0.2", "gcra", 5, 60, name="p")
    first, second = (encode([lim], prefix="rl:", version_key="v")[1] for lim in (a, b))
    assert first == second == [first[0]]  # no time, no token, no field: the plan alone
    _, args, _ = encode([a], prefix="rl:", now=T0, version_key="v")
    assert args[0] != first[0] and args[1:] == [1_800_000_000_000_000]
    # a key name of any text: the plan gives each its length
    _, odd, _ = encode([a], prefix="r|1:é", version_key="v|:x", stats=True)
    assert parsed(odd)[0] == {"has_now": False, "has_token": False, "version_key": "v|:x",
                              "stats_prefix": "r|1:és:"}


def test_a_window_limit_names_its_shard_and_its_field():
    """A window algorithm's clients share their policy's shard hashes: the key is the
    policy's and the shard's, the client a field; every other algorithm keys the client."""
    a, b = (Limit(f"10.0.0.{i}", "sliding_window", 5, 60, name="p") for i in (1, 2))
    keys, args, _ = encode([a, b], prefix="rl:", now=T0, stats=False)
    keys = keys[:2]  # the base keys, before their window hashes
    fields = parsed(args)[2][1:]  # after the call's time
    assert [(k, f) for k, f in zip(keys, fields, strict=True)] == [cell("rl:", a),
                                                                   cell("rl:", b)]
    assert fields[0] != fields[1] and all(len(f) == 11 for f in fields)
    tag = re.compile(r"rl:\{([A-Za-z0-9_-]{8})([0-9a-f]{3})\}:sw")
    shards = [tag.fullmatch(k) for k in keys]
    assert all(shards) and shards[0][1] == shards[1][1]  # one policy: one tag
    other = Limit("10.0.0.1", "sliding_window", 5, 60, name="q")
    assert tag.fullmatch(base_key("rl:", other))[1] != shards[0][1]
    assert client_key("rl:", a) != client_key("rl:", b)  # the in-process engine's keys
    assert cell("rl:", Limit("10.0.0.1", "gcra", 5, 60, name="p"))[1] == ""


@pytest.mark.parametrize(("limit", "stored", "own"), [
    (Limit("203.0.113.7", "fixed_window", 5, 60, name="login"),
     ("rl:{1Fbyb-ZBb2b}:fw", "PIepK6bekdA"), "rl:{Oys8h6krpt6R0Llh}:fw"),
    (Limit("user:42", "gcra", 5, 60, name="api"),
     ("rl:{MkFTe6Asasel60bp}:g", ""), "rl:{MkFTe6Asasel60bp}:g"),
    (Limit("10.0.0.1", "sliding_window", 5, 60, name="dr:bench:1000-60s"),
     ("rl:{WuX_EMA_129}:sw", "TXMoWVjP_pw"), "rl:{4SlNcyhZWM_-nNE2}:sw"),
])
def test_a_client_is_stored_under_the_names_earlier_releases_gave_it(limit, stored, own):
    """Processes of two releases share the store during a deploy, and counts outlive a
    restart: how a client is named in the store never changes."""
    assert cell("rl:", limit) == stored
    assert client_key("rl:", limit) == own


def test_a_window_hash_is_stored_under_the_name_earlier_releases_gave_it(redis_client):
    """The window number ends the hash's name as earlier releases wrote it, for a period's
    window and for a calendar day's (its start in seconds): a deploy keeps every count."""
    engine = RedisEngine(redis_client)
    engine.evaluate([Limit("203.0.113.7", "fixed_window", 5, 60, name="login")], now=T0)
    engine.evaluate([Limit("10.0.0.1", "sliding_window", 5, 60, name="api")], now=T0)
    engine.evaluate([Limit("10.0.0.1", "fixed_window", 5, 86_400, name="daily",
                           calendar="day", zone="Europe/Paris")], now=T0)
    stored = {k.decode(): redis_client.hgetall(k) for k in redis_client.keys("rl:{*}:*:*")}
    assert stored == {
        "rl:{1Fbyb-ZBb2b}:fw:30000000": {b"PIepK6bekdA": b"1"},
        "rl:{d86JQCVXd49}:sw:30000000": {b"v99yi0iU3r4": b"1"},
        "rl:{n2ZiehQh050}:fw:1799967600": {b"LJ4aJSq9-RM": b"1"},
    }


def test_no_token_is_drawn_when_no_limit_names_members():
    _, args, token = encode([Limit("c", "gcra", 5, 60)], prefix="rl:", stats=False)
    head, _, rest = parsed(args)
    assert token is None and not head["has_token"] and rest == []


def test_a_malformed_reply_is_an_engine_error():
    with pytest.raises(ValueError, match="unexpected reply"):
        contract.decode([Limit("c", "gcra", 5, 60)], [0, 1, 0], versioned=False, token=None)


def test_key_names_of_any_text_reach_the_script(redis_client):
    """The version key and the prefix travel inside the plan, each after its length: a
    name holding the plan's separators, or letters of several bytes, is read whole."""
    engine = RedisEngine(redis_client, prefix="r|1:é", version_key="v|:é")
    version = engine.bump_version()
    limits = [Limit("10.0.0.1", "fixed_window", 2, 60, name="p"),
              Limit("10.0.0.1", "gcra", 5, 60, name="q")]
    decisions = [engine.evaluate(limits, now=T0 + i) for i in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert {d.version for d in decisions} == {version}
    assert redis_client.get("v|:é") == str(version).encode()
    assert all(k.decode().startswith("r|1:é") for k in redis_client.keys("r|1:*"))


def test_plans_past_those_the_library_keeps_are_parsed_again(redis_client, monkeypatch):
    """The library keeps PLANS_KEPT parsed plans, then starts afresh: a plan it dropped
    is parsed again, and every call decides as the in-process engine does."""
    monkeypatch.setitem(layout.LUA_CONSTANTS, "PLANS_KEPT", 2)
    scripts.batch_source.cache_clear()
    scripts.batch_library.cache_clear()
    try:
        engine, twin = RedisEngine(redis_client), MemoryEngine()
        policies = [[Limit("10.0.0.1", "fixed_window", 3 + i, 60, name=f"p{i}"),
                     Limit("10.0.0.1", "gcra", 2 + i, 60, name=f"q{i}", shadow=i == 1)]
                    for i in range(5)]
        for step in range(4):
            for limits in policies:
                at = T0 + step
                got, want = engine.evaluate(limits, now=at), twin.evaluate(limits, now=at)
                assert got.results == want.results, (step, limits[0].name)
    finally:
        scripts.batch_source.cache_clear()
        scripts.batch_library.cache_clear()


def test_a_call_declares_every_window_it_may_read():
    """Given the time, a call declares the windows its script reads at it: a sliding
    window's current and previous one. Without it, the script reads the store's clock,
    which may sit across a window's edge from this one: the windows a period either side
    are declared too, so a strict server runs the call whichever it is."""
    limit = Limit("c", "sliding_window", 5, 10, name="p")
    key = base_key("rl:", limit)
    win = int(T0 // 10)
    keys, _, _ = encode([limit], prefix="rl:", now=T0 + 5)
    assert keys == [key, f"{key}:{win - 1}", f"{key}:{win}"]
    fixed = Limit("c", "fixed_window", 5, 10, name="p")
    keys, _, _ = encode([fixed], prefix="rl:", now=T0 + 5)
    assert keys[1:] == [f"{base_key('rl:', fixed)}:{win}"]
    before = int(time.time() // 10)
    keys, _, _ = encode([limit], prefix="rl:")
    if int(time.time() // 10) == before:  # (else the clock crossed an edge meanwhile)
        assert keys == [key, *(f"{key}:{w}" for w in range(before - 2, before + 2))]


def test_the_clock_setting_sends_this_process_time():
    assert clock_of("store")(None) is None and clock_of("store")(5.0) == 5.0
    before = time.time()
    sent = clock_of("client")(None)
    assert sent is not None and before <= sent <= time.time()
    assert clock_of("client")(5.0) == 5.0  # a caller's own time is kept
    with pytest.raises(ValueError, match="clock must be one of 'store', 'client'"):
        clock_of("server")
