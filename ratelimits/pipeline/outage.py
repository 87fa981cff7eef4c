"""The store out of reach on the request path: the failed call is counted as such, and
each policy's `on_error` decides (`fallback`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimits.engine.errors import EngineError
from ratelimits.engine.interfaces import Engine
from ratelimits.pipeline.context import Context
from ratelimits.pipeline.fallback import fallback
from ratelimits.pipeline.plan import Planned
from ratelimits.pipeline.recording import Timed
from ratelimits.pipeline.verdict import Verdict
from ratelimits.pipeline.watchdog import watchdog

#: The store's decision when the store was out of reach (and `on_error` decided): the
#: policy version waits for the store to answer again.
UNREACHED: Any = object()


def unreached(
    ctx: Context,
    planned: Sequence[Planned],
    failed: Sequence[Any],
    exc: EngineError,
    *,
    engine: Engine | None,
    timed: Timed,
) -> Verdict:
    """The verdict on `planned` when the store's `engine` failed with `exc` (`engine` is
    None when it could not be built: a cluster client needs a reachable node)."""
    if engine is not None:
        timed.unavailable(engine, planned)
        if exc.taken is not None:  # the store may run the call yet: free what it takes
            watchdog.release_taken(engine, exc.taken, exc)
    return fallback(ctx.request, ctx.state, planned, failed, exc, ctx.sender, ctx.config,
                    engine)
