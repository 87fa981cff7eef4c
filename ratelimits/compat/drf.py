"""DRF's throttle classes decided by the ratelimits engine: `AnonRateThrottle`,
`UserRateThrottle`, `ScopedRateThrottle` and their base `SimpleRateThrottle`::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["ratelimits.compat.drf.AnonRateThrottle",
                                     "ratelimits.compat.drf.UserRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "user": "1000/day"},  # unchanged
    }

They read the rates and the view's `throttle_scope` as DRF does, when DRF does (the rate
when the throttle is made, once per request; a scope's when the view calls it), and
count a client by `get_cache_key()`, so a subclass that overrides it keeps its identity.
Each scope's rate is a limit declared in code (`pipeline.declared`) named `drf:<scope>`,
a `sliding_log` (DRF's history is an exact log of the last period): it shows in the
admin, where its mode, rollout and overrides are the operator's.

One store call decides all of a view's compat throttles (and, when `RateLimitMiddleware`
left the request to them, the site's unscoped policies): the first one DRF asks decides,
the others answer from its decision. A refused request is charged to none of them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from ratelimits.conf import get_config
from ratelimits.engine.types import Outcome, Result
from ratelimits.matching.identity import client_ip
from ratelimits.ops.routes import routed_views
from ratelimits.pipeline import evaluation
from ratelimits.pipeline.declared import SCOPE_PREFIX, registry
from ratelimits.pipeline.release import release_when_finished
from ratelimits.pipeline.state import STATE_ATTR, RequestState, http_request, state_for
from ratelimits.pipeline.verdict import UNAVAILABLE
from ratelimits.throttling import RateLimitStoreUnavailable

__all__ = [
    "ALGORITHM",
    "NAME_PREFIX",
    "AnonRateThrottle",
    "ScopedRateThrottle",
    "SimpleRateThrottle",
    "UserRateThrottle",
    "declare_routed",
    "policy_name",
]

logger = logging.getLogger("ratelimits")

#: A compat throttle's policy is named `drf:<scope>`.
NAME_PREFIX = "drf:"
#: DRF keeps an exact history of the last period: a log refuses exactly where it does.
ALGORITHM = "sliding_log"
#: DRF's period units: the first letter of the rate's unit ("s", "sec", "min", "hour" ...).
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# This view call's decision rides on the DRF Request (one per view call); the HttpRequest
# under it is marked once a view call has used its state.
_CALL_ATTR = "_ratelimits_drf_call"
_USED_ATTR = "_ratelimits_drf_used"


def policy_name(scope: str) -> str:
    """The name of the declared policy that holds `scope`'s rate."""
    return NAME_PREFIX + scope


class _SettingsRates:
    """`THROTTLE_RATES` when a class does not set its own: DRF's
    `DEFAULT_THROTTLE_RATES` as the settings say now (DRF reads them once, at import)."""

    def __get__(self, instance: object, owner: type) -> Mapping[str, str | None]:
        rates: Any = api_settings.DEFAULT_THROTTLE_RATES  # the stubs type it loosely
        return rates  # type: ignore[no-any-return]


@dataclass
class _Call:
    """What one view call decided for its compat throttles."""

    state: RequestState
    #: The client each declared policy counts (`get_cache_key()`), read by `code:` keys.
    keys: dict[str, str] = field(default_factory=dict)
    #: Each decided policy's result (None: it did not apply, e.g. its mode is off).
    results: dict[str, Result | None] = field(default_factory=dict)
    refused: bool = False


