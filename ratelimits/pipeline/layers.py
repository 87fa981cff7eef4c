"""Where the planned policies are decided: in this process, layer by layer (the adaptive
ones, then the per-process ones), and in the store, all or nothing."""

from __future__ import annotations

from typing import Any

from ratelimits.engine.errors import EngineError
from ratelimits.engine.interfaces import Engine
from ratelimits.engine.types import Decision
from ratelimits.pipeline.context import Context
from ratelimits.pipeline.drivers import Steps, StoreCall
from ratelimits.pipeline.engines import (
    count_in_store,
    get_adaptive_engine,
    get_engine,
    get_local_engine,
)
from ratelimits.pipeline.outage import UNREACHED, unreached
from ratelimits.pipeline.plan import Planned
from ratelimits.pipeline.recording import Timed
from ratelimits.pipeline.release import adaptive_taken
from ratelimits.pipeline.resolver import PER_PROCESS
from ratelimits.pipeline.verdict import PolicyOutcome, Verdict
from ratelimits.pipeline.watchdog import hold, watchdog

#: An in-process engine and the planned policies it decides.
Layer = tuple[Any, list[Planned]]


def decide_planned(ctx: Context, planned: list[Planned], failed: list[Any]) -> Steps:
    """(verdict, the store's decision): None when the store was not asked, `UNREACHED`
    when it was out of reach."""
    layers = local_layers(planned)
    if not layers:
        return (yield from _decide_shared(ctx, planned, failed))
    shared = [p for p in planned
              if p.policy.counting != PER_PROCESS and not p.limit.spec.learned]
    return (yield from _decide_local(ctx, layers, shared, failed))


def _decide_shared(ctx: Context, planned: list[Planned], failed: list[Any]) -> Steps:
    """The store decides `planned` in one call; (verdict, its decision or `UNREACHED`)."""
    timed = Timed(ctx.config)
    engine: Engine | None = None
    try:
        engine = get_engine()  # a cluster client needs a reachable node to be built
        decision = yield StoreCall(engine, [p.limit for p in planned], ctx.now())
    except EngineError as exc:  # unreachable, read-only, out of memory ...
        return unreached(ctx, planned, failed, exc, engine=engine, timed=timed), UNREACHED
    return _judged(ctx, planned, failed, engine, timed, decision), decision


def decide_shared_now(
    ctx: Context, planned: list[Planned], failed: list[Any]
) -> tuple[Verdict, Any]:
    """`decide_planned` for a blocking caller when every policy of `planned` is counted
    in the store (`local_layers` found none): the store asked in place, no flow."""
    timed = Timed(ctx.config)
    engine: Engine | None = None
    try:
        engine = get_engine()
        decision = engine.evaluate([p.limit for p in planned], ctx.now())
    except EngineError as exc:
        return unreached(ctx, planned, failed, exc, engine=engine, timed=timed), UNREACHED
    return _judged(ctx, planned, failed, engine, timed, decision), decision


def _judged(ctx: Context, planned: list[Planned], failed: list[Any], engine: Engine,
            timed: Timed, decision: Decision) -> Verdict:
    """The verdict on the store's `decision` about `planned`, recorded, its slots held."""
    timed.decided(engine, timed.lap(), planned, decision)
    if watchdog.owed:  # the store answers again: free the slots an outage left held
        watchdog.answered()
    if decision.token is not None:
        hold(ctx.state, engine, decision)
    return ctx.judge(planned, decision, failed)


def local_layers(planned: list[Planned]) -> list[Layer]:
    """The policies decided in this process, each kind with its engine: the adaptive
    ones first (a refusal there is the cheapest), then the per-process ones."""
    layers: list[Layer] = []
    for p in planned:
        if p.policy.in_process:
            break
    else:
        return layers  # the usual case: every policy is the store's
    learned = [p for p in planned if p.limit.spec.learned]
    if learned:
        layers.append((get_adaptive_engine(), learned))
    own = [p for p in planned if p.policy.counting == PER_PROCESS and not p.limit.spec.learned]
    if own:
        layers.append((get_local_engine(), own))
    return layers


def _decide_local(
    ctx: Context, layers: list[Layer], shared: list[Planned], failed: list[Any]
) -> Steps:
    """Each layer of in-process policies in its engine, in order; the shared ones in the
    store only if all of those admit; and what a layer took given back if a later one
    (or the store, or its `on_error`) refuses: all or nothing."""
    (engine, own), rest = layers[0], layers[1:]
    timed = Timed(ctx.config)
    now = ctx.now()
    mine, receipt = engine.take([p.limit for p in own], now)
    seconds = timed.lap()
    decision: Decision | None = None
    if not mine.allowed or not (rest or shared):
        # decided here: the later layers and the store are not asked
        undecided = tuple(PolicyOutcome(p.policy, p.identity)
                          for p in [*(p for _, later in rest for p in later), *shared])
        verdict = ctx.judge(own, mine, failed, prior=undecided)
    else:
        if rest:
            verdict, decision = yield from _decide_local(ctx, rest, shared, failed)
        else:
            verdict, decision = yield from _decide_shared(ctx, shared, failed)
        if not verdict.allowed and receipt is not None:
            mine = engine.refund(receipt)
        verdict = verdict.merged(ctx.judge(own, mine, ()))
    if mine.token is not None:
        hold(ctx.state, engine, mine)
        if own[0].limit.spec.learned:  # the adaptive layer: its latency is a sample
            adaptive_taken(ctx.request, engine, mine, [p.policy.name for p in own])
    count_in_store(engine, mine, now)
    timed.decided(engine, seconds, own, mine)
    return verdict, decision
