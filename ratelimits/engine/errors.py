"""What an engine raises: the caller decides per policy what a failure means."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratelimits.engine.types import Decision


class EngineError(Exception):
    """The store answered with an error the engine cannot recover from.

    `taken`: when the failed call may have reached the store (it timed out waiting for the
    reply, or the reply could not be read), the concurrency slots it takes if the store
    ran it, as an admitted `Decision` to `release()`; None when it took none for sure.
    Nobody else knows their token: unreleased, they would hold the limit until they
    expire, a `period` later.
    """

    taken: Decision | None = None


class EngineUnavailable(EngineError):
    """The store could not be reached in time (down, paused, read-only, timed out)."""


class CircuitOpen(EngineUnavailable):
    """The circuit breaker is open: the call failed at once, without reaching the store."""
