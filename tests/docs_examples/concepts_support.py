"""What the invisible blocks of docs/concepts/*.md use to run the pages' examples as the
reader would write them: the limits a page declares in code forgotten at its end (a
function shown as part of `myproject/...` is made importable by
`recipes_support.importable`).
"""

from __future__ import annotations

from ratelimits.pipeline.declared import registry


class Declarations:
    """The limits declared in code (`@ratelimit`) before a page's examples declare theirs:
    `restore()` forgets the page's, so no other test compiles them."""

    def __init__(self) -> None:
        self.before = dict(registry.declared)

    def restore(self) -> None:
        registry.restore(self.before)
        registry.forget_written()

