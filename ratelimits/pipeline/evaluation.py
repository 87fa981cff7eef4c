"""The one evaluation path that the middleware and the DRF throttle share.

`evaluate()` takes a request and the DRF scopes in play, picks the matching policies from
the snapshot (resolver), identifies the client (plan), asks the store's engine once for
the shared policies and the in-process engine for the per-process ones, and returns a
`Verdict` (verdict); when the store is out of reach each policy's `on_error` decides
(fallback). The policy version comes with every store reply; a request that gets none
reads it, at most once a second per process. What was charged is recorded in the
request's state, so a policy charges a request at most once however many glue layers look
at it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import SimpleLazyObject, empty
from django.utils.module_loading import import_string

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.engine import flows
from ratelimits.engine.errors import EngineError
from ratelimits.engine.flows import arun_flow, run_flow
from ratelimits.engine.types import Decision
from ratelimits.matching.keykinds import KEY_KINDS
from ratelimits.pipeline.declared import SCOPES_ATTR
from ratelimits.pipeline.fallback import fallback
from ratelimits.pipeline.metrics import recorder_for
from ratelimits.pipeline.plan import Planned, plan
from ratelimits.pipeline.report import (
    deferred_signals,
    log_safe,
    log_unavailable,
    log_unexpected,
)
from ratelimits.pipeline.resolver import DB_CHECK_EVERY, Snapshot, resolver
from ratelimits.pipeline.state import (
    STATE_ATTR,
    RequestState,
    http_request,
    process,
    state_for,
)
from ratelimits.pipeline.store import (
    count_in_store,
    get_adaptive_engine,
    get_engine,
    get_local_engine,
)
from ratelimits.pipeline.verdict import (
    ADMITTED,
    LIMITED,
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    Outcome,
    Verdict,
    judge,
)
from ratelimits.pipeline.waiting import room
from ratelimits.pipeline.watchdog import hold, watchdog

__all__ = [
    "ADMITTED",
    "LIMITED",
    "UNAVAILABLE",
    "UNAVAILABLE_RETRY_AFTER",
    "UNSCOPED",
    "Outcome",
    "Verdict",
    "aevaluate",
    "arelease",
    "asleep",
    "evaluate",
    "http_request",
    "release",
    "sleep",
    "state_for",
]

logger = logging.getLogger("ratelimits")

#: A policy's `counting` when each process counts it alone, in its in-process engine.
PER_PROCESS = "per_process"

#: The scopes of a request outside DRF: only policies without a scope apply.
UNSCOPED: frozenset[str] = frozenset({""})


def evaluate(
    request: Any, *, scopes: frozenset[str], sender: type, state: RequestState | None = None
) -> Verdict | None:
    """Decide a request against the policies for `scopes`; None when nothing applies.

    Raises only ImproperlyConfigured (a settings mistake must stop the request, never
    admit it unlimited); any other failure is logged and the request admitted, because
    a rate limiter must not turn its own bug into an outage.
    """
    try:
        verdict: Verdict | None = _run(_evaluate(request, scopes, sender, state))
        return verdict
    except ImproperlyConfigured:
        raise  # a settings mistake must not switch enforcement off unnoticed
    except Exception:
        log_unexpected(request)
        return None


async def aevaluate(
    request: Any, *, scopes: frozenset[str], sender: type, state: RequestState | None = None
) -> Verdict | None:
    """`evaluate()` for the async stack: the store awaited on the event loop (see
    `engine.aio`). Only what may block goes to a thread, as Django's `sync_to_async`
    would run it: reading the policies from the database (at most once a
    `DB_CHECK_EVERY`, and when another process changed them), the version when no
    reply carried it (at most once a second), and your own functions (`EXEMPT`,
    `TIER`, `call:` keys). A `user` key reads the user with `request.auser()`."""
    pending: list[tuple[Any, Any, dict[str, Any]]] = []
    token = deferred_signals.set(pending)
    try:
        verdict: Verdict | None = await _arun(_evaluate(request, scopes, sender, state))
    except ImproperlyConfigured:
        raise
    except Exception:
        log_unexpected(request)
        return None
    finally:
        deferred_signals.reset(token)
    for signal, signal_sender, kwargs in pending:
        await signal.asend(sender=signal_sender, **kwargs)
    return verdict


# -- one path, two drivers -----------------------------------------------------------------
#
# The decision is written once, as a generator that yields what it needs done outside
# itself: `_Blocking` (a call that may block: the database, a user's function), `_Store`
# (the store's decision) and `_Version` (the store's policy version). `_run` does each
# in the calling thread; `_arun` awaits the store on the event loop and sends the
# blocking calls to a thread.


class _Blocking:
    __slots__ = ("args", "fn")

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args


class _Store:
    __slots__ = ("engine", "limits", "now")

    def __init__(self, engine: Any, limits: list[Any], now: float | None) -> None:
        self.engine, self.limits, self.now = engine, limits, now


class _Version:
    """The store's policy version (`engine.read_version()`, awaited under ASGI)."""

    __slots__ = ("engine",)

    def __init__(self, engine: Any) -> None:
        self.engine = engine


