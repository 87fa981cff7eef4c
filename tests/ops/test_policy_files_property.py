"""`ratelimits import` of any JSON document, or any bytes: it imports cleanly (and a
second import of it changes nothing), or it is refused with "nothing was changed" and the
database is as it was. Never another exception."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import models, transaction
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ratelimits.engine.registry import REGISTRY
from ratelimits.models import Override, Policy
from ratelimits.ops.policy_files import (
    FORMAT,
    VERSION,
    export_policies,
    exported_fields,
    plan_import,
    read,
)

pytestmark = pytest.mark.django_db

# derandomized: the same examples on every run, so the suite is never flaky; a search with
# a random seed and more examples is `--hypothesis-seed=N` with HYPOTHESIS_PROFILE unset.
FUZZ = hsettings(max_examples=400, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-3, 3)
           | st.floats() | st.text(max_size=12)
           | st.sampled_from(["", "5", "\x00", "\ud800", "2031-05-04T18:30:00+00:00", "x" * 300]))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                        max_leaves=8)

#: Valid values of the fields whose type alone says little, so that the search reaches
#: validation and writing; `ODD` holds wrong ones of the right type.
PLAUSIBLE = {
    "name": st.sampled_from(["a", "b", "code", "new", "new-2"]),
    "mode": st.sampled_from(["enforce", "shadow", "off"]),
    "algorithm": st.sampled_from(list(REGISTRY)),
    "key": st.sampled_from(["ip", "user", "global", "header:X-Api-Key"]),
    "path": st.sampled_from(["*", "/api/*/items/", "/login/", ""]),
    "methods": st.sampled_from(["", "GET", "post,put"]),
    "scope": st.sampled_from(["", "items"]),
    "counting": st.sampled_from(["shared", "per_process"]),
    "on_error": st.sampled_from(["allow", "deny", "local"]),
    "declared": st.just(False),
    "burst": st.sampled_from([None, None, None, 1, 10]),
    "floor": st.sampled_from([None, None, None, 2]),
    "batch": st.sampled_from([None, None, None, 2]),
    "warmup": st.sampled_from([0, 0, 0, 60]),
    "max_wait": st.sampled_from([0, 0, 0, 0.5, 1]),
    "rollout": st.integers(1, 100),
    "match": st.sampled_from(["ip:192.0.2.1", "ip:10.0.0.0/8", "user:42", "tier:gold",
                              " ip:192.0.2.1", "header:k"]),
    "exempt": st.just(False) | st.booleans(),
    "expires": st.sampled_from([None, "2031-05-04T18:30:00+00:00", "2001-01-01T00:00:00Z"]),
}
ODD = {
    "name": st.sampled_from(["bad name", "x" * 101, "a\n"]),
    "mode": st.just("on"),
    "algorithm": st.just("leaky"),
    "key": st.sampled_from(["tier", "ipx", "header:"]),
    "path": st.just("no-slash"),
    "methods": st.just("GE T"),
    "scope": st.just("bad scope"),
    "declared": st.just(True),
    "max_wait": st.sampled_from([-1, 60, 1e-300]),
    "expires": st.sampled_from(["2031-05-04T18:30", "2031-02-30T00:00:00Z", "soon"]),
}


def plausible(model: type, name: str) -> st.SearchStrategy:
    """A value a real file might give for `model`'s field `name`."""
    if name in PLAUSIBLE:
        return PLAUSIBLE[name]
    field = model._meta.get_field(name)
    if isinstance(field, models.IntegerField):
        number = st.integers(1, 120)
        return st.none() | number if field.null else number
    return st.text(max_size=8)


def clean(model: type, required: tuple[str, ...], **more: st.SearchStrategy) -> st.SearchStrategy:
    """An object with `required` and some of `model`'s other fields, each with a value a
    real file might give."""
    return st.fixed_dictionaries(
        {f: plausible(model, f) for f in required},
        optional={f: plausible(model, f) for f in exported_fields(model) if f not in required}
        | more)


