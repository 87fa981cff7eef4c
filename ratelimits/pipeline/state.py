"""State: one request's bookkeeping, and the process-wide state with its one reset.

Per request, a `RequestState` rides on the underlying `HttpRequest` (a DRF `Request`
wraps the same one), so the middleware and the throttle share it; each layer looks it up
once and passes it on.

Process-wide, the request path keeps: the validated settings (`conf`), the engines and
their circuit breaker (`engines`), the compiled policy snapshot (`resolver`), the metrics
recorder decision, the engine's key cache, the last "store unavailable" log time, when
the policy version was last learnt and the policy tables last looked at (`process`),
the concurrency watchdog, the waiting room, and the clock. Each holder registers its
reset with `ratelimits.runtime`; `reset_state()` forgets all of them at once. Tests
call it between cases, and settings changes call the relevant parts.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratelimits import runtime
from ratelimits.engine import keynames
from ratelimits.engine.records import quick_init

STATE_ATTR = "_ratelimits_state"


@dataclass
class RequestState:
    """Per-request bookkeeping, stored on the underlying HttpRequest."""

    charged: set[int] = field(default_factory=set)  # policy ids already decided
    outcomes: list[Any] = field(default_factory=list)  # verdict.PolicyOutcome, for headers
    #: (engine, Decision) with slots. This and `pending` stay the empty tuple until
    #: something is held or pending: a Django request lives in reference cycles, so
    #: whatever hangs from it waits for the cyclic garbage collector, which runs the more
    #: often the more objects each request leaves (two lists per request, before).
    holds: Sequence[tuple[Any, Any]] = ()
    path: str | None = None
    exempt: bool | None = None
    version_seen: bool = False
    middleware: bool = False
    #: The middleware left this request to the view's PolicyThrottle or @ratelimit (one
    #: decision for the unscoped and the view's scoped policies); `throttled`: one of
    #: them did decide it.
    deferred: bool = False
    throttled: bool = False
    #: RATELIMITS["TIER"]'s answer for this request, once asked (`tier_known`).
    tier: str | None = None
    tier_known: bool = False
    #: Planned policies whose charge (`charge_on`) or reset (`reset_on`) waits for the
    #: response (see `settling`), and the signals that fired during the request.
    pending: Sequence[Any] = ()
    login_failed: bool = False
    logged_in: bool = False
    #: The view was called (`RateLimitMiddleware._process_view`, async stacks): from then
    #: on, a request whose response never comes stays charged.
    view_started: bool = False
    #: The time to decide this request at, when its glue fixes one (a DRF throttle whose
    #: `timer` a test replaced); None: `runtime.decision_time()`.
    now: float | None = None
    #: The outcomes of the policies that refused the request, once a glue layer answers
    #: it with a refusal (None: it has not): the response's headers are theirs alone, so
    #: a 503 that no policy's count refused (the store out of reach, a client a policy
    #: could not identify) lends it no admitting policy's figures.
    refused_by: tuple[Any, ...] | None = None

    def refuse(self, verdict: Any) -> None:
        """The request is answered with `verdict`'s refusal (see `refused_by`)."""
        self.refused_by = tuple(verdict.rejected_by)


@quick_init
@dataclass(frozen=True, slots=True)
class Context:
    """A request being decided at one glue layer: the request (a DRF Request, or the
    HttpRequest), the HttpRequest under it (`base`), its state, its method, the DRF scopes
    in play, the glue class that asks (the signals' sender) and the settings."""

    request: Any
    base: Any
    state: RequestState
    method: str
    scopes: frozenset[str]
    sender: type
    config: Mapping[str, Any]


def http_request(request: Any) -> Any:
    """The Django HttpRequest under a DRF Request (or the request itself)."""
    return getattr(request, "_request", request)


def state_for(request: Any) -> RequestState:
    """This request's state, created on first use."""
    base = getattr(request, "_request", request)
    state = getattr(base, STATE_ATTR, None)
    if state is None:
        state = RequestState()
        setattr(base, STATE_ATTR, state)
    return state


@dataclass
class ProcessState:
    """Small process-wide values of the request path that belong to no other module.
    Their times are `runtime.clock().monotonic()` readings."""

    #: When the last "store unavailable" line was logged (0: never).
    last_unavailable_log: float = 0.0
    #: When the policy version was last learnt from the store (a reply that carried it,
    #: or a read of it, failed ones included): requests that learn nothing read it again
    #: only once this is a second old (resolver.VERSION_EVERY).
    version_at: float = -float("inf")
    #: Held by the one thread that reads the version; the others go on meanwhile.
    version_lock: threading.Lock = field(default_factory=threading.Lock)
    #: When the policy tables were last looked at (a snapshot loaded, or their
    #: fingerprint read): resolver.DB_CHECK_EVERY after it, a request reads it again.
    db_checked_at: float = -float("inf")
    #: Held by the one thread that reads the fingerprint.
    db_check_lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """Forget the times (the locks stay: a thread may hold one)."""
        self.last_unavailable_log = 0.0
        self.version_at = -float("inf")
        self.db_checked_at = -float("inf")


process = ProcessState()
runtime.on_reset(process.reset)
# The engine's cache of key names: the engine is a plain library that registers nothing,
# and the names change with its settings (`keynames.WINDOW_SHARDS`).
runtime.on_reset(keynames._cell.cache_clear)


def reset_state() -> None:
    """Forget every piece of process-wide state the app keeps: `runtime.reset_process()`
    (a holder registers its reset where it is defined; one not imported yet holds
    nothing)."""
    runtime.reset_process()
