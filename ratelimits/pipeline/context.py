"""One evaluation of a request: what the decision flow works from, passed along whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits import runtime
from ratelimits.engine.records import quick_init
from ratelimits.engine.types import Decision
from ratelimits.pipeline.state import RequestState, http_request
from ratelimits.pipeline.verdict import PolicyOutcome, Verdict, judge


@quick_init
@dataclass(frozen=True, slots=True)
class Context:
    """A request being decided at one glue layer: the request and its state, its method,
    the DRF scopes in play, the glue class that asks (the signals' sender), the settings,
    and whether its view answers its method as it answers GET (`as_get`: policies on GET
    count it too)."""

    request: Any
    state: RequestState
    method: str
    scopes: frozenset[str]
    sender: type
    config: Mapping[str, Any]
    as_get: bool = False

    @property
    def base(self) -> Any:
        """The Django HttpRequest under a DRF Request."""
        return http_request(self.request)

    def now(self) -> float | None:
        """The time to decide at: the request's own (`RequestState.now`), else the
        installed clock's (`runtime.decision_time()`: None under the real one, the
        engine's)."""
        if self.state.now is not None:
            return self.state.now
        return runtime.decision_time()

    def judge(
        self,
        planned: Sequence[Any],
        decision: Decision,
        failed: Sequence[Any],
        prior: tuple[PolicyOutcome, ...] = (),
    ) -> Verdict:
        """The verdict on an engine's decision about `planned` (see `verdict.judge`)."""
        return judge(self.request, self.state, planned, decision, failed, self.sender,
                     self.config, prior=prior)
