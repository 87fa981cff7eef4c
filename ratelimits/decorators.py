"""`@ratelimit`: a limit declared on a view in code, managed in the admin like any policy::

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async

from ratelimits.pipeline import evaluation, settling
from ratelimits.pipeline.declared import SCOPES_ATTR, registry
from ratelimits.pipeline.state import RequestState, http_request, state_for
from ratelimits.pipeline.verdict import Verdict
from ratelimits.rates import parse_rate

__all__ = ["Refusal", "ratelimit", "run_view"]

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute a decorated view carries besides its scopes: how it answers a refusal by
#: each of them (stacked decorators decide together, each keeping its own answer).
REFUSAL_ATTR = "ratelimit_refusal"

#: What `raise_on_refusal` takes: an exception class, or a function making the exception.
Raising = Callable[[], BaseException]


def ratelimit(
    *,
    name: str,
    rate: str,
    key: str | Callable[[Any], Any] = "ip",
    algorithm: str = "sliding_window",
    methods: str | list[str] | tuple[str, ...] = "",
    mode: str = "enforce",
    burst: int | None = None,
    cost: int | Callable[[Any], int] = 1,
    max_wait: float = 0,
    warmup: int = 0,
    charge_on: str = "",
    reset_on: str = "",
    lockout: int = 0,
    calendar: str = "",
    block: bool = True,
    raise_on_refusal: Raising | None = None,
) -> Callable[[F], F]:
    """Limit the decorated view to `rate` ("5/m", "100/10m", "1000/h") per `key`.

    `name` names the policy (in the admin, logs and headers); `key` is a key kind
    ("ip", "user", "header:X-Api-Key" ...) or a function of the request returning the
    client's identity (None: the limit does not apply); `methods` limits only those
    methods (empty: all); `mode` is the policy's mode when it is first created:
    "enforce", "shadow" or "off" (an operator may change it later in the admin);
    `burst`, `cost`, `max_wait`, `warmup`, `charge_on`, `reset_on`, `lockout` and
    `calendar` are the policy fields of those names; `cost` may also be a function of
    the request returning its cost (a positive integer).
    A refused request gets a 429, or with `raise_on_refusal` (an exception class, or a
    function returning the exception) that exception is raised; with `block=False` the
    view runs anyway and reads `request.limited` (True). A mistake raises
    ImproperlyConfigured when the module is imported.
    """
    from django.core.exceptions import ImproperlyConfigured

    try:
        limit, period = parse_rate(rate)
    except ValueError as exc:
        raise ImproperlyConfigured(f"@ratelimit(name={name!r}): {exc}") from None
    if not isinstance(methods, str):
        methods = ",".join(methods)
    reader = None if isinstance(key, str) else key
    cost_of = cost if callable(cost) else None
    declaration = registry.declare(
        name, mode, reader=reader, cost_of=cost_of, algorithm=algorithm, limit=limit,
        period=period, burst=burst, cost=1 if cost_of else cost, max_wait=max_wait,
        warmup=warmup, key=key if isinstance(key, str) else "", methods=methods,
        charge_on=charge_on, reset_on=reset_on, lockout=lockout, calendar=calendar,
    )
    scope = declaration.scope
    own = Refusal(frozenset() if block else frozenset({scope}),
                  {} if raise_on_refusal is None else {scope: raise_on_refusal})

    def decorate(view: F) -> F:
        inner: Refusal = getattr(view, REFUSAL_ATTR, Refusal())
        return _wrap(view, frozenset({scope, *getattr(view, SCOPES_ATTR, ())}),
                     own.joined(inner))

    return decorate


@dataclass(frozen=True)
class Refusal:
    """How a decorated view answers a refusal by its own limits (by scope): a 429 (the
    default), the view run anyway with `request.limited` (`lenient`), or an exception
    raised (`raising`)."""

    lenient: frozenset[str] = frozenset()
    raising: Mapping[str, Raising] = field(default_factory=dict)

    def joined(self, inner: Refusal) -> Refusal:
        """This decorator's answers and those of the decorators below it."""
        return Refusal(self.lenient | inner.lenient, {**inner.raising, **self.raising})


