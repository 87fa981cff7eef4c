"""The one evaluation path that the middleware and the DRF throttle share.

`evaluate()` takes a request and the DRF scopes in play, picks the matching policies from
the snapshot, identifies the client, asks the engine once, and returns a `Verdict`. What
was charged is recorded on the underlying `HttpRequest`, so a policy charges a request at
most once however many glue layers look at it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from ratelimits import signals
from ratelimits.conf import get_config
from ratelimits.ops.metrics import recorder_for
from ratelimits.pipeline.resolver import CompiledPolicy, Snapshot, resolver
from ratelimits.pipeline.store import get_engine, get_local_engine

logger = logging.getLogger("ratelimits")

ADMITTED, LIMITED, UNAVAILABLE = 200, 429, 503

#: Seconds a client is told to wait when the store is down and a policy denies.
UNAVAILABLE_RETRY_AFTER = 1.0


UNSCOPED: frozenset[str] = frozenset({""})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one policy said about one request; `result` is None when no engine decided."""

    policy: CompiledPolicy
    identity: str
    result: Any = None  # ratelimits.engine.Result


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one request at one glue layer."""

    status: int
    outcomes: tuple[Outcome, ...] = ()
    retry_after: float = 0.0
    delay: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.status == ADMITTED

    @property
    def retry_after_header(self) -> str:
        """`Retry-After` in whole seconds, rounded up, at least 1."""
        return str(max(1, math.ceil(self.retry_after)))

    @property
    def rejected_by(self) -> tuple[Outcome, ...]:
        return tuple(
            o
            for o in self.outcomes
            if o.result is not None and not o.result.allowed and not o.policy.shadow
        )


@dataclass
class RequestState:
    """Per-request bookkeeping, stored on the underlying HttpRequest."""

    charged: set[int] = field(default_factory=set)
    outcomes: list[Outcome] = field(default_factory=list)
    holds: list[tuple[Any, Any]] = field(default_factory=list)  # (engine, decision)
    path: str | None = None
    exempt: bool | None = None
    version_seen: bool = False
    middleware: bool = False


STATE_ATTR = "_ratelimits_state"


def http_request(request: Any) -> Any:
    """The Django HttpRequest under a DRF Request (or the request itself)."""
    return getattr(request, "_request", request)


def state_for(request: Any) -> RequestState:
    base = http_request(request)
    state = getattr(base, STATE_ATTR, None)
    if state is None:
        state = RequestState()
        setattr(base, STATE_ATTR, state)
    return state


# -- the request path ------------------------------------------------------------------


def evaluate(request: Any, *, scopes: frozenset[str], sender: type) -> Verdict | None:
    """Decide a request against the policies for `scopes`; None when nothing applies.

    Never raises: an unexpected failure is logged and the request admitted, because a
    rate limiter must not turn its own bug into an outage.
    """
    try:
        return _evaluate(request, scopes, sender)
    except Exception:
        logger.exception("ratelimits: unexpected error while evaluating %s", _path_of(request))
        return None


def _evaluate(request: Any, scopes: frozenset[str], sender: type) -> Verdict | None:
    config = get_config()
    if not config["ENABLED"]:
        return None
    state = state_for(request)
    if _is_exempt(request, state, config):
        return None
    if state.path is None:
        from ratelimits.pipeline.paths import normalize_path

        state.path = normalize_path(http_request(request).path_info)
    method = (http_request(request).method or "GET").upper()

    snap = resolver.snapshot()
    verdict = _decide(request, state, snap, method, scopes, sender, config)
    return verdict


def _decide(
    request: Any,
    state: RequestState,
    snap: Snapshot,
    method: str,
    scopes: frozenset[str],
    sender: type,
    config: Any,
    *,
    second_pass: bool = False,
) -> Verdict | None:
    policies = snap.matching(state.path or "/", method, scopes, state.charged)
    if not policies and (state.version_seen or second_pass):
        return None

    limits, planned, failed = _identify(request, policies, config)
    state.charged.update(p.id for p in policies)

    engine = get_engine()
    recorder = recorder_for(config)
    started = time.perf_counter() if recorder is not None else 0.0
    try:
        decision = engine.evaluate([limit for limit in limits])
    except _engine_unavailable() as exc:
        if recorder is not None:
            recorder.unavailable(engine, time.perf_counter() - started, (p for p, _ in planned))
        return _fallback(request, state, planned, limits, failed, exc, sender)
    if recorder is not None:
        recorder.decided(engine, time.perf_counter() - started, planned, decision)
    state.version_seen = True
    if decision.token is not None:
        state.holds.append((engine, decision))

    outcomes = [
        Outcome(policy, identity, result)
        for (policy, identity), result in zip(planned, decision.results, strict=True)
    ]
    verdict = _verdict(request, state, outcomes, decision, failed, sender, config)

    # Another process changed the policies: load them and apply the ones this request
    # has not met yet (already-charged policies are never charged twice).
    newer = resolver.observe(decision.version, snap)
    if newer is not None and verdict.allowed and not second_pass:
        extra = _decide(request, state, newer, method, scopes, sender, config, second_pass=True)
        if extra is not None:
            verdict = _merge(verdict, extra)
    return verdict


def _identify(
    request: Any, policies: list[CompiledPolicy], config: Any
) -> tuple[list[Any], list[tuple[CompiledPolicy, str]], list[CompiledPolicy]]:
    """Each policy's client identity and engine limit; `failed`: key functions that raised."""
    from ratelimits.pipeline.identity import IdentityError

    limits, planned, failed = [], [], []
    trusted, prefix = config["TRUSTED_PROXIES"], config["IPV6_PREFIX"]
    seen: dict[Any, str | None] = {}  # policies sharing a key identify the client once
    for policy in policies:
        spec = policy.key_spec
        try:
            if spec in seen:
                identity = seen[spec]
            else:
                identity = seen[spec] = spec.identify(
                    request,
                    trusted_proxies=trusted,
                    ipv6_prefix=prefix,
                    proxy_header=config["PROXY_HEADER"],
                )
        except IdentityError as exc:
            logger.error(
                "ratelimits: policy %s could not identify the client on %s (%s); on_error=%s",
                policy.name,
                _path_of(request),
                exc,
                policy.on_error,
            )
            failed.append(policy)
            continue
        if identity is None:  # e.g. a `user` policy and an anonymous request
            continue
        limits.append(policy.limit_for(identity))
        planned.append((policy, identity))
    return limits, planned, failed


