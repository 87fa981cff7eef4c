"""`is_ratelimited` and `get_usage`: django-ratelimit 4's functions on declared policies.

Each distinct (group, rate, methods) is a policy declared in code (see
`pipeline.declared`), named `dr:<group>:<count>-<seconds>s[:<METHODS>]` (hashed when the
group does not fit a policy name), with a `fixed_window` algorithm: django-ratelimit
counts per window as well. A callable rate declares one policy per distinct rate it
returns, the first time it returns it, so every process names it alike.

The client is counted by django-ratelimit's own key semantics (`ip` with
`RATELIMIT_IP_META_KEY` and the IPv4/IPv6 masks, `user`, `user_or_ip`, `get:`,
`post:`, `header:`, a callable or a dotted path taking `(group, request)`): the value
is computed before the decision, so a key mistake raises as it does upstream, and the
policy's `code:` key reads it from the request.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ratelimits import runtime
from ratelimits.compat.django_ratelimit import ALL, UNSAFE
from ratelimits.engine.errors import EngineError
from ratelimits.engine.types import Outcome
from ratelimits.pipeline import evaluation
from ratelimits.pipeline.declared import SCOPE_PREFIX, registry
from ratelimits.pipeline.state import RequestState, http_request, state_for
from ratelimits.pipeline.verdict import UNAVAILABLE, PolicyOutcome, Verdict

__all__ = ["get_usage", "is_ratelimited"]

#: Rates as django-ratelimit writes them: "5/m", "100/10s", "100/10" (seconds).
_RATE = re.compile(r"([\d]+)/([\d]*)([smhdSMHD])?")
_PERIODS = {"s": 1, "m": 60, "h": 60 * 60, "d": 24 * 60 * 60}
#: The algorithm of every compat policy: a count per aligned window, as upstream.
ALGORITHM = "fixed_window"
#: What a policy name may hold (`models.name_error`); the rest of a group is replaced.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.:-]+")
#: A policy name may have 100 characters; its scope (`code:<name>`) too.
_MAX_NAME = 100 - len(SCOPE_PREFIX)
#: Where a request keeps the key values of its compat limits, by policy name.
KEYS_ATTR = "_ratelimits_compat_keys"

Rate = str | tuple[int, int] | None


class Usage(TypedDict):
    """What `get_usage` returns (a dict, as upstream)."""

    count: int
    limit: int
    should_limit: bool
    time_left: int


#: Upstream's answer when the store failed and `RATELIMIT_FAIL_OPEN` is off.
def _failed_usage() -> Usage:
    return {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}


@dataclass(frozen=True)
class Upstream:
    """django-ratelimit's settings, read once (cleared when a `RATELIMIT_*` setting
    changes): a request reads them from here, not through `settings` four times."""

    enable: bool
    ip_meta_key: Any
    ipv4_mask: int
    ipv6_mask: int
    fail_open: bool


@functools.cache
def upstream() -> Upstream:
    return Upstream(
        enable=getattr(settings, "RATELIMIT_ENABLE", True),
        ip_meta_key=getattr(settings, "RATELIMIT_IP_META_KEY", None),
        ipv4_mask=getattr(settings, "RATELIMIT_IPV4_MASK", 32),
        ipv6_mask=getattr(settings, "RATELIMIT_IPV6_MASK", 64),
        fail_open=bool(getattr(settings, "RATELIMIT_FAIL_OPEN", False)),
    )


runtime.on_reset(upstream.cache_clear)


@receiver(setting_changed, dispatch_uid="ratelimits.compat.django_ratelimit.settings")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("RATELIMIT_"):
        upstream.cache_clear()


@functools.lru_cache(maxsize=256)
def _split_rate(rate: str | tuple[int, int]) -> tuple[int, int]:
    """`"100/10m"` -> `(100, 600)`; a `(count, seconds)` tuple as it is."""
    if isinstance(rate, tuple):
        return rate
    found = _RATE.match(rate)
    if found is None:
        raise ImproperlyConfigured(f"Ratelimit rate {rate!r} is not N/[count]s|m|h|d")
    count, multiplier, unit = found.groups()
    seconds = _PERIODS[(unit or "s").lower()]
    return int(count), seconds * int(multiplier) if multiplier else seconds


# -- keys: django-ratelimit's, as a table ------------------------------------------------


def _get_ip(request: Any) -> str:
    """The client address as django-ratelimit reads it (`RATELIMIT_IP_META_KEY`: a META
    name, a function or its dotted path; default REMOTE_ADDR), masked to its network
    (`RATELIMIT_IPV4_MASK`, default 32; `RATELIMIT_IPV6_MASK`, default 64)."""
    config = upstream()
    meta_key = config.ip_meta_key
    if not meta_key:
        ip = request.META["REMOTE_ADDR"]
        if not ip:
            raise ImproperlyConfigured(
                "IP address in REMOTE_ADDR is empty: behind a reverse proxy on a Unix "
                "socket, set RATELIMIT_IP_META_KEY"
            )
    elif callable(meta_key):
        ip = meta_key(request)
    elif isinstance(meta_key, str) and "." in meta_key:
        ip = import_string(meta_key)(request)
    elif meta_key in request.META:
        ip = request.META[meta_key]
    else:
        raise ImproperlyConfigured(f"Could not get IP address from {meta_key!r}")
    return _network(ip, config.ipv6_mask if ":" in ip else config.ipv4_mask)


def _network(ip: str, mask: int) -> str:
    """The network address of `ip`/`mask`, as `ip_network(..., strict=False)` gives it
    (and raising as it does for a bad address or mask), without building a network."""
    if mask == 32 and _DOTTED_QUAD.fullmatch(ip):
        return ip  # the default mask: an address written as ipaddress writes it is itself
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        address = None
    if (address is None or "%" in ip or not isinstance(mask, int)
            or not 0 <= mask <= address.max_prefixlen):
        return str(ipaddress.ip_network(f"{ip}/{mask}", strict=False).network_address)
    drop = address.max_prefixlen - mask
    return str(type(address)((int(address) >> drop) << drop))


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#: An IPv4 address in the one spelling `ipaddress` accepts and gives back.
_DOTTED_QUAD = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}", re.ASCII)


def _user_or_ip(request: Any) -> str:
    if request.user.is_authenticated:
        return str(request.user.pk)
    return _get_ip(request)


def _header(request: Any, name: str) -> str:
    return str(request.META.get("HTTP_" + name.replace("-", "_").upper(), ""))


_SIMPLE_KEYS: dict[str, Callable[[Any], str]] = {
    "ip": _get_ip,
    "user": lambda request: str(request.user.pk),
    "user_or_ip": _user_or_ip,
}
_ACCESSOR_KEYS: dict[str, Callable[[Any, str], str]] = {
    "get": lambda request, name: str(request.GET.get(name, "")),
    "post": lambda request, name: str(request.POST.get(name, "")),
    "header": _header,
}

Key = str | Callable[[str, Any], Any] | None


def _key_value(key: Key, group: str, request: Any) -> str:
    """The value `key` counts this request by, as django-ratelimit computes it."""
    if not key:
        raise ImproperlyConfigured("Ratelimit key must be specified")
    if callable(key):
        return str(key(group, request))
    if key in _SIMPLE_KEYS:
        return _SIMPLE_KEYS[key](request)
    if ":" in key:
        accessor, name = key.split(":", 1)
        if accessor not in _ACCESSOR_KEYS:
            raise ImproperlyConfigured(f"Unknown ratelimit key: {key}")
        return _ACCESSOR_KEYS[accessor](request, name)
    if "." in key:
        return str(import_string(key)(group, request))
    raise ImproperlyConfigured(f"Could not understand ratelimit key: {key}")


def _stashed(name: str, request: Any) -> str | None:
    """The `code:` key of a compat policy: the value computed for it before deciding."""
    keys: dict[str, str] = getattr(http_request(request), KEYS_ATTR, {})
    value = keys.get(name)
    # upstream counts an empty value (a missing header) as one client; ours would not
    return '""' if value == "" else value


# -- groups, methods and policy names ----------------------------------------------------


def group_of(fn: Any) -> str:
    """The group django-ratelimit derives from a view: module, class, qualified name."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    parts = []
    if hasattr(fn, "__module__"):
        parts.append(fn.__module__)
    if hasattr(fn, "__self__"):
        parts.append(fn.__self__.__class__.__name__)
    parts.append(fn.__qualname__)
    return ".".join(parts)


