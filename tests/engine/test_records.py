"""`quick_init`: the same frozen dataclass, built faster."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from ratelimits.engine.records import quick_init
from ratelimits.engine.types import Decision, Limit, Result
from ratelimits.pipeline.plan import Planned
from ratelimits.pipeline.state import Context
from ratelimits.pipeline.verdict import PolicyOutcome, Verdict


def _sample(decorate):
    @dataclasses.dataclass(frozen=True, slots=True)
    class Sample:
        name: str
        count: int = 3
        tags: list[str] = dataclasses.field(default_factory=list)
        kept: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
        label: str = dataclasses.field(default="", init=False)
        doubled: int = dataclasses.field(init=False)

        def __post_init__(self) -> None:
            if self.count < 0:
                raise ValueError("count must not be negative")
            object.__setattr__(self, "doubled", 2 * self.count)

    return decorate(Sample)


Plain, Quick = _sample(lambda cls: cls), _sample(quick_init)
CALLS = [
    (("a",), {}),
    (("a", 5), {}),
    (("a", 5, ["x"]), {}),
    (("a",), {"tags": ["y"]}),
    ((), {"name": "b", "count": 0}),
]


def values(obj):
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_it_builds_what_the_dataclass_init_builds(args, kwargs):
    assert values(Quick(*args, **kwargs)) == values(Plain(*args, **kwargs))


def test_defaults_from_a_factory_are_new_for_each_object():
    first, second = Quick("a"), Quick("b")
    assert first.tags == [] and first.tags is not second.tags
    assert first.kept == {} and first.kept is not second.kept


@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {}),  # a field without a default
    (("a", 1, [], "extra"), {}),  # too many
    (("a",), {"name": "b"}),  # twice
    (("a",), {"label": "x"}),  # not an argument of __init__
])
def test_wrong_arguments_fail_as_they_do_without_it(args, kwargs):
    with pytest.raises(TypeError):
        Plain(*args, **kwargs)
    with pytest.raises(TypeError):
        Quick(*args, **kwargs)


def test_post_init_runs_and_the_object_stays_frozen():
    with pytest.raises(ValueError, match="negative"):
        Quick("a", -1)
    obj = Quick("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.count = 4  # type: ignore[misc]
    assert obj == Quick("a") and obj != Quick("b")


def test_the_signature_is_the_dataclass_one():
    assert inspect.signature(Quick) == inspect.signature(Plain)
    assert Quick.__init__.__qualname__.endswith("Sample.__init__")


def test_only_a_frozen_slots_dataclass_with_plain_fields_is_taken():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        x: int
        y: dataclasses.InitVar[int] = 0

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        x: int

    for cls in (NoSlots, NotFrozen, WithInitVar, KeywordOnly):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


@pytest.mark.parametrize("cls", [Limit, Result, Decision, Context, Planned, PolicyOutcome,
                                 Verdict])
def test_the_values_built_per_request_use_it(cls):
    assert cls.__init__.__code__.co_filename == "<string>"
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_a_limit_is_still_checked_when_built():
    with pytest.raises(ValueError):
        Limit("k", "no_such_algorithm", 1, 1)
    assert Limit("k", "fixed_window", 5, 60) == Limit(key="k", algorithm="fixed_window",
                                                      limit=5, period=60)
