"""The decision on one request: written once, as one pass, and driven two ways.

A pass over a request is, in order:

1. **route** (`routing.route_of`): what the request's method and path ask of the
   snapshot, a dict lookup: the policies that look at it, whether the view decides it
   (the middleware then leaves it), whether the path is the admin's or redirected;
2. **plan** (`plan.plan`, then `prepare`): the client of each policy, overrides and
   rollout applied, a place in the waiting room when a policy may delay it, every policy
   this process decides (adaptive, then per-process) taken in its engine; what is left
   is the store's, in one call;
3. **send**: the only step the drivers differ in. `decide` calls the store, `adecide`
   awaits it on the event loop; each also runs in place (or, under ASGI, in a thread)
   what may block: the policy tables, `EXEMPT`, the admin's user, your key and cost
   functions;
4. **judge** (`judge`): the store's reply (or its failure, and then each policy's
   `on_error`) and the local answers become one `Verdict`; what a local layer took is
   given back when another refused, all or nothing.

When the store's reply says another process changed the policies, the pass runs once more
on the newer snapshot, for the policies this request has not met yet. What was charged is
recorded in the request's state, so a policy charges a request at most once however many
glue layers look at it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.functional import SimpleLazyObject, empty

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.engine.errors import EngineError
from ratelimits.engine.interfaces import LocalLayer
from ratelimits.engine.types import Decision
from ratelimits.pipeline.compiled import PER_PROCESS, Snapshot
from ratelimits.pipeline.engines import (
    count_fallback,
    count_in_store,
    get_adaptive_engine,
    get_engine,
    get_local_engine,
)
from ratelimits.pipeline.fallback import fallback
from ratelimits.pipeline.metrics import recorder_for
from ratelimits.pipeline.plan import Planned, plan
from ratelimits.pipeline.release import adaptive_taken
from ratelimits.pipeline.resolver import (
    DB_CHECK_EVERY,
    anewer_snapshot,
    current,
    newer_snapshot,
    resolver,
)
from ratelimits.pipeline.routing import Route, asks, left_alone, route_of
from ratelimits.pipeline.settling import pending_of
from ratelimits.pipeline.state import Context, RequestState, process, state_for
from ratelimits.pipeline.verdict import PolicyOutcome, Verdict, denies, judge, unidentified
from ratelimits.pipeline.waiting import seat, settle, vacate
from ratelimits.pipeline.watchdog import hold, watchdog

#: The store's decision when the store was out of reach (and `on_error` decided): the
#: policy version waits for the store to answer again.
UNREACHED: Any = object()


def decide(request: Any, scopes: frozenset[str], sender: type,
           state: RequestState | None = None, *, middleware: bool = False) -> Verdict | None:
    """The verdict on `request` for the policies of `scopes`; None when nothing applies
    (or, for the `middleware`, when the view decides the request itself)."""
    ctx = begin(request, scopes, sender, state)
    if ctx is None:
        return None
    snap = resolver.ready()
    # read once: whether the tables are due now (`_tables_due`), the version later
    mono = runtime.clock().monotonic()
    if snap is None or mono - process.db_checked_at >= DB_CHECK_EVERY:
        snap = _fresh(snap)
    run = Pass(ctx, snap, middleware)
    # `left_alone` asked only when it has something to ask (see `Route.alone`)
    if run.deferred or ((ctx.state.exempt or ctx.config["EXEMPT"] or run.route.alone)
                        and left_alone(ctx, run.route)):
        return None
    while True:
        policies = run.unmet()
        if policies:
            step = run.prepare(policies, *plan(request, policies, ctx.config, ctx.state,
                                               run.snap.members))
            try:
                run.judge(step, send(step) if step.shared is not None else None)
            except BaseException:
                vacate(step.place)
                raise
        if not run.stale():
            return run.ended()
        newer = newer_snapshot(run.version, run.snap, ctx.config, mono)
        if newer is None or not run.moved_to(newer):
            return run.ended()


async def adecide(request: Any, scopes: frozenset[str], sender: type,
                  state: RequestState | None = None, *,
                  middleware: bool = False) -> Verdict | None:
    """`decide` on the event loop: the store awaited; what may block (the policy tables,
    `EXEMPT`, the admin's user, your key, cost and tier functions) in a thread, as
    Django's `sync_to_async` runs it; a `user` key's user loaded with `auser()`."""
    ctx = begin(request, scopes, sender, state)
    if ctx is None:
        return None
    snap = resolver.ready()
    if snap is None or _tables_due():
        snap = await sync_to_async(_fresh)(snap)
    run = Pass(ctx, snap, middleware)
    if run.deferred or ((ctx.state.exempt or ctx.config["EXEMPT"] or run.route.alone) and (
            await sync_to_async(left_alone)(ctx, run.route) if asks(ctx, run.route)
            else left_alone(ctx, run.route))):
        return None
    while True:
        policies = run.unmet()
        if policies:
            step = run.prepare(policies, *await _aplan(ctx, run.route, policies, run.snap))
            try:
                run.judge(step, await asend(step) if step.shared is not None else None)
            except BaseException:  # a cancelled task too
                vacate(step.place)
                raise
        if not run.stale():
            return run.ended()
        newer = await anewer_snapshot(run.version, run.snap, ctx.config)
        if newer is None or not run.moved_to(newer):
            return run.ended()


class Pass:
    """One request's decision at one glue layer, pass by pass: the snapshot and route it
    works on, the verdict so far, and the policy version a store reply called for."""

    __slots__ = ("ctx", "deferred", "judged", "route", "second", "snap", "verdict",
                 "version")

    def __init__(self, ctx: Context, snap: Snapshot, middleware: bool) -> None:
        self.ctx, self.snap = ctx, snap
        self.route = route = route_of(ctx.base, ctx.method, ctx.scopes, snap)
        #: The middleware leaves this request to the view's `PolicyThrottle` or
        #: `@ratelimit`, which decides the unscoped and the scoped policies in one call.
        self.deferred = False
        if middleware:
            state = ctx.state
            state.middleware = True
            if route.deferred:
                state.deferred = self.deferred = True
        self.verdict: Verdict | None = None
        self.second = False  # the pass on a newer snapshot
        self.judged = False  # this pass decided some policy
        #: After a pass: False when its snapshot is current (or the store was out of
        #: reach), else the version a reply called for (None: read it).
        self.version: Any = False

    def unmet(self) -> list[Any]:
        """The route's policies this request has not met yet (another glue layer, or the
        pass on an older snapshot, decided the others)."""
        self.judged = False
        charged = self.ctx.state.charged
        if not charged:
            return list(self.route.policies)
        return [p for p in self.route.policies if p.id not in charged]

    def prepare(self, policies: Sequence[Any], planned: list[Planned],
                failed: list[Any]) -> Step:
        """The step that decides `planned`: refused at once (503) when a policy that
        cannot identify the client denies; else a place taken when a policy may delay the
        request, and every in-process layer asked, in order, until one refuses."""
        self.judged = True
        ctx, route = self.ctx, self.route
        state = ctx.state
        state.charged.update([p.id for p in policies])
        if failed and denies(failed):
            # a 503 before any engine is asked: a request refused anyway charges no policy
            # and takes no place or slot (see `verdict.unidentified`)
            step = Step(planned, failed, None, None, None)
            step.verdict = unidentified(planned)
            return step
        place = None
        if route.may_wait:  # a place to wait in, taken before any turn is
            planned, place = seat(ctx, planned)
        # the request's own time (`RequestState.now`), else the installed clock's
        # (`runtime.decision_time()`: None under the real one, the engine's)
        now = state.now if state.now is not None else runtime.decision_time()
        step = Step(planned, failed, place, now, recorder_for(ctx.config))
        for p in planned:
            if p.policy.in_process:
                break
        else:
            # the usual case: every policy is the store's (asked with none too: its reply
            # carries the policy version)
            step.shared = planned
            return step
        try:
            _take_local(step, route.per_process_only, route.lone)
        except BaseException:
            vacate(place)
            raise
        return step

    def judge(self, step: Step, reply: tuple[Any, Decision | EngineError] | None) -> None:
        """The verdict on a step joined to the pass's, and what its store's reply said of
        the policy version (`version`): False when the snapshot is current (or the store
        was out of reach: the version waits for it), else the version to look for (None:
        the reply carried none)."""
        got = step.verdict
        if got is not None:  # refused before any engine was asked
            self.version = False
        else:
            ctx = self.ctx
            got, decision = judge_step(ctx, step, reply)
            state = ctx.state
            if step.place is not None:
                settle(state, step.place, got)
            # what an admitted request's response may take back or clear (see `settling`)
            if (self.route.settles and got.allowed
                    and any([p.policy.settles for p in step.planned])):
                state.pending = [*state.pending, *pending_of(step.planned, got)]
            if decision is UNREACHED:
                self.version = False
            else:
                state.version_seen = True
                # no store asked, or no version in its reply: `newer_snapshot` reads it
                version = None if decision is None else decision.version
                self.version = (False if version is not None and current(version, self.snap)
                                else version)
        self.verdict = got if self.verdict is None else self.verdict.merged(got)

    def stale(self) -> bool:
        """Whether a newer snapshot is to be looked for: a reply called for one, or no
        policy applied (a policy added since might: the version is read at most once per
        request); never after the pass on a newer one."""
        if self.second:
            return False
        if self.judged:
            return self.version is not False
        state = self.ctx.state
        if state.version_seen:
            return False
        state.version_seen = True
        self.version = None
        return True

    def moved_to(self, newer: Snapshot | None) -> bool:
        """Whether another pass runs, on `newer` (built by another process's change):
        only for a request still admitted."""
        if newer is None or (self.verdict is not None and not self.verdict.allowed):
            return False
        self.snap, self.second = newer, True
        self.route = route_of(self.ctx.base, self.ctx.method, self.ctx.scopes, newer)
        return True

    def ended(self) -> Verdict | None:
        verdict = self.verdict
        if verdict is not None and not verdict.allowed:
            self.ctx.state.pending = ()  # refused: nothing to charge or clear after it
        return verdict


def begin(request: Any, scopes: frozenset[str], sender: type,
          state: RequestState | None) -> Context | None:
    """What deciding `request` works from; None when rate limiting is off."""
    config = get_config()
    if not config["ENABLED"]:
        return None
    if state is None:
        state = state_for(request)
    base = getattr(request, "_request", request)  # the HttpRequest under a DRF Request
    method = (base.method or "GET").upper()
    return Context(request, base, state, method, scopes, sender, config)


def _tables_due() -> bool:
    """Whether the policy tables are due to be looked at again (see `_fresh`)."""
    return runtime.clock().monotonic() - process.db_checked_at >= DB_CHECK_EVERY


def _fresh(snap: Snapshot | None) -> Snapshot:
    """The compiled policies (`snap`: the ready snapshot, if any); loaded when none is,
    and the policy tables looked at again once `DB_CHECK_EVERY` has passed (both read
    the database)."""
    if snap is None:
        snap = resolver.snapshot()
    if _tables_due():
        snap = resolver.recheck(snap)
    return snap


async def _aplan(ctx: Context, route: Route, policies: list[Any],
                 snap: Snapshot) -> tuple[list[Planned], list[Any]]:
    """`plan` on the event loop: the user loaded first when a key reads it; in a thread
    when a key, a cost function or the tier runs your code."""
    if route.reads_user:
        await _load_user(ctx.base)
    if route.calls_code or (route.overridden and ctx.config["TIER"]):
        return await sync_to_async(plan)(ctx.request, policies, ctx.config, ctx.state,
                                         snap.members)
    return plan(ctx.request, policies, ctx.config, ctx.state, snap.members)


async def _load_user(base: Any) -> None:
    """`request.user` made concrete with `auser()`, so reading it runs no query here."""
    user = getattr(base, "user", None)
    auser = getattr(base, "auser", None)
    if auser is None or not isinstance(user, SimpleLazyObject):
        return
    if getattr(user, "_wrapped", empty) is empty:  # not evaluated yet
        base.user = await auser()


# -- the plan: local layers taken, the store's part left ---------------------------------


class Taken:
    """What one in-process engine answered for its policies (`own`)."""

    __slots__ = ("decision", "engine", "own", "receipt", "seconds")

    def __init__(self, engine: LocalLayer, own: list[Planned], decision: Decision, receipt: Any,
                 seconds: float) -> None:
        self.engine, self.own, self.decision = engine, own, decision
        self.receipt, self.seconds = receipt, seconds


class Step:
    """One pass's planned policies: the place it holds in the waiting room, what the
    local layers took (`taken`), and the store's part (`shared`: None when the store is
    not asked), sent by the driver. `undecided`: a layer refused, so neither the later
    ones nor the store were asked about these; `verdict`: decided before any engine was
    asked."""

    __slots__ = ("failed", "now", "place", "planned", "recorder", "shared", "started",
                 "taken", "undecided", "verdict")

    def __init__(self, planned: list[Planned], failed: list[Any], place: Any,
                 now: float | None, recorder: Any) -> None:
        self.planned, self.failed, self.place, self.now = planned, failed, place, now
        self.recorder, self.started = recorder, 0.0
        self.taken: list[Taken] = []
        self.shared: list[Planned] | None = None
        self.undecided: tuple[PolicyOutcome, ...] = ()
        self.verdict: Verdict | None = None


def _take_local(step: Step, per_process_only: bool = False, lone: bool = False) -> None:
    """Each in-process layer takes its policies: the adaptive ones first (a refusal there
    is the cheapest), then the per-process ones; the store's part is left when all
    admit and it has any. The route says when every policy is counted per process
    (`per_process_only`: none to sort), and when that is one policy (`lone`: the
    request's only layer, whose charge nothing refunds)."""
    if lone:
        local = get_local_engine()
        started = time.perf_counter()
        decision = local.take_one(step.planned[0].limit, step.now)
        step.taken.append(Taken(local, step.planned, decision, None,
                                time.perf_counter() - started))
        return  # no store part: `step.shared` stays None
    learned: list[Planned] = []
    own: list[Planned] = []
    shared: list[Planned] = []
    if per_process_only:
        own = step.planned
    else:
        for p in step.planned:
            policy = p.policy
            (learned if policy.learned else own if policy.counting == PER_PROCESS
             else shared).append(p)
    layers: list[tuple[Callable[[], LocalLayer], list[Planned]]] = [
        (get_adaptive_engine, learned), (get_local_engine, own)]
    for i, (engine_of, mine) in enumerate(layers):
        if not mine:
            continue
        engine = engine_of()
        started = time.perf_counter()
        decision, receipt = engine.take([p.limit for p in mine], step.now)
        step.taken.append(Taken(engine, mine, decision, receipt, time.perf_counter() - started))
        if not decision.allowed:  # the later layers and the store are not asked
            rest = [p for _, later in layers[i + 1:] for p in later] + shared
            step.undecided = tuple([PolicyOutcome(p.policy, p.identity) for p in rest])
            return
    step.shared = shared or None


# -- the store, asked: the drivers' one difference ---------------------------------------


def send(step: Step) -> tuple[Any, Decision | EngineError]:
    """The store's decision on the step's shared policies, or how it failed; with the
    engine asked (None when it could not be built: a cluster client needs a node)."""
    step.started = time.perf_counter()
    engine = None
    try:
        engine = get_engine()
        return engine, engine.evaluate([p.limit for p in step.shared or ()], step.now)
    except EngineError as exc:  # unreachable, read-only, out of memory ...
        return engine, exc


async def asend(step: Step) -> tuple[Any, Decision | EngineError]:
    """`send`, awaited on the event loop (see `engine.aio`)."""
    step.started = time.perf_counter()
    engine = None
    try:
        engine = get_engine()
        return engine, await engine.aevaluate([p.limit for p in step.shared or ()],
                                              step.now)
    except EngineError as exc:
        return engine, exc


# -- the judgement --------------------------------------------------------------------


def judge_step(ctx: Context, step: Step,
               reply: tuple[Any, Decision | EngineError] | None) -> tuple[Verdict, Any]:
    """(verdict, the store's decision: None when it was not asked, `UNREACHED` when it
    was out of reach). The innermost answer is judged first (the store's, or the layer
    that refused, or the last layer), then each layer taken before it, outwards; when
    the request is refused, what each of those took is given back."""
    taken = step.taken
    decision: Any = None
    if reply is not None:
        engine, answer = reply
        shared = step.shared or []
        if isinstance(answer, EngineError):
            verdict, decision = _unreached(ctx, step, shared, engine, answer), UNREACHED
        else:
            verdict, decision = _judged(ctx, step, shared, engine, answer), answer
        outer = taken
    else:
        inner = taken[-1]
        verdict = judge(ctx.request, ctx.state, inner.own, inner.decision, step.failed,
                        ctx.sender, ctx.config, prior=step.undecided)
        _held(ctx, step, inner)
        outer = taken[:-1]
    for layer in reversed(outer):
        if not verdict.allowed and layer.receipt is not None:
            layer.decision = layer.engine.refund(layer.receipt)
        verdict = verdict.merged(judge(ctx.request, ctx.state, layer.own, layer.decision,
                                       (), ctx.sender, ctx.config))
        _held(ctx, step, layer)
    return verdict, decision


def _held(ctx: Context, step: Step, layer: Taken) -> None:
    """A local layer's answer kept: its slots held, its latency timed (adaptive), counted
    in the store's counters, recorded."""
    engine, decision = layer.engine, layer.decision
    if decision.token is not None:
        hold(ctx.state, engine, decision)
        if layer.own[0].policy.learned:  # the adaptive layer: its latency is a sample
            adaptive_taken(ctx.request, get_adaptive_engine(), decision,
                           [p.policy.name for p in layer.own])
    count_in_store(engine, decision, step.now)
    if step.recorder is not None:
        step.recorder.decided(engine, layer.seconds,
                              [(p.policy, p.identity) for p in layer.own], decision)


def _judged(ctx: Context, step: Step, shared: list[Planned], engine: Any,
            decision: Decision) -> Verdict:
    """The verdict on the store's `decision` about the step's shared policies, recorded,
    its slots held."""
    if step.recorder is not None:
        step.recorder.decided(engine, time.perf_counter() - step.started,
                              [(p.policy, p.identity) for p in shared], decision)
    if watchdog.owed:  # the store answers again: free the slots an outage left held
        watchdog.answered()
    if decision.token is not None:
        hold(ctx.state, engine, decision)
    return judge(ctx.request, ctx.state, shared, decision, step.failed, ctx.sender,
                 ctx.config)


def _unreached(ctx: Context, step: Step, shared: list[Planned], engine: Any,
               exc: EngineError) -> Verdict:
    """The verdict when the store's `engine` failed with `exc` (None when it could not be
    built): the failed call counted as such, and each policy's `on_error` decides."""
    count_fallback([p.policy.name for p in shared], step.now)  # for the admin
    if engine is not None:
        if step.recorder is not None:
            step.recorder.unavailable(engine, time.perf_counter() - step.started,
                                      (p.policy for p in shared))
        if exc.taken is not None:  # the store may run the call yet: free what it takes
            watchdog.release_taken(engine, exc.taken, exc)
    return fallback(ctx.request, ctx.state, shared, step.failed, exc, ctx.sender,
                    ctx.config, engine, step.now)
