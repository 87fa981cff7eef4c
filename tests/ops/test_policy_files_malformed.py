"""`ratelimits import` of malformed files: each is refused with the policy and the field
to fix, and nothing is written; never a traceback, never an odd value taken silently."""

from __future__ import annotations

import io
import json
import sys

import pytest
from django.core.management import CommandError, call_command

from ratelimits.models import Override, Policy
from ratelimits.ops.policy_files import MAX_BYTES, export_policies

pytestmark = pytest.mark.django_db

HEAD = '{"format": "ratelimits.policies", "version": 1, "policies": %s}'


def policies(text: str) -> bytes:
    return (HEAD % text).encode()


def one(**fields) -> bytes:
    """A file of one policy, "p", with `fields` (an override's given as `overrides`)."""
    return policies(json.dumps([{"name": "p", "limit": 5, **fields}]))


@pytest.fixture
def before(make_policy):
    """Two policies, one with an override: what every refused file must leave as it is."""
    make_policy(name="a", limit=5)
    b = make_policy(name="b", algorithm="token_bucket", limit=10, burst=5)
    Override.objects.create(policy=b, match="ip:192.0.2.1", limit=20)
    return export_policies()


def refused(tmp_path, raw: bytes, before) -> str:
    file = tmp_path / "policies.json"
    file.write_bytes(raw)
    with pytest.raises(CommandError) as info:
        call_command("ratelimits", "import", str(file), stdout=io.StringIO())
    message = str(info.value)
    assert message.startswith(f"{file} is refused, nothing was changed:\n"), message
    assert export_policies() == before
    return message.split("\n", 1)[1]


# Each crashed with a traceback before (the exception in the comment).
CRASHED = [
    # UnicodeDecodeError
    (b'{"format": "ratelimits.policies", "version": 1, "policies": [{"name": "p\xff"}]}',
     "not UTF-8: byte 0xff on line 1 is not a character in UTF-8"),
    ("\n".join(["{", '"format": "ratelimits.policies",', '"version": 1,',
                '"policies": [{"name": "p", "limit": 5, "description": "caf\xe9"}]}'])
     .encode("latin-1"), "not UTF-8: byte 0xe9 on line 4"),
    ((HEAD % "[]").encode("utf-16"), "not UTF-8: byte 0xff on line 1"),
    # RecursionError
    (b"[" * 100_000 + b"]" * 100_000, "not a policy file: its values are nested too deeply"),
    (one(description=[]).replace(b"[]", b"[" * 100_000 + b"]" * 100_000),
     "its values are nested too deeply"),
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    (policies('[{"name": "p", "limit": %s}]' % ("9" * 5000)),
     "not JSON this command reads: Exceeds the limit (4300 digits)"),
    # TypeError: '<' not supported between instances of 'int' and 'str' (in clean())
    (one(limit="five"), "policy 1 'p': limit: \"five\" is not a whole number"),
    (one(period=[60]), "policy 1 'p': period: [60] is not a whole number"),
    (one(cost={}), "policy 1 'p': cost: {} is not a whole number"),
    (one(max_wait="1"), "policy 1 'p': max_wait: \"1\" is not a number"),
    # TypeError: unhashable type: 'list'
    (one(algorithm=["gcra"]), "policy 1 'p': algorithm: [\"gcra\"] is not a string"),
    # IntegrityError: NOT NULL constraint failed
    (one(description=None), "policy 1 'p': description: null is not allowed; give a string"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "note": None}]),
     "policy 1 'p' override 1 'ip:192.0.2.9': note: null is not allowed; give a string"),
    # UnicodeEncodeError: surrogates not allowed (at save)
    (policies('[{"name": "p", "limit": 5, "description": "\\ud800"}]'),
     "policy 1 'p': description: \"\\ud800\" holds a lone surrogate"),
    # ValueError: day is out of range for month; TypeError: fromisoformat: argument must be str
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "expires": "2031-02-30T10:00:00"}]),
     "policy 1 'p' override 1 'ip:192.0.2.9': expires: \"2031-02-30T10:00:00\" is not a date "
     "and time with its UTC offset"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "expires": 1900000000}]),
     "override 1 'ip:192.0.2.9': expires: 1900000000 is not a date and time"),
    # ValidationError (uncaught) for an empty expiry; ValueError for an empty limit
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "expires": ""}]),
     "override 1 'ip:192.0.2.9': expires: \"\" is not a date and time"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": ""}]),
     "override 1 'ip:192.0.2.9': limit: \"\" is not a whole number"),
]