class SimpleRateThrottle(BaseThrottle):
    """DRF's `SimpleRateThrottle`: `rate` (or `THROTTLE_RATES[scope]`) per client, the
    client being what `get_cache_key()` returns (None: not throttled)."""

    #: Tells RateLimitMiddleware to leave a view with this throttle to it (one decision
    #: for the view's limits and the site's unscoped policies); see
    #: `evaluation.throttle_decides`.
    decides_policies = True
    #: ... and that the view always has limits of its own (declared in code).
    declares_policies = True

    timer: Callable[..., float] = time.time
    cache_format = "throttle_%(scope)s_%(ident)s"
    scope: str | None = None
    THROTTLE_RATES: Any = _SettingsRates()
    rate: str | None
    num_requests: int | None = None
    duration: int | None = None
    key: str | None = None
    now: float

    def __init__(self) -> None:
        if not getattr(self, "rate", None):
            self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._result: Result | None = None
        self._refused_for: float | None = None  # seconds, when this throttle refused
        self._decided = False

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        """The client this throttle counts, or None when it does not throttle `request`."""
        raise NotImplementedError(".get_cache_key() must be overridden")

    def get_ident(self, request: Any) -> str:
        """The client's address, as the `ip` key reads it: `X-Forwarded-For` (or the
        PROXY_HEADER) only from one of TRUSTED_PROXIES, an IPv6 client as its prefix.
        DRF's own answer (its NUM_PROXIES, and without it X-Forwarded-For from anyone)
        when `RATELIMITS["DRF_CLIENT_IP"]` is "num_proxies"."""
        config = get_config()
        if config["DRF_CLIENT_IP"] == "num_proxies":
            return super().get_ident(request)
        meta = request.META
        address = client_ip(meta, config["TRUSTED_PROXIES"], config["IPV6_PREFIX"],
                            config["PROXY_HEADER"])
        # no address to read: the peer as it was given, as DRF's cache key says then
        return address if address is not None else str(meta.get("REMOTE_ADDR"))

    def get_rate(self) -> str | None:
        """The rate of this throttle's `scope` in `THROTTLE_RATES`."""
        if not self.scope:
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle"
            )
        rates = self.THROTTLE_RATES
        if self.scope not in rates:
            raise ImproperlyConfigured(f"No default throttle rate set for '{self.scope}' scope")
        rate: str | None = rates[self.scope]
        return rate

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        """`"<requests>/<unit>"` as (requests, seconds); (None, None) for no rate."""
        if rate is None:
            return None, None
        count, unit = rate.split("/")
        return int(count), _UNITS[unit[0]]

    # -- deciding ------------------------------------------------------------------------

    def allow_request(self, request: Any, view: Any) -> bool:
        """Whether `request` passes this throttle (DRF calls `wait()` when it does not)."""
        self._result, self._refused_for, self._decided = None, None, False
        name = self._identify(request, view)
        if name is None and not _left_to_us(request):
            return True  # nothing of ours applies, and nothing was left to us
        self.now = self.timer()
        call = _call_for(request)
        if name is None or name not in call.results:
            self._decide(call, request, view, name)
        self._decided = True
        if self._refused_for is None and name is not None:
            self._result = call.results.get(name)
            if self._result is not None and self._result.outcome is Outcome.REJECTED:
                self._refused_for = self._result.retry_after
        if self._refused_for is not None:
            return self.throttle_failure()
        return self.throttle_success() if name is not None else True

    def throttle_success(self) -> bool:
        """Called when the request passes this throttle (the engine has charged it)."""
        return True

    def throttle_failure(self) -> bool:
        """Called when this throttle refuses the request."""
        return False

    def wait(self) -> float | None:
        """Seconds until the refused request would pass: the time until the oldest
        request of the period leaves it (DRF's answer). None after an admission; before
        any decision, DRF's answer for a client with no history."""
        if self._refused_for is not None:
            return self._refused_for
        if self._decided or self.num_requests is None or self.duration is None:
            return None
        return self.duration / float(self.num_requests + 1)

    def _identify(self, request: Any, view: Any) -> str | None:
        """The name of the policy this throttle applies to `request` (declared now if its
        rate is new), with `self.key` the client; None when it applies none."""
        if self.rate is None or self.num_requests is None or self.duration is None:
            return None
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return None
        return self._declared()

    def _declared(self) -> str:
        """Declare this throttle's policy (again, if its rate changed); its name."""
        assert self.num_requests is not None and self.duration is not None
        name = policy_name(self.scope or type(self).__name__)
        _declare(name, self.num_requests, self.duration)
        return name

    def declare_for(self, view: Any) -> str | None:
        """Declare the policy this throttle applies on `view`, without a request (at
        `migrate`); its name, or None when it applies none (no rate, no scope)."""
        if self.rate is None or self.num_requests is None or self.duration is None:
            return None
        return self._declared()

    def _decide(self, call: _Call, request: Any, view: Any, name: str | None) -> None:
        """One store call for this throttle and the view's other compat throttles not
        decided yet; a refusal by none of them (an unscoped policy) is this one's."""
        if call.refused:
            return  # refused already: charging more policies would break all-or-nothing
        pending = self._pending(call, request, view, name)
        state = call.state
        scopes = {SCOPE_PREFIX + n for n in pending}
        if state.deferred:
            scopes |= evaluation.UNSCOPED
        state.throttled = True
        for n in pending:
            call.results[n] = None
        verdict = evaluation.evaluate(request, scopes=frozenset(scopes), sender=type(self),
                                      state=state)
        if verdict is None:
            return
        if state.holds and not state.middleware:
            release_when_finished(request)
        if verdict.status == UNAVAILABLE:
            state.refuse(verdict)  # DRF answers it: the headers are the refusing policies'
            raise RateLimitStoreUnavailable(verdict.retry_after)
        if verdict.allowed and verdict.delay > 0:
            verdict = evaluation.wait_turn(verdict)
        own = False
        for outcome in verdict.outcomes:
            if outcome.policy.name in pending:
                result = call.results[outcome.policy.name] = outcome.result
                own = own or (result is not None and result.outcome is Outcome.REJECTED)
        if not verdict.allowed:
            state.refuse(verdict)
            call.refused = True
            if not own:
                self._refused_for = float(verdict.retry_after)

    def _pending(self, call: _Call, request: Any, view: Any, name: str | None) -> set[str]:
        """The policies to decide now: this throttle's and those of the view's other
        compat throttles, each client recorded for its `code:` key. A replaced `timer`
        (DRF's tests fake time so) is the time they are decided at."""
        pending = set()
        if name is not None and self.key is not None:
            call.keys[name] = self.key
            pending.add(name)
        fixed = self.timer is not time.time
        for other in _siblings(view, self):
            other_name = other._identify(request, view)
            if other_name is not None and other_name not in call.results and other.key:
                call.keys[other_name] = other.key
                pending.add(other_name)
                if not fixed and other.timer is not time.time:
                    self.now, fixed = other.timer(), True
        if fixed:
            call.state.now = float(self.now)
        return pending


