"""Frozen dataclasses that are cheap to build: the values made for every request.

`dataclass(frozen=True)` forbids `self.x = ...`, so the `__init__` it writes sets each
field with `object.__setattr__`, about twice as slow as a plain assignment. A request
builds several such values (its context, its planned limits, the store's results, its
verdict). `quick_init` gives a frozen slots dataclass an `__init__` that writes each
slot through the slot's own descriptor instead: the same signature, defaults and
`__post_init__`, the same object, and still frozen afterwards.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")

_MISSING = dataclasses.MISSING


def quick_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of `cls`, a `dataclass(frozen=True, slots=True)`, with
    one that writes its slots directly (apply it above the `dataclass` decorator)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen slots dataclass")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    written = list(inspect.signature(cls.__init__).parameters)[1:]
    if written != [f.name for f in fields if f.init] or any(f.kw_only for f in fields):
        raise TypeError(f"quick_init: {cls.__name__} takes arguments other than its "
                        "fields, in order (an InitVar, a keyword-only field)")
    namespace: dict[str, Any] = {"MISSING": _MISSING}
    signature, body = [], []
    for f in fields:
        namespace[f"set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.init:
            value = f.name
            if f.default is not _MISSING:
                namespace[f"default_{f.name}"] = f.default
                signature.append(f"{f.name}=default_{f.name}")
            elif f.default_factory is not _MISSING:
                namespace[f"factory_{f.name}"] = f.default_factory
                signature.append(f"{f.name}=MISSING")
                body.append(f"if {f.name} is MISSING: {f.name} = factory_{f.name}()")
            else:
                signature.append(f.name)
        elif f.default is not _MISSING:
            namespace[f"default_{f.name}"] = f.default
            value = f"default_{f.name}"
        elif f.default_factory is not _MISSING:
            namespace[f"factory_{f.name}"] = f.default_factory
            value = f"factory_{f.name}()"
        else:
            continue  # set by __post_init__, as dataclass leaves it
        body.append(f"set_{f.name}(self, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    source = "def __init__(self, {}):\n    {}\n".format(
        ", ".join(signature), "\n    ".join(body or ["pass"]))
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    init.__signature__ = inspect.signature(cls.__init__)
    setattr(cls, "__init__", init)  # noqa: B010  (mypy forbids assigning a method)
    return cls