class _User:
    """Load `request.user` before a `user` key reads it (the async stack's `auser()`)."""

    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request


Steps = flows.Flow[Any]


def _run(steps: Steps) -> Any:
    return run_flow(steps, _perform)


async def _arun(steps: Steps) -> Any:
    return await arun_flow(steps, _aperform)


def _perform(need: Any) -> Any:
    if isinstance(need, _Store):
        return need.engine.evaluate(need.limits, need.now)
    if isinstance(need, _Version):
        return need.engine.read_version()
    if isinstance(need, _Blocking):
        return need.fn(*need.args)
    return None  # _User: a blocking stack reads request.user when a key asks


async def _aperform(need: Any) -> Any:
    if isinstance(need, _Store):
        return await need.engine.aevaluate(need.limits, need.now)
    if isinstance(need, _Version):
        return await need.engine.aread_version()
    if isinstance(need, _Blocking):
        return await sync_to_async(need.fn)(*need.args)
    await _load_user(need.request)
    return None


async def _load_user(request: Any) -> None:
    """`request.user` made concrete with `auser()`, so reading it runs no query here."""
    base = http_request(request)
    user = getattr(base, "user", None)
    auser = getattr(base, "auser", None)
    if auser is None or not isinstance(user, SimpleLazyObject):
        return
    if getattr(user, "_wrapped", empty) is empty:  # not evaluated yet
        base.user = await auser()


def _evaluate(
    request: Any, scopes: frozenset[str], sender: type, state: RequestState | None = None
) -> Steps:
    config = get_config()
    if not config["ENABLED"]:
        return None
    if state is None:
        state = state_for(request)
    base = http_request(request)
    if state.exempt is None and config["EXEMPT"]:
        yield _Blocking(_is_exempt, base, state, config)
    if state.exempt:
        return None
    if state.path is None:
        from ratelimits.matching.paths import normalize_path

        state.path = normalize_path(base.path_info)
        if not base.path_info.endswith("/") and redirects_with_slash(base):
            state.exempt = True  # the redirected request is the one charged
            return None
    method = (base.method or "GET").upper()
    snap = resolver.ready()
    if snap is None:
        snap = yield _Blocking(resolver.snapshot)
    if runtime.clock().monotonic() - process.db_checked_at >= DB_CHECK_EVERY:
        snap = yield _Blocking(resolver.recheck, snap)
    return (yield from _decide(request, state, snap, method, scopes, sender, config))