Methods = str | Sequence[str] | tuple[None]


def _methods(method: Methods) -> tuple[str, ...]:
    """The methods a limit applies to, upper case and sorted; () for ALL."""
    if method == ALL:
        return ()
    names = [method] if isinstance(method, str) else list(method)
    return tuple(sorted({str(m).upper() for m in names}))


def _method_match(request: Any, methods: tuple[str, ...]) -> bool:
    return not methods or request.method in methods


@functools.lru_cache(maxsize=1024)
def policy_name(group: str, limit: int, period: int, methods: tuple[str, ...]) -> str:
    """The policy a (group, rate, methods) is counted in: readable, valid, the same in
    every process; a group with characters a name refuses (`<locals>`), or too long,
    is shortened and given a digest of itself, so two groups never share a name."""
    tail = f":{limit}-{period}s" + (":" + "_".join(methods) if methods else "")
    clean = _NOT_IN_NAME.sub("_", group)
    head = f"dr:{clean}"
    if clean != group or len(head) + len(tail) > _MAX_NAME:
        digest = hashlib.sha256(group.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        room = _MAX_NAME - len(tail) - len(digest) - 1
        head = f"{head[:room]}-{digest}"
    return head + tail


@dataclass(frozen=True, slots=True)
class Ask:
    """One limit to decide for one request: its policy's name, scope and figures."""

    name: str
    limit: int
    period: int
    scope: str = field(init=False)
    #: The scopes a request of this limit is decided for: its own alone.
    scopes: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", SCOPE_PREFIX + self.name)
        object.__setattr__(self, "scopes", frozenset({self.scope}))


#: The `Ask` of each policy name: one object per policy, not one per request.
_ASKS: dict[str, Ask] = {}


def _initial() -> dict[str, str]:
    """A new policy row's `on_error`, from `RATELIMIT_FAIL_OPEN` as upstream acts on a
    store error: refuse (`deny`) unless it is on (`allow`). The operator's afterwards."""
    return {"on_error": "allow" if fail_open() else "deny"}


def declare(group: str, limit: int, period: int, methods: tuple[str, ...]) -> Ask:
    """The policy of (group, rate, methods), declared the first time it is asked for
    (and again after the registry was cleared: a test's reset)."""
    name = policy_name(group, limit, period, methods)
    if name not in registry.declared:
        registry.declare(
            name, "enforce", reader=functools.partial(_stashed, name), initial=_initial,
            algorithm=ALGORITHM,
            limit=limit, period=period, methods=",".join(methods), burst=None, cost=1,
            max_wait=0, warmup=0,
        )
    ask = _ASKS.get(name)
    if ask is None:
        ask = _ASKS[name] = Ask(name, limit, period)
    return ask


def static_ask(group: str, rate: Any, method: Methods) -> Ask | None:
    """The policy of a decorator whose rate is fixed (a string or a tuple), declared
    when it decorates; None for a rate chosen per request, or none at all."""
    if rate is None or callable(rate) or (isinstance(rate, str) and "." in rate):
        return None
    limit, period = _split_rate(rate)
    if limit <= 0 or period <= 0:
        return None
    return declare(group, limit, period, _methods(method))


#: `prepare()`'s answer for a zero rate: refused, with no policy to count in.
ZERO = Ask("", 0, 0)


def prepare(
    request: Any, group: str | None, fn: Any, key: Key, rate: Any, method: Methods
) -> Ask | None:
    """What to decide for this request, in django-ratelimit's order (group, method, rate,
    key), its mistakes raised as upstream: None when no limit applies, `ZERO` for a
    zero rate (always refused), else the policy, its key value kept on the request."""
    if group is None and fn is None:
        raise ImproperlyConfigured(
            "get_usage must be called with either `group` or `fn` arguments"
        )
    if not upstream().enable:
        return None
    methods = _methods(method)
    if not _method_match(request, methods):
        return None
    if group is None:
        group = group_of(fn)
    if callable(rate):
        rate = rate(group, request)
    elif isinstance(rate, str) and "." in rate:
        rate = import_string(rate)(group, request)
    if rate is None:
        return None
    limit, period = _split_rate(rate)
    if period <= 0:
        raise ImproperlyConfigured("Ratelimit period must be greater than 0")
    value = _key_value(key, group, request)
    if limit <= 0:
        return ZERO
    ask = declare(group, limit, period, methods)
    base = http_request(request)
    keys = getattr(base, KEYS_ATTR, None)
    if keys is None:
        keys = {}
        setattr(base, KEYS_ATTR, keys)
    keys[ask.name] = value
    return ask


# -- deciding ------------------------------------------------------------------------------


class CompatSender:
    """The `sender` of the signals the compat layer's decisions send."""


def fail_open() -> bool:
    return upstream().fail_open


def settle(ask: Ask, state: RequestState, verdict: Verdict | None) -> Verdict | None:
    """The verdict as django-ratelimit would act on it, and the policy made ready to be
    decided again for this request (upstream counts every pass, a view called twice
    with one request included). A limit the store could not decide follows its row's
    `on_error`, which `RATELIMIT_FAIL_OPEN` set when the row was made (`_initial`) and
    the operator may have changed since: the admin's banner says what it does."""
    if verdict is None:
        return None
    scope, charged = ask.scope, state.charged
    for outcome in verdict.outcomes:
        if outcome.policy.scope == scope:
            charged.discard(outcome.policy.id)
    return verdict


def _own(ask: Ask, verdict: Verdict) -> PolicyOutcome | None:
    scope = ask.scope
    for outcome in verdict.outcomes:
        if outcome.policy.scope == scope:
            return outcome
    return None


def _usage(ask: Ask, verdict: Verdict | None) -> Usage | None:
    if verdict is None:
        return None
    own = _own(ask, verdict)
    if own is None:
        return None
    result = own.result
    if result is None:  # the store was out of reach, and on_error admitted
        return None
    limit = result.limit.limit
    return {
        "count": limit - result.remaining,
        "limit": limit,
        "should_limit": result.outcome is Outcome.REJECTED,
        "time_left": math.ceil(result.reset_after),
    }


def _peek(request: Any, ask: Ask) -> Usage | None:
    """The usage without charging: the policy read at cost 0 (one store call)."""
    from ratelimits.conf import get_config
    from ratelimits.pipeline.engines import get_engine
    from ratelimits.pipeline.plan import plan
    from ratelimits.pipeline.resolver import resolver

    snap = resolver.snapshot()
    policy = next((p for p in snap.policies if p.scope == ask.scope), None)
    if policy is None:
        return None  # switched off by the operator
    planned, _failed = plan(request, [policy], get_config(), state_for(request), snap.members)
    if not planned:
        return None  # exempt by an override
    limit = replace(planned[0].limit, cost=0)
    try:
        decision = get_engine().evaluate([limit], runtime.decision_time())
    except EngineError:
        return None  # nothing is charged, so nothing to refuse (upstream reads 0)
    result = decision.results[0]
    return {
        "count": limit.limit - result.remaining,
        "limit": limit.limit,
        "should_limit": (not result.allowed or result.remaining < 1) and not policy.shadow,
        "time_left": math.ceil(result.reset_after),
    }


def get_usage(
    request: Any,
    group: str | None = None,
    fn: Any = None,
    key: Key = None,
    rate: Any = None,
    method: Methods = ALL,
    increment: bool = False,
) -> Usage | None:
    """django-ratelimit's `get_usage`: the count, limit, whether to limit and the
    seconds left in the window; None when no limit applies. `increment=True` charges
    the request when admitted (a refused one is not charged)."""
    ask = prepare(request, group, fn, key, rate, method)
    if ask is None:
        return None
    if ask is ZERO:
        return {"count": 0, "limit": 0, "should_limit": True, "time_left": 0}
    if not increment:
        return _peek(request, ask)
    state = state_for(request)
    verdict = evaluation.evaluate(request, scopes=ask.scopes, sender=CompatSender, state=state)
    verdict = settle(ask, state, verdict)
    if verdict is not None and verdict.status == UNAVAILABLE:
        return _failed_usage()  # refused by the policy's on_error=deny
    return _usage(ask, verdict)


# repeats: get_usage's signature, as upstream's two functions share one
def is_ratelimited(
    request: Any,
    group: str | None = None,
    fn: Any = None,
    key: Key = None,
    rate: Any = None,
    method: Methods = ALL,
    increment: bool = False,
) -> bool:
    """django-ratelimit's `is_ratelimited`: whether this request is over the limit."""
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return False if usage is None else usage["should_limit"]


# Upstream's attributes, so `is_ratelimited.UNSAFE` reads as it did.
for _function in (get_usage, is_ratelimited):
    setattr(_function, "ALL", ALL)  # noqa: B010  (a function's attribute: mypy knows no other way)
    setattr(_function, "UNSAFE", UNSAFE)  # noqa: B010