# Each was accepted before, quietly converted, dropped or kept.
ACCEPTED = [
    (one(limit="5"), "policy 1 'p': limit: \"5\" is not a whole number"),
    (one(limit=True), "policy 1 'p': limit: true is not a whole number"),
    (one(limit=5.5), "policy 1 'p': limit: 5.5 is not a whole number"),  # was 5
    (policies('[{"name": "p", "limit": 1e3}]'), "policy 1 'p': limit: 1000.0 is not a whole"),
    (one(rollout="50"), "policy 1 'p': rollout: \"50\" is not a whole number"),
    (one(priority=False), "policy 1 'p': priority: false is not a whole number"),
    (one(declared=0), "policy 1 'p': declared: 0 is not true or false"),
    (one(description=["a"]), "policy 1 'p': description: [\"a\"] is not a string"),  # "['a']"
    (one(scope=5), "policy 1 'p': scope: 5 is not a string"),
    (one(methods=None), "policy 1 'p': methods: null is not allowed; give a string"),
    (one(path=None), "policy 1 'p': path: null is not allowed; give a string"),
    (one(description="a\x00b"), "policy 1 'p': description: \"a\\u0000b\" holds a NUL"),
    (one(overrides=[{"match": "ip:192.0.2.9", "exempt": 1}]),
     "override 1 'ip:192.0.2.9': exempt: 1 is not true or false"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": "7"}]),
     "override 1 'ip:192.0.2.9': limit: \"7\" is not a whole number"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "note": 42}]),
     "override 1 'ip:192.0.2.9': note: 42 is not a string"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "expires": "2031-05-04T18:30"}]),
     "override 1 'ip:192.0.2.9': expires: \"2031-05-04T18:30\" has no UTC offset"),
    # the last of two keys won, silently
    (policies('[{"name": "p", "limit": 5, "limit": 500}]'),
     "policy 1 'p': limit given twice; give each key once"),
    (policies('[{"name": "p", "limit": 5, "overrides": [{"match": "ip:192.0.2.9", "limit": 1,'
              ' "exempt": false, "limit": 9}]}]'),
     "policy 1 'p' override 1 'ip:192.0.2.9': limit given twice"),
    (b'{"format": "ratelimits.policies", "version": 1, "policies": [{"name": "p", "limit": 5}],'
     b' "policies": []}', "the file: policies given twice"),
    # a key that is not the file's, a version that is only equal to 1
    (b'{"format": "ratelimits.policies", "version": 1, "policies": [], "polices": []}',
     "unknown key(s) polices at the top of the file; it has format, version, policies"),
    (b'{"format": "ratelimits.policies", "version": true, "policies": []}',
     "version true is not one this release reads (1)"),
    (b'{"format": "ratelimits.policies", "version": 1.0, "policies": []}', "version 1.0 is"),
    # NaN and Infinity are not JSON (and a max wait of NaN got as far as the engine)
    (policies('[{"name": "p", "limit": 5, "algorithm": "gcra", "max_wait": NaN}]'),
     "not JSON: NaN is not a JSON number; give a number"),
    (policies('[{"name": "p", "limit": 5, "algorithm": "gcra", "max_wait": 1e400}]'),
     "policy 1 'p': max_wait: Infinity is not a number"),
]

# Refused before, and still: the message says what and where.
SHAPES = [
    (b"", "not JSON: Expecting value: line 1 column 1 (char 0)"),
    (b"[]", 'not a policy file: expected an object with "format"'),
    (b'{"format": "ratelimits.policies", "version": 1, "policies": {}}',
     '"policies" must be a list, not {}'),
    (policies("[null, 5]"), 'policy 1: must be an object with a "name" (a string), not null'),
    (one(name=7), 'policy 1: must be an object with a "name" (a string), not {"name": 7'),
    (one(name="x" * 5000), "policy 1 'xxxx"),
    (one(overrides={"match": "ip:192.0.2.9"}),
     "policy 1 'p': overrides must be a list of objects, not {\"match\": \"ip:192.0.2.9\"}"),
    (one(overrides=["ip:192.0.2.9"]),
     "policy 1 'p' override 1: must be an object with a \"match\" (a string), not \"ip:"),
    (one(overrides=[{"limit": 5}]), 'override 1: must be an object with a "match" (a string)'),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "policy": 1}]),
     "override 1 'ip:192.0.2.9': unknown field(s) policy; the fields are match, exempt,"),
    (one(colour={"deep": [[{"er": None}]]}), "policy 1 'p': unknown field(s) colour"),
    (one(limit=10**30), "policy 1 'p': limit: Ensure this value is less than or equal to"),
    (one(note="x" * 100_000), "policy 1 'p': unknown field(s) note"),
    (one(overrides=[{"match": "ip:192.0.2.9", "limit": 5, "note": "x" * 100_000}]),
     "note: Ensure this value has at most 255 characters (it has 100000)."),
]


