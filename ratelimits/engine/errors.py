"""What an engine raises: the caller decides per policy what a failure means."""

from __future__ import annotations


class EngineError(Exception):
    """The store answered with an error the engine cannot recover from."""


class EngineUnavailable(EngineError):
    """The store could not be reached in time (down, paused, read-only, timed out)."""
