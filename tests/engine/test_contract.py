"""The Lua contract, written once: generated constants and one argument encoder."""

from __future__ import annotations

import re

import pytest

from ratelimits.engine import Limit, RedisEngine, constants, contract, scripts
from ratelimits.engine.contract import HEAD_ARGS, LIMIT_ARGS, LUA_CONSTANTS, encode
from ratelimits.engine.keynames import base_key, cell, client_key
from ratelimits.engine.types import RESERVE
from tests.engine.conftest import T0


def test_the_script_carries_the_python_constants_once():
    source = scripts.batch_source()
    assert LUA_CONSTANTS["STATS_TTL"] == constants.STATS_TTL == 25 * 3600
    assert LUA_CONSTANTS["OFFENDERS"] == constants.OFFENDERS_CAP
    for name, value in LUA_CONSTANTS.items():
        # declared once, with the Python value: no Lua file mirrors it by hand
        assert re.findall(rf"^local {name} = (.*)$", source, re.M) == [repr(value)], name
    for i, field in enumerate(LIMIT_ARGS, 1):
        assert f"local ARG_{field.upper()} = {i}\n" in source


def test_the_script_obeys_a_changed_constant(redis_client, monkeypatch):
    """The offenders cap reaches Redis from Python: shrink it and the list shrinks."""
    monkeypatch.setitem(contract.LUA_CONSTANTS, "OFFENDERS", 3)
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
    assert keys == [base_key("rl:", lim) for lim in limits]
    assert len(args) == len(HEAD_ARGS) + len(LIMIT_ARGS) * len(limits)
    head = dict(zip(HEAD_ARGS, args, strict=False))
    assert head == {"now_us": 1_800_000_000_000_000, "token": token, "version_key": "v",
                    "stats_prefix": "rl:s:"}
    assert token  # sliding_log names its members after the request's token
    per = len(LIMIT_ARGS)
    second = dict(zip(LIMIT_ARGS, args[len(HEAD_ARGS) + per:len(HEAD_ARGS) + 2 * per],
                      strict=True))
    assert second == {"algorithm": "leaky_bucket", "limit": 9, "period_us": 1_500_000,
                      "burst": 0, "cost": 1, "shadow": 1, "warmup_us": 0,
                      "wait_us": 250_000, "field": "", "lockout_us": 0, "stage": 0,
                      "cal0": 0, "cal1": 0, "cal2": 0}
    third = dict(zip(LIMIT_ARGS, args[len(HEAD_ARGS) + 2 * per:], strict=True))
    # T0 is 2027-01-15 08:00 UTC, 17:00 in Tokyo (UTC+9, no daylight saving): the day
    # began at 15:00 UTC the day before, and the next one ends a day after it
    day = 86_400 * 1_000_000
    tokyo_midnight = (T0 // 86_400 * 86_400 - 9 * 3600) * 1_000_000
    assert (third["cal0"], third["cal1"], third["cal2"]) == (
        tokyo_midnight, tokyo_midnight + day, tokyo_midnight + 2 * day)
    assert (third["lockout_us"], third["stage"], third["field"]) == (90_000_000, RESERVE,
                                                                     cell("rl:", limits[2])[1])


def test_a_window_limit_names_its_shard_and_its_field():
    """A window algorithm's clients share their policy's shard hashes: the key is the
    policy's and the shard's, the client a field; every other algorithm keys the client."""
    a, b = (Limit(f"10.0.0.{i}", "sliding_window", 5, 60, name="p") for i in (1, 2))
    keys, args, _ = encode([a, b], prefix="rl:", now=T0, stats=False)
    fields = [args[len(HEAD_ARGS) + i * len(LIMIT_ARGS) + LIMIT_ARGS.index("field")]
              for i in (0, 1)]
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
    assert token is None and args[:4] == ["", "", "", ""]


def test_a_malformed_reply_is_an_engine_error():
    with pytest.raises(ValueError, match="unexpected reply"):
        contract.decode([Limit("c", "gcra", 5, 60)], [0, 1, 0], versioned=False, token=None)