def _verdict(
    request: Any,
    state: RequestState,
    outcomes: list[Outcome],
    decision: Any,
    failed: list[CompiledPolicy],
    sender: type,
    config: Any,
) -> Verdict:
    state.outcomes.extend(outcomes)
    for outcome in outcomes:
        result = outcome.result
        if result is not None and not result.allowed:
            _report(request, outcome, sender)
    if not decision.allowed:
        return Verdict(LIMITED, tuple(outcomes), retry_after=decision.retry_after)
    if any(p.on_error == "deny" and not p.shadow for p in failed):
        return Verdict(UNAVAILABLE, tuple(outcomes), retry_after=UNAVAILABLE_RETRY_AFTER)
    delay = min(float(decision.delay or 0.0), config["MAX_DELAY"])
    return Verdict(ADMITTED, tuple(outcomes), delay=delay)


def _merge(first: Verdict, second: Verdict) -> Verdict:
    status = first.status if not first.allowed else second.status
    return Verdict(
        status,
        first.outcomes + second.outcomes,
        retry_after=max(first.retry_after, second.retry_after),
        delay=max(first.delay, second.delay),
    )


def _fallback(
    request: Any,
    state: RequestState,
    planned: list[tuple[CompiledPolicy, str]],
    limits: list[Any],
    failed: list[CompiledPolicy],
    exc: Exception,
    sender: type,
) -> Verdict:
    """The store is unreachable: each policy decides per its `on_error`."""
    _log_unavailable(exc)
    config = get_config()
    if any(p.on_error == "deny" and not p.shadow for p, _ in planned) or any(
        p.on_error == "deny" and not p.shadow for p in failed
    ):
        outcomes = tuple(Outcome(p, i) for p, i in planned)
        return Verdict(UNAVAILABLE, outcomes, retry_after=UNAVAILABLE_RETRY_AFTER)
    local = [
        (pi, lim) for pi, lim in zip(planned, limits, strict=True) if pi[0].on_error == "local"
    ]
    outcomes = [Outcome(p, i) for p, i in planned if p.on_error != "local"]
    if not local:
        state.outcomes.extend(outcomes)
        return Verdict(ADMITTED, tuple(outcomes))
    engine = get_local_engine()
    instances = config["INSTANCES"]
    decision = engine.evaluate([local_share(lim, instances) for _, lim in local])
    if decision.token is not None:
        state.holds.append((engine, decision))
    outcomes += [
        Outcome(p, i, result) for ((p, i), _), result in zip(local, decision.results, strict=True)
    ]
    return _verdict(request, state, outcomes, decision, [], sender, config)


