"""The decision on one request, written once as a flow (see `drivers`), and run in place
for a blocking caller where it can be (`decide_now`).

It picks the policies for the request's scopes from the snapshot (resolver), identifies
the client (plan), takes a place in the waiting room when a policy may delay it
(waiting), has the in-process engines and the store decide them (layers), and,
when the store's reply says another process changed the policies, decides the ones this
request has not met yet on the newer snapshot (version). What was charged is recorded in
the request's state, so a policy charges a request at most once however many glue layers
look at it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.matching.keykinds import KEY_KINDS
from ratelimits.matching.paths import normalize_path
from ratelimits.pipeline.context import Context
from ratelimits.pipeline.drivers import Blocking, Steps, UserLoad, run
from ratelimits.pipeline.layers import decide_planned, decide_shared_now, local_layers
from ratelimits.pipeline.outage import UNREACHED
from ratelimits.pipeline.plan import plan
from ratelimits.pipeline.resolver import DB_CHECK_EVERY, Snapshot, resolver
from ratelimits.pipeline.routing import (
    VIEW_NAMED_METHODS,
    admin_lets_in,
    answered_as_get,
    is_exempt,
    redirects_with_slash,
    under_admin,
)
from ratelimits.pipeline.settling import pending_of
from ratelimits.pipeline.state import RequestState, http_request, process, state_for
from ratelimits.pipeline.verdict import Verdict, denies, unidentified
from ratelimits.pipeline.version import current, newer_snapshot
from ratelimits.pipeline.waiting import seat, settle, vacate


def decide_flow(
    request: Any, scopes: frozenset[str], sender: type, state: RequestState | None = None
) -> Steps:
    """The verdict on `request` for the policies of `scopes`; None when nothing applies."""
    ctx = _context(request, scopes, sender, state)
    if ctx is None:
        return None
    alone = _seen(ctx)
    if alone is None:
        alone = yield from _left_alone(ctx)
    if alone:
        return None
    snap = resolver.ready()
    if snap is None or _tables_due():
        snap = yield from _snapshot(snap)
    return _ended(ctx.state, (yield from _decide(ctx, snap)))


def decide_now(
    request: Any, scopes: frozenset[str], sender: type, state: RequestState | None = None
) -> Verdict | None:
    """`decide_flow` for a blocking caller, straight through.

    The same steps in the same order, but the usual path (the request's path looked at,
    the snapshot current, every policy counted in the store, the reply's version the
    snapshot's) calls them in place instead of through a generator per step: a flow's
    machinery costs more than those steps themselves. Anything else (a first look at an
    admin path, a snapshot to load, an in-process layer, a newer version) runs the
    flow's own step, with the blocking driver.
    """
    ctx = _context(request, scopes, sender, state)
    if ctx is None:
        return None
    alone = _seen(ctx)
    if alone is None:
        alone = run(_left_alone(ctx))
    if alone:
        return None
    snap = resolver.ready()
    if snap is None or _tables_due():
        snap = run(_snapshot(snap))
    return _ended(ctx.state, _decide_now(ctx, snap))


def _context(
    request: Any, scopes: frozenset[str], sender: type, state: RequestState | None
) -> Context | None:
    """What deciding `request` works from; None when rate limiting is off."""
    config = get_config()
    if not config["ENABLED"]:
        return None
    if state is None:
        state = state_for(request)
    base = http_request(request)
    method = (base.method or "GET").upper()
    as_get = method not in VIEW_NAMED_METHODS and answered_as_get(base)
    return Context(request, state, method, scopes, sender, config, as_get)


def _seen(ctx: Context) -> bool | None:
    """`_left_alone`'s answer when no blocking call is needed to reach it: None when the
    exemption (`EXEMPT`) is still to be asked, or the path is a first seen admin one."""
    state = ctx.state
    if state.exempt is None and ctx.config["EXEMPT"]:
        return None
    if state.exempt:
        return True
    if state.path is None:
        if not ctx.config["LIMIT_ADMIN"] and under_admin(ctx.base):
            return None  # whether the admin lets this user in reads the user
        return _redirected(state, ctx.base)
    return False


def _redirected(state: RequestState, base: Any) -> bool:
    """The request's path, seen for the first time: kept in `state`; whether
    CommonMiddleware redirects it to the path with a slash (then it is exempt)."""
    state.path = normalize_path(base.path_info)
    if not base.path_info.endswith("/") and redirects_with_slash(base):
        state.exempt = True
    return bool(state.exempt)


def _tables_due() -> bool:
    """Whether the policy tables are due to be looked at again (see `_snapshot`)."""
    return runtime.clock().monotonic() - process.db_checked_at >= DB_CHECK_EVERY


def _ended(state: RequestState, verdict: Verdict | None) -> Verdict | None:
    if verdict is not None and not verdict.allowed:
        state.pending = ()  # refused: nothing to charge or clear after its response
    return verdict


def _left_alone(ctx: Context) -> Steps:
    """Whether no policy looks at this request: `EXEMPT` exempts it, CommonMiddleware
    redirects it to its path with a slash (the redirected request is the one charged), or
    it is an admin page asked for by a user the admin lets in (unless `LIMIT_ADMIN`)."""
    state, base = ctx.state, ctx.base
    if state.exempt is None and ctx.config["EXEMPT"]:
        yield Blocking(is_exempt, base, state, ctx.config)
    if state.exempt:
        return True
    if state.path is None:
        if _redirected(state, base):
            return True
        if not ctx.config["LIMIT_ADMIN"] and under_admin(base) and (
            yield Blocking(admin_lets_in, base)
        ):
            state.exempt = True
            return True
    return False


def _snapshot(snap: Snapshot | None) -> Steps:
    """The compiled policies (`snap`: the ready snapshot, if any); loaded when none is,
    and the policy tables looked at again once `DB_CHECK_EVERY` has passed (both from the
    database: blocking calls)."""
    if snap is None:
        snap = yield Blocking(resolver.snapshot)
    if _tables_due():
        snap = yield Blocking(resolver.recheck, snap)
    return snap


def _decide(ctx: Context, snap: Snapshot, *, second_pass: bool = False) -> Steps:
    """The verdict on the policies of `snap` this request matches and has not met yet;
    `second_pass`: on a newer snapshot, after the first one's decision."""
    state = ctx.state
    policies = snap.matching(state.path or "/", ctx.method, ctx.scopes, state.charged,
                             ctx.as_get)
    if not policies:
        return (yield from _none_match(ctx, snap, second_pass))
    planned, failed = yield from _plan(ctx, snap, policies)
    if failed and denies(failed):
        return _unidentified(state, policies, planned)
    planned, place = seat(ctx, planned)  # a place to wait in, taken before any turn is
    state.charged.update(p.id for p in policies)
    try:
        verdict, decision = yield from decide_planned(ctx, planned, failed)
    except BaseException:  # a cancelled task too (the driver throws it in here)
        vacate(place)
        raise
    if _done(ctx, snap, planned, place, verdict, decision):
        return verdict
    return (yield from _newer(ctx, snap, verdict, decision, second_pass))


def _decide_now(ctx: Context, snap: Snapshot) -> Verdict | None:
    """`_decide` in place (see `decide_now`); a blocking caller's `_plan` is `plan`."""
    state = ctx.state
    policies = snap.matching(state.path or "/", ctx.method, ctx.scopes, state.charged,
                             ctx.as_get)
    if not policies:
        verdict: Verdict | None = run(_none_match(ctx, snap, False))
        return verdict
    planned, failed = plan(ctx.request, policies, ctx.config, state, snap.members)
    if failed and denies(failed):
        return _unidentified(state, policies, planned)
    planned, place = seat(ctx, planned)
    state.charged.update(p.id for p in policies)
    try:
        if local_layers(planned):
            verdict, decision = run(decide_planned(ctx, planned, failed))
        else:
            verdict, decision = decide_shared_now(ctx, planned, failed)
    except BaseException:
        vacate(place)
        raise
    if _done(ctx, snap, planned, place, verdict, decision):
        return verdict
    newer: Verdict = run(_newer(ctx, snap, verdict, decision, False))
    return newer


def _unidentified(state: RequestState, policies: Sequence[Any], planned: list[Any]) -> Verdict:
    """A policy that could not identify the client refuses the request (`verdict.denies`):
    a 503 before any engine is asked, so a request refused anyway charges no policy, and
    takes no place or slot (see `verdict.unidentified`)."""
    state.charged.update(p.id for p in policies)
    return unidentified(planned)


def _done(ctx: Context, snap: Snapshot, planned: list[Any], place: Any, verdict: Verdict,
          decision: Any) -> bool:
    """After the decision: the waiting place settled, what the response may charge or
    clear kept; whether that is all (the store's reply says `snap` is current, or the
    store was out of reach: the version waits for it)."""
    state = ctx.state
    settle(state, place, verdict)
    # what an admitted request's response may take back or clear (see `settling`)
    if verdict.allowed and any(p.policy.settles for p in planned):
        state.pending = [*state.pending, *pending_of(planned, verdict)]
    if decision is UNREACHED:
        return True
    state.version_seen = True
    return current(None if decision is None else decision.version, snap)


def _newer(ctx: Context, snap: Snapshot, verdict: Verdict, decision: Any,
           second_pass: bool) -> Steps:
    """Another process changed the policies: load them and apply the ones this request
    has not met yet (already-charged policies are never charged twice)."""
    newer = yield from newer_snapshot(None if decision is None else decision.version, snap,
                                      ctx.config)
    if newer is not None and verdict.allowed and not second_pass:
        extra = yield from _decide(ctx, newer, second_pass=True)
        if extra is not None:
            verdict = verdict.merged(extra)
    return verdict


def _none_match(ctx: Context, snap: Snapshot, second_pass: bool) -> Steps:
    """No policy applies: nothing to decide, but a policy added since may apply."""
    if ctx.state.version_seen or second_pass:
        return None
    ctx.state.version_seen = True
    newer = yield from newer_snapshot(None, snap, ctx.config)
    if newer is None:
        return None
    return (yield from _decide(ctx, newer, second_pass=True))


def _plan(ctx: Context, snap: Snapshot, policies: Sequence[Any]) -> Steps:
    """(planned, failed) for `policies` (see `plan.plan`): the user loaded first when a
    key reads it; in a thread when a key, the tier or a cost function runs your code."""
    kinds = {p.key_spec.kind for p in policies}
    if kinds & KEY_KINDS.reads_user:
        yield UserLoad(ctx.request)
    config = ctx.config
    if (kinds & KEY_KINDS.calls_code or any(p.cost_of for p in policies)
            or (config["TIER"] and any(p.overrides for p in policies))):
        return (yield Blocking(plan, ctx.request, policies, config, ctx.state, snap.members))
    return plan(ctx.request, policies, config, ctx.state, snap.members)
