"""What the invisible blocks of docs/recipes/*.md use: a function a page shows as part of
`myproject/...`, importable by the dotted path the page's settings give; and the limits a
page declares in code, forgotten when the page is done."""

from __future__ import annotations

import contextlib
import itertools
import sys
import types
from collections.abc import Iterator
from typing import Any

from ratelimits.pipeline.declared import registry


@contextlib.contextmanager
def importable(dotted: str, **attributes: Any) -> Iterator[types.ModuleType]:
    """`attributes` importable as the module `dotted` (and its parent packages) while the
    block runs, gone afterwards: the app imports a setting's function by its path."""
    parts = dotted.split(".")
    names = [".".join(parts[: i + 1]) for i in range(len(parts))]
    added = [name for name in names if name not in sys.modules]
    for name in added:
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so that the next part imports under it
        sys.modules[name] = module
    for parent, child in itertools.pairwise(names):
        setattr(sys.modules[parent], child.rpartition(".")[2], sys.modules[child])
    module = sys.modules[dotted]
    for key, value in attributes.items():
        setattr(module, key, value)
    try:
        yield module
    finally:
        for name in reversed(added):
            sys.modules.pop(name, None)


def forget_declarations(*names: str, modules: tuple[str, ...] = ()) -> None:
    """Forget the limits a page declared in code (`@ratelimit(name=...)`), so that no later
    test compiles them into its snapshot, and the `modules` that declared them (imported
    again, they declare them again)."""
    for module in modules:
        sys.modules.pop(module, None)
    registry.restore({k: v for k, v in registry.declared.items() if k not in names})
    registry.forget_written()
