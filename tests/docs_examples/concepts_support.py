"""What the invisible blocks of docs/concepts/*.md use to run the pages' examples as the
reader would write them: a function shown as part of `myproject/...` importable by the
dotted path the page's settings give, and the limits a page declares in code forgotten at
its end.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from ratelimits.pipeline.declared import registry


@contextlib.contextmanager
def project_module(dotted: str, **attributes: Any) -> Iterator[types.ModuleType]:
    """A module importable as `dotted` (e.g. "myproject.plans") holding `attributes`, and
    its parent packages, while the block runs; gone afterwards."""
    parts = dotted.split(".")
    added: list[str] = []
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []  # a package, so the next part can be imported under it
            sys.modules[name] = module
            added.append(name)
    module = sys.modules[dotted]
    for key, value in attributes.items():
        setattr(module, key, value)
    try:
        yield module
    finally:
        for name in reversed(added):
            sys.modules.pop(name, None)


class Declarations:
    """The limits declared in code (`@ratelimit`) before a page's examples declare theirs:
    `restore()` forgets the page's, so no other test compiles them."""

    def __init__(self) -> None:
        self.before = dict(registry.declared)

    def restore(self) -> None:
        registry.restore(self.before)
        registry.forget_written()