def _decide(
    request: Any,
    state: RequestState,
    snap: Snapshot,
    method: str,
    scopes: frozenset[str],
    sender: type,
    config: Mapping[str, Any],
    *,
    second_pass: bool = False,
) -> Steps:
    policies = snap.matching(state.path or "/", method, scopes, state.charged)
    if not policies:
        if state.version_seen or second_pass:
            return None
        # No policy applies: nothing to decide, but a policy added since may apply.
        state.version_seen = True
        newer = yield from _newer_snapshot(None, snap, config)
        if newer is None:
            return None
        return (yield from _decide(request, state, newer, method, scopes, sender, config,
                                   second_pass=True))

    kinds = {p.key_spec.kind for p in policies}
    if kinds & KEY_KINDS.reads_user:
        yield _User(request)
    if kinds & KEY_KINDS.calls_code or (config["TIER"] and any(p.overrides for p in policies)):
        planned, failed = yield _Blocking(plan, request, policies, config, state,
                                          snap.members)
    else:
        planned, failed = plan(request, policies, config, state, snap.members)
    state.charged.update(p.id for p in policies)
    layers = _local_layers(planned)
    if layers:
        verdict, decision = yield from _decide_local(
            request, state, layers, [p for p in planned if p.policy.counting != PER_PROCESS
                                     and not p.limit.spec.learned], failed, sender, config)
    else:
        verdict, decision = yield from _decide_shared(request, state, planned, failed,
                                                      sender, config)
    if decision is _UNREACHED:
        return verdict  # the store is out of reach: the version waits for it
    state.version_seen = True

    # Another process changed the policies: load them and apply the ones this request
    # has not met yet (already-charged policies are never charged twice).
    newer = yield from _newer_snapshot(None if decision is None else decision.version, snap,
                                       config)
    if newer is not None and verdict.allowed and not second_pass:
        extra = yield from _decide(request, state, newer, method, scopes, sender, config,
                                   second_pass=True)
        if extra is not None:
            verdict = verdict.merged(extra)
    return verdict



def _now(state: RequestState) -> float | None:
    """The time to decide at: the request's own (`RequestState.now`), else the installed
    clock's (`runtime.decision_time()`: None under the real one, the engine's)."""
    if state.now is not None:
        return state.now
    return runtime.decision_time()


#: `_decide_shared`'s decision when the store was out of reach (on_error decided).
_UNREACHED: Any = object()


def _decide_shared(
    request: Any,
    state: RequestState,
    planned: list[Planned],
    failed: list[Any],
    sender: type,
    config: Mapping[str, Any],
) -> Steps:
    """The store decides `planned` in one call; (verdict, its decision or `_UNREACHED`)."""
    recorder = recorder_for(config)
    started = time.perf_counter() if recorder is not None else 0.0
    engine: Any = None
    try:
        engine = get_engine()  # a cluster client needs a reachable node to be built
        decision = yield _Store(engine, [p.limit for p in planned], _now(state))
    except EngineError as exc:  # unreachable, read-only, out of memory ...
        if recorder is not None and engine is not None:
            seconds = time.perf_counter() - started
            recorder.unavailable(engine, seconds, (p.policy for p in planned))
        verdict = fallback(request, state, planned, failed, exc, sender, config, engine)
        return verdict, _UNREACHED
    if recorder is not None:
        seconds = time.perf_counter() - started
        recorder.decided(engine, seconds, [(p.policy, p.identity) for p in planned], decision)
    if decision.token is not None:
        hold(state, engine, decision)
    return judge(request, state, planned, decision, failed, sender, config), decision


def _local_layers(planned: list[Planned]) -> list[tuple[Any, list[Planned]]]:
    """The policies decided in this process, each kind with its engine: the adaptive
    ones first (a refusal there is the cheapest), then the per-process ones."""
    layers: list[tuple[Any, list[Planned]]] = []
    learned = [p for p in planned if p.limit.spec.learned]
    if learned:
        layers.append((get_adaptive_engine(), learned))
    own = [p for p in planned if p.policy.counting == PER_PROCESS and not p.limit.spec.learned]
    if own:
        layers.append((get_local_engine(), own))
    return layers


def _decide_local(
    request: Any,
    state: RequestState,
    layers: list[tuple[Any, list[Planned]]],
    shared: list[Planned],
    failed: list[Any],
    sender: type,
    config: Mapping[str, Any],
) -> Steps:
    """Each layer of in-process policies in its engine, in order; the shared ones in the
    store only if all of those admit; and what a layer took given back if a later one
    (or the store, or its `on_error`) refuses: all or nothing."""
    (engine, own), rest = layers[0], layers[1:]
    recorder = recorder_for(config)
    started = time.perf_counter() if recorder is not None else 0.0
    now = _now(state)
    mine, receipt = engine.take([p.limit for p in own], now)
    seconds = time.perf_counter() - started if recorder is not None else 0.0
    decision: Decision | None = None
    if not mine.allowed or not (rest or shared):
        # decided here: the later layers and the store are not asked
        undecided = tuple(Outcome(p.policy, p.identity)
                          for p in [*(p for _, later in rest for p in later), *shared])
        verdict = judge(request, state, own, mine, failed, sender, config, prior=undecided)
    else:
        if rest:
            verdict, decision = yield from _decide_local(request, state, rest, shared,
                                                         failed, sender, config)
        else:
            verdict, decision = yield from _decide_shared(request, state, shared, failed,
                                                          sender, config)
        if not verdict.allowed and receipt is not None:
            mine = engine.refund(receipt)
        verdict = verdict.merged(judge(request, state, own, mine, (), sender, config))
    if mine.token is not None:
        hold(state, engine, mine)
    count_in_store(engine, mine, now)
    if recorder is not None:
        recorder.decided(engine, seconds, [(p.policy, p.identity) for p in own], mine)
    return verdict, decision


