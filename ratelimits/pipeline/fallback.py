"""The store is out of reach: each policy decides per its `on_error`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ratelimits.engine.interfaces import Engine
from ratelimits.engine.types import Limit
from ratelimits.pipeline.engines import get_local_engine
from ratelimits.pipeline.report import log_fallback, log_unavailable
from ratelimits.pipeline.verdict import (
    ADMITTED,
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    PolicyOutcome,
    Verdict,
    judge,
)
from ratelimits.pipeline.watchdog import hold


def fallback(
    request: Any,
    state: Any,
    planned: Sequence[Any],
    failed: Sequence[Any],
    exc: Exception,
    sender: type,
    config: Mapping[str, Any],
    engine: Engine | None = None,
    now: float | None = None,
) -> Verdict:
    """`deny` refuses with a 503, `local` decides in process, `allow` admits.

    Shadow policies never refuse, whatever their `on_error`, nor do enforced ones for the
    clients outside their rollout. `engine` is the store's
    engine that failed (None when it could not be built): it knows how many processes
    were live at its last contact. `now`: the time the request is decided at (None: the
    in-process engine's clock).
    """
    log_unavailable(exc, config)
    log_fallback(((p.policy, p.limit.shadow) for p in planned), exc)
    if any(p.policy.on_error == "deny" and not p.limit.shadow for p in planned) or any(
        p.on_error == "deny" and not p.shadow for p in failed
    ):
        outcomes = tuple(PolicyOutcome(p.policy, p.identity) for p in planned)
        return Verdict(UNAVAILABLE, outcomes, own_retry_after=UNAVAILABLE_RETRY_AFTER)
    local = [p for p in planned if p.policy.on_error == "local"]
    undecided = tuple(
        PolicyOutcome(p.policy, p.identity) for p in planned if p.policy.on_error != "local"
    )
    if not local:
        state.outcomes.extend(undecided)
        return Verdict(ADMITTED, undecided)
    instances = live_instances(engine, config)
    local_engine = get_local_engine()
    decision = local_engine.evaluate([local_share(p.limit, instances) for p in local], now)
    if decision.token is not None:
        hold(state, local_engine, decision)
    return judge(request, state, local, decision, (), sender, config, prior=undecided)


def live_instances(engine: Engine | None, config: Mapping[str, Any]) -> int:
    """How many processes share the limits: the live count the store's engine learnt at
    its last heartbeat, else (no contact yet, or no heartbeat) `INSTANCES`."""
    live = None if engine is None else engine.live_instances
    return live if live is not None and live >= 1 else int(config["INSTANCES"])


def local_share(limit: Limit, instances: int) -> Limit:
    """This instance's part of a shared limit while each instance decides alone.

    Two instances sharing 100 per second take 50 per second each; a share never drops
    below one request's cost, so a policy keeps admitting something. A `batch` above the
    share is cut to it: a limit's batch never exceeds its limit, and a process cut off
    from the store may not take more than its share (the in-process engine decides each
    request on its own, so the batch changes nothing else there).
    """
    if instances <= 1:
        return limit
    share = max(limit.cost, math.ceil(limit.limit / instances))
    burst = limit.burst
    if burst is not None:
        burst = max(
            0 if limit.spec.delays else limit.cost, math.ceil(burst / instances)  # a queue may be 0
        )
    batch = limit.batch if limit.batch is None else min(limit.batch, share)
    return dataclasses.replace(limit, limit=share, burst=burst, batch=batch)