def _wrap(view: F, scopes: frozenset[str], refusal: Refusal) -> F:
    """`view` deciding `scopes` (its own declarations and those of the decorators it
    already had: one decision for all) before it runs."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def limited_async(request: Any, *args: Any, **kwargs: Any) -> Any:
            state = state_for(request)
            verdict = await sync_to_async(_decide)(request, state, scopes)
            if verdict is not None and verdict.delay > 0:
                verdict = await evaluation.await_turn(verdict)
            answer = await sync_to_async(_answer)(request, state, scopes, refusal, verdict)
            if answer is not None:
                return answer
            try:
                response = await view(request, *args, **kwargs)
            except BaseException as exc:
                await sync_to_async(_failed)(request, state, exc)
                raise
            return await sync_to_async(_finished)(request, state, response)

        setattr(limited_async, SCOPES_ATTR, scopes)
        setattr(limited_async, REFUSAL_ATTR, refusal)
        return limited_async  # type: ignore[return-value]

    @functools.wraps(view)
    def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
        return run_view(view, request, args, kwargs, scopes, refusal)

    setattr(limited, SCOPES_ATTR, scopes)
    setattr(limited, REFUSAL_ATTR, refusal)
    return limited  # type: ignore[return-value]


def run_view(
    view: Callable[..., Any],
    request: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    scopes: frozenset[str],
    refusal: Refusal,
    state: RequestState | None = None,
    settle: Callable[[Verdict | None], Verdict | None] | None = None,
) -> Any:
    """Decide `scopes` for `request`, then run `view` or answer the refusal as
    `refusal` says; headers and slots are handled as the decorator does. `settle`, given
    the verdict, returns the one to act on (the compat layer's own reading of it)."""
    if state is None:
        state = state_for(request)
    verdict = _decide(request, state, scopes)
    if settle is not None:
        verdict = settle(verdict)
    if verdict is not None and verdict.delay > 0:
        verdict = evaluation.wait_turn(verdict)
    answer = _answer(request, state, scopes, refusal, verdict)
    if answer is not None:
        return answer
    try:
        response = view(request, *args, **kwargs)
    except BaseException as exc:
        _failed(request, state, exc)
        raise
    return _finished(request, state, response)


class RateLimitDecorator:
    """The `sender` of the signals a decorated view's decisions send."""


def _decide(request: Any, state: RequestState, scopes: frozenset[str]) -> Verdict | None:
    # Left to us by the middleware: the site's unscoped policies too, in the same call.
    if state.deferred:
        scopes = scopes | evaluation.UNSCOPED
    state.throttled = True
    return evaluation.evaluate(request, scopes=scopes, sender=RateLimitDecorator,
                               state=state)


def mark_limited(request: Any, refused: bool) -> None:
    """Set `request.limited` as django-ratelimit does: True once any limit refused the
    request, never set back to False by a later decision."""
    base = http_request(request)
    limited = bool(getattr(base, "limited", False)) or refused
    base.limited = limited
    if request is not base:  # a DRF Request keeps its own attributes
        request.limited = limited


def culprits(verdict: Verdict) -> tuple[Any, ...]:
    """The policies that refused: the enforced ones that said no, or when none did (the
    store was out of reach and an `on_error` refused) those that were not decided."""
    refused = tuple(o.policy for o in verdict.rejected_by)
    return refused or tuple(o.policy for o in verdict.outcomes if o.result is None)


def _answer(
    request: Any, state: RequestState, scopes: frozenset[str], refusal: Refusal,
    verdict: Verdict | None,
) -> Any:
    """None when the view is to run; else the response to give instead. Raises the
    refusal's exception when one of the view's own limits asks for it."""
    refused = verdict is not None and not verdict.allowed
    mark_limited(request, refused)
    if verdict is None or not refused:
        return None
    who = {p.scope for p in culprits(verdict)}
    if who and who <= refusal.lenient:
        return _lenient(request, state, scopes, refusal, verdict)
    raising = next((refusal.raising[s] for s in sorted(who) if s in refusal.raising), None)
    if raising is not None:
        _failed(request, state)
        raise raising()
    return _refused(request, state, verdict)


def _lenient(
    request: Any, state: RequestState, scopes: frozenset[str], refusal: Refusal,
    verdict: Verdict,
) -> Any:
    """A refusal by `block=False` limits only: the view runs, flagged. The refusal charged
    nothing, so the other policies of that decision are decided again without them (a
    client over a lenient limit stays counted by the site's own policies)."""
    own = refusal.lenient
    _release_decided(request, state, verdict)
    others = {o.policy.id for o in verdict.outcomes if o.policy.scope not in own}
    if not others:
        return None
    state.charged.difference_update(others)
    again = _decide(request, state, scopes - own)
    if again is not None and again.delay > 0:
        again = evaluation.wait_turn(again)
    if again is None or again.allowed:
        return None
    return _answer(request, state, scopes - own, Refusal(raising=refusal.raising), again)


def _release_decided(request: Any, state: RequestState, verdict: Verdict) -> None:
    """Free the slots of `verdict`'s decisions (a refused one takes none; its token may
    still be held), keeping those other decisions of the request hold."""
    mine = [(e, d) for e, d in state.holds if d in verdict.decisions]
    if not mine:
        return
    keep = [(e, d) for e, d in state.holds if d not in verdict.decisions]
    state.holds = mine
    evaluation.release(request, state)
    state.holds = keep


def _refused(request: Any, state: RequestState, verdict: Verdict) -> Any:
    from ratelimits.pipeline.responses import rejection_response

    return _finished(request, state, rejection_response(request, verdict))


def _finished(request: Any, state: RequestState, response: Any) -> Any:
    """Headers and slots: the middleware's job when it is installed, else ours."""
    if state.middleware:
        return response
    return settling.finish(request, state, response)


def _failed(request: Any, state: RequestState, exc: BaseException | None = None) -> None:
    """The view raised `exc` (None: it did not run): without the middleware, its slots
    back, and its `charge_on` and `reset_on` acting on the response Django makes of the
    exception. A cancelled view (an async one whose client went away) stays charged."""
    if state.middleware:
        return
    if isinstance(exc, Exception) and state.pending:
        settling.settle_raised(request, state, exc)
    evaluation.release(request, state)