def _newer_snapshot(
    version: int | None, snap: Snapshot, config: Mapping[str, Any]
) -> Steps:
    """The snapshot of a policy version newer than `snap`'s, if one was built.

    `version` is what the store's reply carried; None when nothing carried it (no store
    call, or one answered in process), and then it is read, at most once per
    `VERSION_EVERY` per process.
    """
    if version is not None:
        process.version_at = runtime.clock().monotonic()
    elif runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        return None
    else:
        version = yield from _read_version(config)
        if version is None:
            return None
    if not resolver.outdates(version, snap):
        return None  # the snapshot is current: nothing to read
    return (yield _Blocking(resolver.observe, version, snap))


#: A process that learns the policy version from no reply reads it at most this often.
VERSION_EVERY = 1.0


def _read_version(config: Mapping[str, Any]) -> Steps:
    """The version read from the store, when the last one learnt is `VERSION_EVERY`
    old; None when it is younger, another request is reading it, or the store failed.
    One request reads at a time (awaited on the event loop under ASGI): the others go
    on with the snapshot they have."""
    if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        return None
    lock = process.version_lock
    if not lock.acquire(blocking=False):
        return None
    try:
        if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
            return None  # read by another thread meanwhile
        try:
            return int((yield _Version(get_engine())))
        except EngineError as exc:
            log_unavailable(exc, config)
            return None
        finally:
            process.version_at = runtime.clock().monotonic()  # failed too: again a second later
    finally:
        lock.release()


def throttle_decides(request: Any, snap: Snapshot | None = None) -> bool:
    """Whether this request goes to a view that decides it itself: a DRF view whose
    `PolicyThrottle` will (its `throttle_scope` is some policy's scope), or a view with
    `@ratelimit`. The middleware then leaves the request to it, which decides the unscoped
    and the scoped policies in one call (for DRF, after it has authenticated the user that
    `user` keys count). Cheap when no policy has a scope (the URL is resolved only when
    one has)."""
    if snap is None:
        snap = resolver.snapshot()
    if not snap.scopes or not get_config()["ENABLED"]:
        return False
    from django.urls import Resolver404, get_resolver

    base = http_request(request)
    try:
        view = get_resolver(getattr(base, "urlconf", None)).resolve(base.path_info).func
    except Resolver404:
        return False
    except Exception:  # a broken URLconf is Django's to report, not ours to crash on
        logger.exception("ratelimits: could not resolve %s to find its DRF view",
                         log_safe(base.path_info))
        return False
    if _declared_scopes(view, base) & snap.scopes:
        return True
    cls = getattr(view, "cls", None)  # DRF's as_view() keeps the view class there
    throttles = getattr(cls, "throttle_classes", ())
    # DRF compat throttles (compat.drf) declare their own limits: the view has some
    if any(getattr(t, "declares_policies", False) for t in throttles):
        return True
    if getattr(cls, "throttle_scope", None) not in snap.scopes:
        return False
    return any(getattr(t, "decides_policies", False) for t in throttles)


def _declared_scopes(view: Any, base: Any) -> frozenset[str]:
    """The scopes of the `@ratelimit` limits on a view function, or on a class-based
    view's `dispatch` or method handler (`method_decorator` copies the attribute)."""
    scopes: frozenset[str] = getattr(view, SCOPES_ATTR, frozenset())
    cls = getattr(view, "view_class", None)
    if cls is not None:
        for handler in (getattr(cls, "dispatch", None),
                        getattr(cls, (base.method or "get").lower(), None)):
            scopes = scopes | getattr(handler, SCOPES_ATTR, frozenset())
    return scopes


