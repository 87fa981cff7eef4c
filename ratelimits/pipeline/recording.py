"""One engine call timed for the metrics recorder (`RATELIMITS["METRICS"]`); nothing is
timed when no recorder is set."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ratelimits.engine.types import Decision
from ratelimits.pipeline.metrics import recorder_for
from ratelimits.pipeline.plan import Planned


class Timed:
    """The recorder, if any, and when the engine call it times started."""

    __slots__ = ("recorder", "started")

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.recorder = recorder_for(config)
        self.started = time.perf_counter() if self.recorder is not None else 0.0

    def lap(self) -> float:
        """Seconds since the call started (0 when nothing is recorded)."""
        return time.perf_counter() - self.started if self.recorder is not None else 0.0

    def decided(
        self, engine: object, seconds: float, planned: Sequence[Planned], decision: Decision
    ) -> None:
        """Record what `engine` decided about `planned` in `seconds`."""
        if self.recorder is not None:
            self.recorder.decided(engine, seconds, [(p.policy, p.identity) for p in planned],
                                  decision)

    def unavailable(self, engine: object, planned: Sequence[Planned]) -> None:
        """Record a call to `engine` about `planned` that found the store out of reach."""
        if self.recorder is not None:
            self.recorder.unavailable(engine, self.lap(), (p.policy for p in planned))
