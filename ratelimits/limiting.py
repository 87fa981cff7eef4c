"""Limits outside requests: `limit()`, the admin's policies for outbound calls, tasks and
any other work a process does.

``with limit("partner-api", rate="10/s", timeout=30):`` waits for a turn of the policy
`partner-api` (declared in code when `rate` is given, as `@ratelimit` declares one, so an
operator sees it in the admin, switches it to shadow or off, rolls it out or overrides a
client), then runs the block; past `timeout` it raises `Limited` instead. The same object
decorates a function, and ``async with`` awaits the turn on the event loop.

The decision is the engine's, as for a request: a store policy is decided in the store
(its reserving algorithms serve callers in the order they asked, across every process), a
`per_process` one in this process. The store counts each decision in the policy's figures
(the admin's counters, charts and offenders, `ratelimits status`); a shadow policy never
waits and counts the calls it would have refused; an `off` policy (or none of that name)
lets every call through; when the store is out of reach, the policy's `on_error` decides.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from ratelimits import runtime
from ratelimits.engine.errors import EngineError
from ratelimits.engine.types import Decision
from ratelimits.matching.identity import bounded
from ratelimits.pipeline.compiled import PER_PROCESS, CompiledPolicy, Snapshot
from ratelimits.pipeline.declared import registry
from ratelimits.pipeline.engines import get_engine, get_local_engine
from ratelimits.pipeline.fallback import live_instances, local_share
from ratelimits.pipeline.report import log_unavailable
from ratelimits.pipeline.resolver import resolver
from ratelimits.rates import parse_rate

__all__ = ["DEFAULT_TIMEOUT", "Limited", "limit"]

logger = logging.getLogger("ratelimits")

F = TypeVar("F", bound=Callable[..., Any])
#: What a turn holds until its block ends: the engine and the decision whose slots it
#: releases (None: nothing to give back).
Held = tuple[Any, Decision] | None

#: Seconds a call waits for its turn when neither `timeout` nor the policy's `max_wait`
#: says: long enough to ride out a burst of a few seconds, short enough that a worker
#: slot is not held for what a task queue's retry does better.
DEFAULT_TIMEOUT = 10.0
#: The identity every call shares when `limit()` names no client.
SHARED = "global"


class _InstalledClock:
    """The app's installed clock as `acquire` waits with it: a test's clock moves on
    `sleep()` without sleeping, and the engine decides at its time."""

    def __init__(self, clock: runtime.Clock) -> None:
        self.now, self.sleep = clock.time, clock.sleep


def _waiting() -> _InstalledClock | None:
    """What `acquire` waits with: None under the real clock (the store's time decides)."""
    current = runtime.clock()
    return None if current is runtime.REAL else _InstalledClock(current)


class Limited(Exception):
    """`limit()` could not get a turn within its timeout: `retry_after` seconds (more
    than zero) until one could pass; `policy` is the policy's name."""

    def __init__(self, policy: str, retry_after: float) -> None:
        self.policy = policy
        self.retry_after = retry_after
        # its arguments are its fields: pickle, and Celery's result backends (JSON too),
        # make it again as `Limited(*args)`
        super().__init__(policy, retry_after)

    def __str__(self) -> str:
        return (f"rate limit {self.policy!r}: no turn within the timeout; retry in "
                f"{self.retry_after:g} s")


class limit:
    """Wait for a turn of policy `name`, as a context manager, an async context manager
    or a decorator.

    `rate` ("10/s", "100/h") declares the policy in code, with `algorithm` (default
    "gcra": waiters are served in the order they asked) and `burst`, and `mode`, the mode
    it starts in; without `rate`, `name` is a policy of the admin's. `key` names the
    client counted (a tenant, an API key: each has its own count, as `key:<value>`);
    None shares one count. `cost` charges several units. `timeout` is how long to wait
    for a turn (None: the policy's `max_wait`, else `DEFAULT_TIMEOUT`; 0: never wait);
    past it, `Limited` is raised.
    """

    def __init__(self, name: str, *, rate: str | None = None, key: Any = None, cost: int = 1,
                 timeout: float | None = None, algorithm: str = "gcra",
                 burst: int | None = None, mode: str = "enforce") -> None:
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise ImproperlyConfigured(f"limit({name!r}): cost must be a positive integer, "
                                       f"not {cost!r}")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0
                                    or math.isnan(timeout)):
            raise ImproperlyConfigured(f"limit({name!r}): timeout must be a number of "
                                       f"seconds, 0 or more, not {timeout!r}")
        self.name, self.cost, self.timeout = name, cost, timeout
        self.identity = SHARED if key is None else bounded("key", str(key))
        if rate is not None:
            try:
                per, period = parse_rate(rate)
            except ValueError as exc:
                raise ImproperlyConfigured(f"limit({name!r}): {exc}") from None
            registry.declare(name, mode, algorithm=algorithm, limit=per, period=period,
                             burst=burst, cost=1, max_wait=0, warmup=0, key="global",
                             methods="")
        #: What each `with` took and must give back at its end (concurrency slots), per
        #: thread and task, by nesting: one object may be entered again before it left.
        self._held: contextvars.ContextVar[tuple[Held, ...]] = contextvars.ContextVar(
            f"ratelimits.limit({name})", default=())

    # -- the turn ---------------------------------------------------------------------

    def _policy(self, snap: Snapshot) -> CompiledPolicy | None:
        for policy in snap.policies:
            if policy.name == self.name:
                return policy
        return None  # off, or no such policy: nothing limits the call

    def _limit(self, policy: CompiledPolicy) -> Any:
        rule = None
        if policy.overrides is not None:
            rule = policy.overrides.find(self.identity, runtime.clock().time(),
                                         lambda: (), lambda: None)
            if rule is not None and rule.exempt:
                return None
        found = policy.limit_for(self.identity, rule)
        if found.cost != self.cost:  # never more than the limit can hold: a full allowance
            found = dataclasses.replace(found, cost=min(self.cost, found.capacity))
        return found

    def _wait(self, policy: CompiledPolicy) -> float:
        if self.timeout is not None:
            return float(self.timeout)
        return policy.template.max_wait or DEFAULT_TIMEOUT

    def _asked(self, snap: Snapshot) -> tuple[CompiledPolicy, Any] | None:
        """The policy and the limit a call asks of `snap`; None when nothing limits it
        (no enabled policy of that name, or an override exempts its key)."""
        policy = self._policy(snap)
        if policy is None:
            return None
        wanted = self._limit(policy)
        return None if wanted is None else (policy, wanted)

    @staticmethod
    def _engine(policy: CompiledPolicy) -> Any:
        """The engine that decides `policy`: this process's for a per-process one."""
        return get_local_engine() if policy.counting == PER_PROCESS else get_engine()

    def _take(self) -> Held:
        snap = resolver.snapshot()
        asked = self._asked(snap)
        if asked is None:
            return None
        policy, wanted = asked
        engine: Any = None
        try:
            engine = self._engine(policy)
            # shadow: watched only, never waits, its would-be refusals counted as such
            decision = (engine.evaluate([wanted], runtime.decision_time()) if wanted.shadow
                        else engine.acquire([wanted], self._wait(policy), clock=_waiting()))
        except EngineError as exc:
            return self._unreached(policy, wanted, engine, exc)
        resolver.observe(decision.version, snap)
        return self._judged(policy, engine, decision)

    async def _atake(self) -> Held:
        """`_take` on the event loop: the store awaited, the policy tables read in a
        thread when they must be."""
        engine: Any = None
        snap = resolver.ready() or await sync_to_async(resolver.snapshot)()
        asked = self._asked(snap)
        if asked is None:
            return None
        policy, wanted = asked
        try:
            engine = self._engine(policy)
            decision = await (engine.aevaluate([wanted]) if wanted.shadow
                              else engine.aacquire([wanted], self._wait(policy)))
        except EngineError as exc:  # on_error "local" may wait: in a thread
            return await sync_to_async(self._unreached)(policy, wanted, engine, exc)
        if resolver.outdates(decision.version, snap):  # another process changed them
            await sync_to_async(resolver.observe)(decision.version, snap)
        return self._judged(policy, engine, decision)

    def _judged(self, policy: CompiledPolicy, engine: Any, decision: Decision) -> Held:
        for result in decision.results:
            if not result.allowed and result.limit.shadow:
                logger.warning("ratelimits: shadow policy %s would refuse a call (key %s)",
                               policy.name, self.identity)
        if not decision.allowed:
            raise Limited(policy.name, max(decision.retry_after, 1))
        return (engine, decision) if decision.token is not None else None

    def _unreached(self, policy: CompiledPolicy, wanted: Any, engine: Any,
                   exc: EngineError) -> Held:
        """The store did not answer: the policy's `on_error` decides."""
        from ratelimits.conf import get_config

        config = get_config()
        log_unavailable(exc, config)
        if wanted.shadow or policy.on_error == "allow":
            return None
        if policy.on_error == "deny":
            raise Limited(policy.name, 1)
        local = get_local_engine()
        store = engine if engine is not local else None
        share = local_share(wanted, live_instances(store, config))
        decision = local.acquire([share], self._wait(policy), clock=_waiting())
        return self._judged(policy, local, decision)

    @staticmethod
    def _give_back(held: Held) -> None:
        if held is None:
            return
        engine, decision = held
        try:
            engine.release(decision)
        except EngineError:  # the slot expires with its period
            logger.warning("ratelimits: could not release a concurrency slot; it is freed "
                           "when its period ends")

    # -- the three shapes ---------------------------------------------------------------

    def __enter__(self) -> limit:
        self._held.set((*self._held.get(), self._take()))
        return self

    def __exit__(self, *exc: object) -> None:
        *rest, held = self._held.get()
        self._held.set(tuple(rest))
        self._give_back(held)

    async def __aenter__(self) -> limit:
        self._held.set((*self._held.get(), await self._atake()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        *rest, held = self._held.get()
        self._held.set(tuple(rest))
        if held is not None:
            await sync_to_async(self._give_back)(held)

    def __call__(self, function: F) -> F:
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def awaited(*args: Any, **kwargs: Any) -> Any:
                held = await self._atake()
                try:
                    return await function(*args, **kwargs)
                finally:
                    if held is not None:
                        await sync_to_async(self._give_back)(held)

            return awaited  # type: ignore[return-value]

        @functools.wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            held = self._take()
            try:
                return function(*args, **kwargs)
            finally:
                self._give_back(held)

        return called  # type: ignore[return-value]