class AnonRateThrottle(SimpleRateThrottle):
    """DRF's `AnonRateThrottle`: anonymous clients by IP (`get_ident()`), scope `anon`;
    authenticated users are not throttled."""

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None  # only anonymous clients count
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class UserRateThrottle(SimpleRateThrottle):
    """DRF's `UserRateThrottle`: a user by id, an anonymous client by IP, scope `user`."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": _user_or_ident(self, request)}


class ScopedRateThrottle(SimpleRateThrottle):
    """DRF's `ScopedRateThrottle`: the view's `throttle_scope` and its rate, per user (or
    IP when anonymous); a view without a scope is not throttled."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        # the rate is known only once the view calls: see `_identify`
        self._result, self._refused_for, self._decided = None, None, False

    def _identify(self, request: Any, view: Any) -> str | None:
        if not self._scoped(view):
            return None
        return super()._identify(request, view)

    def declare_for(self, view: Any) -> str | None:
        return super().declare_for(view) if self._scoped(view) else None

    def _scoped(self, view: Any) -> bool:
        """Take the scope and rate of `view`; whether it has a scope."""
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return False
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return True

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": _user_or_ident(self, request)}


def _user_or_ident(throttle: BaseThrottle, request: Any) -> Any:
    if request.user and request.user.is_authenticated:
        return request.user.pk
    return throttle.get_ident(request)


