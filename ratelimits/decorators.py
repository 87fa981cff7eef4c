"""`@ratelimit`: a limit declared on a view in code, managed in the admin like any policy.

    from ratelimits.decorators import ratelimit

    @ratelimit(name="login", rate="5/m", key="ip", algorithm="sliding_log", methods="POST")
    def login(request): ...

    @method_decorator(ratelimit(name="search", rate="100/10m", key="user_or_ip"),
                      name="dispatch")
    class Search(View): ...

The limit becomes a policy row marked *declared in code* (see `pipeline.declared`): its
rate, key and methods are the code's; its mode, rollout, on_error and overrides are the
operator's. With `RateLimitMiddleware` installed, a decorated view's request is decided
in one call with the site's other policies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async

from ratelimits.pipeline import evaluation
from ratelimits.pipeline.declared import SCOPES_ATTR, registry
from ratelimits.pipeline.state import RequestState, state_for
from ratelimits.pipeline.verdict import Verdict
from ratelimits.rates import parse_rate

__all__ = ["ratelimit"]

F = TypeVar("F", bound=Callable[..., Any])



def ratelimit(
    *,
    name: str,
    rate: str,
    key: str = "ip",
    algorithm: str = "sliding_window",
    methods: str | list[str] | tuple[str, ...] = "",
    mode: str = "enforce",
    burst: int | None = None,
    cost: int = 1,
    max_wait: float = 0,
    warmup: int = 0,
) -> Callable[[F], F]:
    """Limit the decorated view to `rate` ("5/m", "100/10m", "1000/h") per `key`.

    `name` names the policy (in the admin, logs and headers); `methods` limits only
    those methods (empty: all); `mode` is the policy's mode when it is first created:
    "enforce", "shadow" or "off" (an operator may change it later in the admin);
    `burst`, `cost`, `max_wait` and `warmup` are the policy fields of those names.
    A mistake raises ImproperlyConfigured when the module is imported.
    """
    from django.core.exceptions import ImproperlyConfigured

    try:
        limit, period = parse_rate(rate)
    except ValueError as exc:
        raise ImproperlyConfigured(f"@ratelimit(name={name!r}): {exc}") from None
    if not isinstance(methods, str):
        methods = ",".join(methods)
    declaration = registry.declare(
        name, mode, algorithm=algorithm, limit=limit, period=period, burst=burst, cost=cost,
        max_wait=max_wait, warmup=warmup, key=key, methods=methods,
    )
    scope = declaration.scope

    def decorate(view: F) -> F:
        return _wrap(view, frozenset({scope, *getattr(view, SCOPES_ATTR, ())}))

    return decorate


def _wrap(view: F, scopes: frozenset[str]) -> F:
    """`view` deciding `scopes` (its own declarations and those of the decorators it
    already had: one decision for all) before it runs."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def limited_async(request: Any, *args: Any, **kwargs: Any) -> Any:
            state = state_for(request)
            verdict = await sync_to_async(_decide)(request, state, scopes)
            if verdict is not None and verdict.delay > 0:
                verdict = await evaluation.await_turn(verdict)
            if verdict is not None and not verdict.allowed:
                return await sync_to_async(_refused)(request, state, verdict)
            try:
                response = await view(request, *args, **kwargs)
            except BaseException:
                await sync_to_async(_failed)(request, state)
                raise
            return await sync_to_async(_finished)(request, state, response)

        setattr(limited_async, SCOPES_ATTR, scopes)
        return limited_async  # type: ignore[return-value]

    @functools.wraps(view)
    def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
        state = state_for(request)
        verdict = _decide(request, state, scopes)
        if verdict is not None and verdict.delay > 0:
            verdict = evaluation.wait_turn(verdict)
        if verdict is not None and not verdict.allowed:
            return _refused(request, state, verdict)
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            _failed(request, state)
            raise
        return _finished(request, state, response)

    setattr(limited, SCOPES_ATTR, scopes)
    return limited  # type: ignore[return-value]


class RateLimitDecorator:
    """The `sender` of the signals a decorated view's decisions send."""


def _decide(request: Any, state: RequestState, scopes: frozenset[str]) -> Verdict | None:
    # Left to us by the middleware: the site's unscoped policies too, in the same call.
    if state.deferred:
        scopes = scopes | evaluation.UNSCOPED
    state.throttled = True
    return evaluation.evaluate(request, scopes=scopes, sender=RateLimitDecorator,
                               state=state)


def _refused(request: Any, state: RequestState, verdict: Verdict) -> Any:
    from ratelimits.pipeline.responses import rejection_response

    return _finished(request, state, rejection_response(request, verdict))


def _finished(request: Any, state: RequestState, response: Any) -> Any:
    """Headers and slots: the middleware's job when it is installed, else ours."""
    if state.middleware:
        return response
    from ratelimits.middleware import finish

    return finish(request, state, response)


def _failed(request: Any, state: RequestState) -> None:
    if not state.middleware:
        evaluation.release(request, state)
