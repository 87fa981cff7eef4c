"""What the request path decided: per policy a `PolicyOutcome`, per request and layer a
`Verdict`.

A verdict holds the engine's `Decision`s rather than copies of their fields: its
Retry-After is the decisions' own whole seconds (`Decision.retry_after`, an int from the
engine), or the path's own int when the store was out of reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits.engine.records import quick_init
from ratelimits.engine.types import Decision, Outcome, Result
from ratelimits.pipeline.report import report

ADMITTED, LIMITED, UNAVAILABLE = 200, 429, 503

#: Whole seconds a client is told to wait when the store is down and a policy denies.
UNAVAILABLE_RETRY_AFTER = 1


@quick_init
@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """What one policy said about one request; `result` is None when no engine decided."""

    policy: Any  # compiled.CompiledPolicy
    identity: str
    result: Result | None = None

    @property
    def shadow(self) -> bool:
        """Whether this client was only watched: the policy is in shadow, or enforced but
        this client is outside its rollout (the limit it was decided by says which)."""
        return self.result.limit.shadow if self.result is not None else self.policy.shadow


@quick_init
@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one request at one glue layer."""

    status: int
    outcomes: tuple[PolicyOutcome, ...] = ()
    #: The engine's answers this verdict stands on (two when a policy reload happened).
    decisions: tuple[Decision, ...] = ()
    #: Seconds to hold an admitted request (leaky bucket), capped by MAX_DELAY.
    delay: float = 0.0
    #: Whole seconds to wait that no decision gave (the store was out of reach).
    own_retry_after: int = 0

    @property
    def allowed(self) -> bool:
        return self.status == ADMITTED

    @property
    def retry_after(self) -> int:
        """Whole seconds until a refused request could pass: the Retry-After value."""
        seconds = self.own_retry_after
        for decision in self.decisions:
            if decision.retry_after > seconds:
                seconds = decision.retry_after
        return seconds

    @property
    def rejected_by(self) -> tuple[PolicyOutcome, ...]:
        """The enforced policies that refused the request."""
        return tuple([
            o
            for o in self.outcomes
            if o.result is not None and o.result.outcome is Outcome.REJECTED
        ])

    def merged(self, other: Verdict) -> Verdict:
        """This verdict and a later one for the same request (after a policy reload)."""
        return Verdict(
            self.status if not self.allowed else other.status,
            self.outcomes + other.outcomes,
            self.decisions + other.decisions,
            max(self.delay, other.delay),
            max(self.own_retry_after, other.own_retry_after),
        )


def denies(failed: Sequence[Any]) -> bool:
    """Whether a policy that could not identify the client (`failed`: the compiled
    policies whose key raised) refuses the request: an enforced one whose `on_error` is
    `deny`."""
    return any(p.on_error == "deny" and not p.shadow for p in failed)


def unidentified(planned: Sequence[Any]) -> Verdict:
    """The 503 of a request a policy refuses because it could not identify the client
    (see `denies`), decided before any engine is asked: the other policies (`planned`)
    charge nothing for a request refused anyway, and lend it none of their figures (the
    headers are the refusing policy's, and it has no count of a client it cannot name)."""
    return Verdict(UNAVAILABLE, tuple([PolicyOutcome(p.policy, p.identity) for p in planned]),
                   own_retry_after=UNAVAILABLE_RETRY_AFTER)


def judge(
    request: Any,
    state: Any,
    planned: Sequence[Any],
    decision: Decision,
    failed: Sequence[Any],
    sender: type,
    config: Mapping[str, Any],
    prior: tuple[PolicyOutcome, ...] = (),
) -> Verdict:
    """The verdict on an engine's decision about `planned` (plan.Planned, in its order).

    Rejections and would-be rejections are reported; a policy that could not identify
    the client and says `on_error="deny"` turns an admission into a 503.
    """
    outcomes = prior + tuple([
        PolicyOutcome(p.policy, p.identity, result)
        for p, result in zip(planned, decision.results, strict=True)
    ])
    state.outcomes.extend(outcomes)
    for outcome in outcomes:
        if outcome.result is not None and not outcome.result.allowed:
            report(request, outcome, sender)
    if not decision.allowed:
        # an adaptive limit refuses for the service's sake, not the client's rate
        rejected = decision.rejected_by
        overloaded = rejected and all([r.limit.spec.learned for r in rejected])
        return Verdict(UNAVAILABLE if overloaded else LIMITED, outcomes, (decision,))
    if failed and denies(failed):  # the flow refuses before asking (`unidentified`)
        return Verdict(UNAVAILABLE, outcomes, (decision,), own_retry_after=UNAVAILABLE_RETRY_AFTER)
    delay = decision.delay
    if delay > config["MAX_DELAY"]:
        delay = config["MAX_DELAY"]
    return Verdict(ADMITTED, outcomes, (decision,), delay=delay)