def local_share(limit: Any, instances: int) -> Any:
    """This instance's part of a shared limit while each instance decides alone.

    Two instances sharing 100 per second take 50 per second each; a share never drops
    below one request's cost, so a policy keeps admitting something.
    """
    if instances <= 1:
        return limit
    share = max(limit.cost, math.ceil(limit.limit / instances))
    burst = limit.burst
    if burst is not None:
        burst = max(
            limit.cost if limit.algorithm != "leaky_bucket" else 0, math.ceil(burst / instances)
        )
    return dataclasses.replace(limit, limit=share, burst=burst)


_last_unavailable_log = 0.0


def _log_unavailable(exc: Exception) -> None:
    global _last_unavailable_log
    now = time.monotonic()
    # once per breaker cool-down: an outage is news, each request during it is not
    interval = get_config()["BREAKER_COOLDOWN"]
    if now - _last_unavailable_log >= interval or _last_unavailable_log == 0.0:
        _last_unavailable_log = now
        logger.error(
            "ratelimits: the rate-limit store is unavailable (%s); "
            "policies fall back to their on_error",
            exc,
        )


def _engine_unavailable() -> type[Exception]:
    # Any store failure (unreachable, read-only, out of memory ...) is decided per on_error.
    from ratelimits.engine import EngineError

    return EngineError


def _report(request: Any, outcome: Outcome, sender: type) -> None:
    """One log record and one signal for a rejection or a would-be rejection."""
    from ratelimits.pipeline.identity import display_identity

    policy, result = outcome.policy, outcome.result
    path = _path_of(request)
    shown = display_identity(outcome.identity)
    kwargs = {
        "request": http_request(request),
        "policy": policy.name,
        "key": policy.key_kind,
        "identity": shown,
        "retry_after": result.retry_after,
        "path": path,
    }
    extra = {f"ratelimits_{k}": v for k, v in kwargs.items() if k != "request"}
    if policy.shadow:
        level, what, signal = logging.WARNING, "shadow policy %s would reject", (
            signals.request_would_be_limited
        )
    else:
        level, what, signal = logging.INFO, "policy %s rejected", signals.request_limited
    logger.log(
        level,
        f"ratelimits: {what} %s %s (key %s, client %s, retry after %.1fs)",
        policy.name,
        http_request(request).method,
        path,
        policy.key_kind,
        shown,
        result.retry_after,
        extra=extra,
    )
    signal.send(sender=sender, **kwargs)


def _is_exempt(request: Any, state: RequestState, config: Any) -> bool:
    if state.exempt is None:
        state.exempt = False
        if config["EXEMPT"]:
            try:
                state.exempt = bool(import_string(config["EXEMPT"])(http_request(request)))
            except Exception:
                logger.exception("ratelimits: the EXEMPT function failed; not exempting")
    return state.exempt


def _path_of(request: Any) -> str:
    try:
        return str(http_request(request).path)[:200]
    except Exception:
        return "?"


# -- after the response ------------------------------------------------------------------


def release(request: Any) -> None:
    """Free the concurrency slots this request holds (idempotent, never raises)."""
    state = getattr(http_request(request), STATE_ATTR, None)
    if state is None:
        return
    holds, state.holds = state.holds, []
    for engine, decision in holds:
        try:
            engine.release(decision)
        except Exception as exc:  # the slot expires by itself; do not fail the response
            logger.warning("ratelimits: could not release a concurrency slot (%s)", exc)


def sleep(seconds: float) -> None:
    """Hold an admitted leaky-bucket request (a module function so tests can observe it)."""
    time.sleep(seconds)


async def asleep(seconds: float) -> None:
    """The async stack's `sleep`: the event loop serves others meanwhile."""
    await asyncio.sleep(seconds)