def wild(model: type, **more: st.SearchStrategy) -> st.SearchStrategy:
    """An object with some of `model`'s fields and of `more`: plausible values, wrong ones
    of the right type, any JSON value."""
    return st.fixed_dictionaries({}, optional={
        f: plausible(model, f) | ODD.get(f, st.integers()) | anything
        for f in exported_fields(model)} | more)


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    return st.sampled_from([s for n, s in choices for _ in range(n)]).flatmap(lambda s: s)


override = clean(Override, ("match",))
policy = clean(Policy, ("name", "limit"), overrides=st.lists(override, max_size=3))
odd_policy = st.tuples(  # named mostly, to get past the file's shape to the fields
    weighted((4, PLAUSIBLE["name"]), (1, ODD["name"]), (1, anything)),
    wild(Policy, id=anything, overrides=st.lists(weighted(
        (2, override), (2, wild(Override, colour=anything)), (1, anything)), max_size=3)
        | anything),
).map(lambda named: {"name": named[0], **named[1]})
policies = st.lists(policy, max_size=4, unique_by=lambda p: p["name"])
document = weighted(
    (4, st.fixed_dictionaries({"format": st.just(FORMAT), "version": st.just(VERSION),
                               "policies": policies})),
    (4, st.fixed_dictionaries({"format": st.just(FORMAT), "version": st.just(VERSION),
                               "policies": st.tuples(policies, st.lists(odd_policy, max_size=2))
                               .map(lambda both: both[0] + both[1])})),
    (1, st.fixed_dictionaries({}, optional={
        "format": st.just(FORMAT) | anything, "version": st.just(VERSION) | anything,
        "policies": st.lists(policy | odd_policy | anything, max_size=3) | anything,
        "extra": anything})),
    (1, anything),
)


@pytest.fixture
def database(make_policy):
    """Policies of every kind a file meets: one of one's own with overrides, a bucket, and
    one declared in code."""
    a = make_policy(name="a", limit=5)
    Override.objects.create(policy=a, match="ip:192.0.2.1", limit=20)
    Override.objects.create(policy=a, match="ip:10.0.0.0/8", exempt=True)
    make_policy(name="b", algorithm="token_bucket", limit=10, burst=5, key="user")
    Policy.objects.create(name="code", mode="enforce", algorithm="fixed_window", limit=3,
                          period=60, key="ip", path="*", scope="code:code", declared=True)


def outcome(raw: bytes, tmp_path) -> str | None:
    """None when `raw` imports, else the refusal; any other exception fails the test."""
    file = tmp_path / "policies.json"
    file.write_bytes(raw)
    try:
        call_command("ratelimits", "import", str(file), stdout=io.StringIO())
    except CommandError as exc:
        return str(exc)
    return None


def check(raw: bytes, tmp_path) -> None:
    before = export_policies()
    with transaction.atomic():  # each example starts from the same database
        refusal = outcome(raw, tmp_path)
        if refusal is None:  # imported: a second import of it changes nothing
            again = plan_import(read(raw))
            assert {c.action for c in again} <= {"unchanged"}, [c.describe() for c in again]
        else:
            assert "is refused, nothing was changed:\n" in refusal, refusal
            assert export_policies() == before
        transaction.set_rollback(True)
    assert export_policies() == before


@FUZZ
@given(content=document)
@example(content={"format": FORMAT, "version": VERSION, "policies": [
    {"name": "a", "key": "user"}]})  # its kept overrides count by ip: refused
@example(content={"format": FORMAT, "version": VERSION, "policies": [
    {"name": "code", "declared": False, "limit": 99, "mode": "off"}]})
def test_any_json_document_imports_cleanly_or_is_refused_changing_nothing(
    database, tmp_path, content
):
    check(json.dumps(content).encode("utf-8", "surrogatepass"), tmp_path)


@FUZZ
@given(raw=st.binary(max_size=200) | st.builds(
    lambda text, cut: text[:cut], st.just(json.dumps({"format": FORMAT, "version": VERSION,
                                                      "policies": [{"name": "n", "limit": 5}]})
                                          .encode()), st.integers(0, 90)))
def test_any_bytes_import_cleanly_or_are_refused_changing_nothing(database, tmp_path, raw):
    check(raw, tmp_path)
