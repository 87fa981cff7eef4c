"""django-ratelimit 4's `@ratelimit`, each limit a policy declared in code.

    from ratelimits.compat.django_ratelimit.decorators import ratelimit

    @ratelimit(key="post:username", rate="5/m", method="POST")
    def login(request): ...

Refused with `block=True` (the default), it raises `Ratelimited` (a 403), or
`settings.RATELIMIT_EXCEPTION_CLASS` (a class or its dotted path); with `block=False`
the view runs and reads `request.limited`. A refused request is not charged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.utils.module_loading import import_string

from ratelimits.compat.django_ratelimit import ALL, UNSAFE
from ratelimits.compat.django_ratelimit.core import (
    ZERO,
    Key,
    Methods,
    group_of,
    prepare,
    settle,
    static_ask,
)
from ratelimits.compat.django_ratelimit.exceptions import Ratelimited
from ratelimits.decorators import Refusal, mark_limited, run_view
from ratelimits.pipeline.declared import SCOPES_ATTR
from ratelimits.pipeline.state import state_for

__all__ = ["ratelimit"]

F = TypeVar("F", bound=Callable[..., Any])


def refusal_exception() -> BaseException:
    """`RATELIMIT_EXCEPTION_CLASS` (a class or its dotted path), else `Ratelimited`."""
    cls = getattr(settings, "RATELIMIT_EXCEPTION_CLASS", Ratelimited)
    made: BaseException = (import_string(cls) if isinstance(cls, str) else cls)()
    return made


def ratelimit(
    group: str | None = None,
    key: Key = None,
    rate: Any = None,
    method: Methods = ALL,
    block: bool = True,
) -> Callable[[F], F]:
    """Limit the decorated view to `rate` per `key` within `group` (default: the view's
    dotted name), for `method` (ALL, UNSAFE, a name or a list); django-ratelimit's
    arguments and meanings."""

    def decorator(fn: F) -> F:
        # a fixed rate is declared now, so the policy is in the admin from the start
        # and the middleware leaves the request to this decorator (one decision)
        static = static_ask(group or group_of(fn), rate, method)

        @functools.wraps(fn)
        def _wrapped(request: Any, *args: Any, **kwargs: Any) -> Any:
            state = state_for(request)
            ask = prepare(request, group, fn, key, rate, method)
            if ask is None or ask is ZERO:
                mark_limited(request, ask is ZERO)
                if ask is ZERO and block:
                    raise refusal_exception()
                if state.deferred and not state.throttled:  # the site's policies
                    return run_view(fn, request, args, kwargs, frozenset(), Refusal(), state)
                return fn(request, *args, **kwargs)
            if block:
                refusal = Refusal(raising={ask.scope: refusal_exception})
            else:
                refusal = Refusal(lenient=ask.scopes)
            return run_view(fn, request, args, kwargs, ask.scopes, refusal, state,
                            settle=functools.partial(settle, ask, state))

        if static is not None:
            setattr(_wrapped, SCOPES_ATTR, static.scopes)
        return _wrapped  # type: ignore[return-value]

    return decorator


ratelimit.ALL = ALL  # type: ignore[attr-defined]
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]