_COMMON = "django.middleware.common.CommonMiddleware"


def redirects_with_slash(base: Any) -> bool:
    """Whether CommonMiddleware will answer this request with a redirect to `path + "/"`.

    The redirect costs the client nothing: the request it leads to is charged. Any other
    unresolved URL is charged, so scanners probing for pages stay limited.
    """
    from django.conf import settings

    if not settings.APPEND_SLASH or _COMMON not in settings.MIDDLEWARE:
        return False
    from django.middleware.common import CommonMiddleware

    return bool(CommonMiddleware(_no_response).should_redirect_with_slash(base))


def _no_response(request: Any) -> Any:  # CommonMiddleware wants a get_response
    return None


def _is_exempt(base: Any, state: RequestState, config: Mapping[str, Any]) -> bool:
    if state.exempt is None:
        state.exempt = False
        if config["EXEMPT"]:
            try:
                state.exempt = bool(import_string(config["EXEMPT"])(base))
            except Exception:
                logger.exception("ratelimits: the EXEMPT function failed; not exempting")
    return state.exempt


# -- after the decision ------------------------------------------------------------------


def release(request: Any, state: RequestState | None = None) -> None:
    """Free the concurrency slots this request holds (idempotent, never raises)."""
    for engine, decision in _holds(request, state):
        try:
            engine.release(decision)
        except Exception as exc:  # the slot expires by itself; do not fail the response
            logger.warning("ratelimits: could not release a concurrency slot (%s)", exc)


async def arelease(request: Any, state: RequestState | None = None) -> None:
    """`release()` for the async stack."""
    for engine, decision in _holds(request, state):
        try:
            await engine.arelease(decision)
        except Exception as exc:
            logger.warning("ratelimits: could not release a concurrency slot (%s)", exc)


def _holds(request: Any, state: RequestState | None) -> list[tuple[Any, Decision]]:
    """The (engine, decision) pairs whose slots this request holds, taken from it."""
    if state is None:
        state = getattr(http_request(request), STATE_ATTR, None)
        if state is None:
            return []
    holds, state.holds = state.holds, []
    for _engine, decision in holds:
        watchdog.drop(decision)
    return holds


def _waiter(verdict: Verdict) -> tuple[str, ...]:
    """Who waits: the clients of the policies that delay this request."""
    return tuple(
        sorted({o.identity for o in verdict.outcomes if o.result is not None and o.result.delay})
    )


def _no_room(verdict: Verdict) -> Verdict:
    """No waiting room left: refuse now, telling the client when its turn would be."""
    turn = max((d.delay for d in verdict.decisions), default=verdict.delay)  # not capped
    return dataclasses.replace(
        verdict, status=LIMITED, delay=0.0, own_retry_after=max(1, math.ceil(turn))
    )


def wait_turn(verdict: Verdict) -> Verdict:
    """Hold an admitted, delayed request for its delay if the waiting room has a place.

    Returns the verdict to act on: the same one after the wait, or a 429 at once.
    """
    config = get_config()
    client = _waiter(verdict)
    if not room.enter(client, config["MAX_WAITING"], config["MAX_WAITING_PER_CLIENT"]):
        return _no_room(verdict)
    try:
        sleep(verdict.delay)
    finally:
        room.leave(client)
    return verdict


async def await_turn(verdict: Verdict) -> Verdict:
    """`wait_turn` for the async stack: the event loop serves others meanwhile."""
    config = get_config()
    client = _waiter(verdict)
    if not room.enter(client, config["MAX_WAITING"], config["MAX_WAITING_PER_CLIENT"]):
        return _no_room(verdict)
    try:
        await asleep(verdict.delay)
    finally:
        room.leave(client)
    return verdict


def sleep(seconds: float) -> None:
    """Hold an admitted, delayed request, on the installed clock (a test's clock moves
    instead)."""
    runtime.clock().sleep(seconds)


async def asleep(seconds: float) -> None:
    """The async stack's `sleep`: the event loop serves others meanwhile."""
    await runtime.clock().asleep(seconds)