# -- the policies declared at `migrate` -------------------------------------------------


@registry.finder
def declare_routed(urlconf: str | None = None) -> list[str]:
    """Declare the policy of every compat throttle a routed DRF view uses, as DRF would
    make them for a request: the view class made with its route's arguments, its
    `get_throttles()` (`DEFAULT_THROTTLE_CLASSES` unless the view names its own), each
    throttle's rate, and for `ScopedRateThrottle` the view's `throttle_scope`. Runs at
    `migrate` (a finder of `pipeline.declared`), so the rows exist before the first
    request. Returns the names declared. A view whose throttles depend on the request
    (a `get_throttles()` reading `self.action` or the user) is left to its first request."""
    names = []
    for route, callback in routed_views(urlconf):
        cls = getattr(callback, "cls", None)  # DRF's as_view() keeps the class there
        if not (isinstance(cls, type) and callable(getattr(cls, "get_throttles", None))):
            continue
        try:
            view = cls(**(getattr(callback, "initkwargs", None) or {}))
            for throttle in view.get_throttles():
                if isinstance(throttle, SimpleRateThrottle):
                    name = throttle.declare_for(view)
                    if name is not None and name not in names:
                        names.append(name)
        except Exception as exc:
            logger.warning("ratelimits: could not read the DRF throttles of %s (%s: %s); "
                           "their policies are declared at its first request", route,
                           type(exc).__name__, exc)
    return names


# -- one view call, one decision -------------------------------------------------------


def _declare(name: str, limit: int, period: int) -> None:
    """Declare (or re-declare with a changed rate) the policy `name` of a compat throttle."""
    known = registry.declared.get(name)
    if known is not None:
        code = known.code
        if code["limit"] == limit and code["period"] == period:
            return
        logger.warning("ratelimits: %s's rate is now %d per %ds (it was %d per %ds): the "
                       "settings changed, or two throttle classes give one scope two rates",
                       name, limit, period, code["limit"], code["period"])
    registry.declare(
        name, "enforce", reader=functools.partial(_read_key, name), replace=True,
        algorithm=ALGORITHM, limit=limit, period=period, burst=None, cost=1, max_wait=0,
        warmup=0, methods="",
    )


def _read_key(name: str, request: Any) -> str | None:
    """The client `name` counts in this view call (a `code:` key's reader)."""
    call = _existing_call(request)
    return None if call is None else call.keys.get(name)


def _existing_call(request: Any) -> _Call | None:
    try:
        call: _Call | None = vars(request).get(_CALL_ATTR)
    except TypeError:  # not a request (DRF's tests pass {})
        return None
    return call


def _call_for(request: Any) -> _Call:
    """This view call's record. Its state is the request's, shared with the middleware;
    a second view call with the same HttpRequest (DRF's tests make them) gets its own."""
    call = _existing_call(request)
    if call is None:
        base = http_request(request)
        if vars(base).get(_USED_ATTR):
            call = _Call(RequestState())
        else:
            setattr(base, _USED_ATTR, True)
            call = _Call(state_for(request))
        setattr(request, _CALL_ATTR, call)
    return call


def _left_to_us(request: Any) -> bool:
    """Whether the middleware left this request's unscoped policies to the throttles
    and none has decided them yet."""
    call = _existing_call(request)
    state = call.state if call is not None else getattr(http_request(request), STATE_ATTR, None)
    return isinstance(state, RequestState) and state.deferred and not state.throttled


def _siblings(view: Any, throttle: SimpleRateThrottle) -> list[SimpleRateThrottle]:
    """The view's other compat throttles (new instances: DRF keeps its own to itself)."""
    # duck-typed: importing rest_framework.views here would close a cycle, as DRF imports
    # DEFAULT_THROTTLE_CLASSES while it builds APIView
    get_throttles = getattr(view, "get_throttles", None)
    if not callable(get_throttles):
        return []
    return [t for t in get_throttles()
            if isinstance(t, SimpleRateThrottle) and type(t) is not type(throttle)]