@pytest.mark.parametrize(("raw", "says"), CRASHED + ACCEPTED + SHAPES)
def test_a_malformed_file_is_refused_naming_where_and_nothing_is_written(
    tmp_path, before, raw, says
):
    assert says in refused(tmp_path, raw, before)


def test_a_message_quotes_a_long_value_cut_short(tmp_path, before):
    message = refused(tmp_path, one(limit="9" * 100_000), before)
    assert message == f"policy 1 'p': limit: \"{'9' * 56}... is not a whole number"


def test_every_problem_of_the_file_is_listed_at_once(tmp_path, before):
    raw = policies(json.dumps([
        {"name": "a", "limit": "5"},
        {"name": "b", "limit": 10, "overrides": [{"match": "ip:192.0.2.1", "limit": True}]},
        {"name": "c", "limit": 5, "mode": None, "cost": 1.5},
    ]))
    assert refused(tmp_path, raw, before).splitlines() == [
        "policy 1 'a': limit: \"5\" is not a whole number",
        "policy 2 'b' override 1 'ip:192.0.2.1': limit: true is not a whole number",
        "policy 3 'c': mode: null is not allowed; give a string",
        "policy 3 'c': cost: 1.5 is not a whole number",
    ]


def test_a_file_past_the_limit_is_refused_without_being_parsed(tmp_path, before):
    raw = one(description="x" * (50 * 2**20))  # 50 MB
    assert len(raw) > MAX_BYTES
    assert refused(tmp_path, raw, before) == (
        "larger than 32 MB, which no export of policies reaches: is it the file "
        "`ratelimits export` wrote?")


def test_a_byte_order_mark_is_read_as_utf8(tmp_path, make_policy):
    file = tmp_path / "policies.json"
    file.write_bytes(b"\xef\xbb\xbf" + one(description="caf\u00e9"))
    call_command("ratelimits", "import", str(file), stdout=io.StringIO())
    assert export_policies()["policies"][0]["description"] == "caf\u00e9"


def test_standard_input_that_is_not_utf8_is_refused(monkeypatch, before):
    stdin = io.TextIOWrapper(io.BytesIO(b'{"format": "ratelimits.policies\xff"}'))
    monkeypatch.setattr(sys, "stdin", stdin)
    with pytest.raises(CommandError, match="not UTF-8: byte 0xff on line 1"):
        call_command("ratelimits", "import", "-", stdout=io.StringIO())
    assert export_policies() == before


def test_kept_overrides_that_no_longer_fit_the_changed_policy_are_refused(tmp_path, before):
    """A file that changes b's key and gives no "overrides" keeps b's override: it must
    still fit (ip:… on a policy that now counts users does not)."""
    content = json.loads(json.dumps(before))
    del content["policies"][1]["overrides"]
    content["policies"][1]["key"] = "user"
    message = refused(tmp_path, json.dumps(content).encode(), before)
    assert message.startswith(
        "policy 2 'b': its override 'ip:192.0.2.1', kept as the file gives no \"overrides\", "
        "does not fit the policy as changed: match: This policy counts by user")
    content["policies"][1].update(algorithm="adaptive", key="global", burst=None)
    assert "An adaptive policy learns one limit per process" in refused(
        tmp_path, json.dumps(content).encode(), before)


def test_a_policy_created_between_plan_and_write_refuses_the_whole_import(before):
    """The plan is made against the database as it was; a policy someone saved meanwhile
    under a name the file creates makes the write fail: refused, nothing written."""
    from ratelimits.ops.policy_files import PolicyFileError, apply, plan_import, read

    content = json.loads(json.dumps(before))
    content["policies"][0]["limit"] = 6
    content["policies"].append({"name": "new", "limit": 5})
    changes = plan_import(read(json.dumps(content)))
    meanwhile = Policy.objects.create(name="new", limit=7, key="ip", path="*")
    with pytest.raises(PolicyFileError, match="the database refused a change"):
        apply(changes)
    meanwhile.delete()
    assert export_policies() == before
