"""Who the client is for each matching policy, and the engine limit to check."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits import runtime
from ratelimits.engine.records import quick_init
from ratelimits.engine.types import Limit
from ratelimits.matching.identity import IdentityError
from ratelimits.matching.keykinds import Proxies
from ratelimits.pipeline.report import log_identity_error

logger = logging.getLogger("ratelimits")
_NO_MEMBERS: Mapping[str, frozenset[str]] = {}


@quick_init
@dataclass(frozen=True, slots=True)
class Planned:
    """One policy to decide for this request: the client's identity and its limit."""

    policy: Any  # compiled.CompiledPolicy
    identity: str
    limit: Limit


def plan(
    request: Any,
    policies: Sequence[Any],
    config: Mapping[str, Any],
    state: Any = None,
    members: Mapping[str, frozenset[str]] = _NO_MEMBERS,
) -> tuple[list[Planned], list[Any]]:
    """The planned policies, and those whose key function raised (`failed`).

    A policy whose key finds no client (a `user` key on an anonymous request), or whose
    override exempts this client, is in neither: it does not apply. An override's limit
    replaces the policy's for this client (see `matching.overrides`); `members` are the
    snapshot's group memberships, the tier is asked once per request (`state`).
    """
    planned: list[Planned] = []
    failed: list[Any] = []
    proxies = _proxies.of(config)
    seen: dict[str, str | None] = {}  # policies sharing a key identify the client once
    now = 0.0  # read once, by the first policy with overrides
    for policy in policies:
        spec, key = policy.key_spec, policy.key
        try:
            if key in seen:
                identity = seen[key]
            else:
                identity = seen[key] = spec.read(request, proxies)
        except IdentityError as exc:
            log_identity_error(request, policy, exc)
            failed.append(policy)
            continue
        if identity is None:
            continue
        rule = None
        if policy.overrides is not None:
            now = now or runtime.clock().time()  # the app's one clock, as the windows'
            rule = policy.overrides.find(
                identity, now,
                lambda i=identity: members.get(i[5:], ()) if i.startswith("user:") else (),
                lambda: tier_of(request, state, config),
            )
            if rule is not None and rule.exempt:
                continue  # this client is exempt from this policy
        limit = policy.limit_for(identity, rule)
        if policy.cost_of is not None:
            cost = cost_of(request, policy, limit)
            if cost != limit.cost:  # a copy: the policy keeps its clients' limits
                limit = dataclasses.replace(limit, cost=cost)
        planned.append(Planned(policy, identity, limit))
    return planned, failed


class _LastProxies:
    """How the settings now say the client address is read, built once per settings (the
    pair swapped whole: a thread never reads one settings' proxies for another's)."""

    def __init__(self) -> None:
        self.last: tuple[Any, Proxies] = (None, Proxies())

    def of(self, config: Mapping[str, Any]) -> Proxies:
        seen, proxies = self.last
        if config is not seen:
            proxies = Proxies(config["TRUSTED_PROXIES"], config["IPV6_PREFIX"],
                              config["PROXY_HEADER"])
            self.last = (config, proxies)
        return proxies


_proxies = _LastProxies()


def cost_of(request: Any, policy: Any, limit: Limit) -> int:
    """The cost `policy`'s cost function gives `request`. A cost above what the limit can
    ever hold is cut to it (the request takes a full allowance, never passes for free);
    a function that fails, or answers something other than a positive integer, is logged
    and the policy's own cost charged."""
    try:
        cost = policy.cost_of(getattr(request, "_request", request))
    except KeyboardInterrupt:
        raise
    except BaseException:
        # SystemExit, GeneratorExit too: a function of the user's must not stop the
        # worker, nor turn the request into a 500
        logger.exception("ratelimits: policy %r: its cost function failed; charged the "
                         "policy's cost, %s", policy.name, limit.cost)
        return limit.cost
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        logger.error("ratelimits: policy %r: its cost function answered %.80r, not a "
                     "positive integer; charged the policy's cost, %s", policy.name, cost,
                     limit.cost)
        return limit.cost
    capacity = limit.capacity
    if cost > capacity:
        logger.warning("ratelimits: policy %r: a request costing %s is charged %s, all its "
                       "limit can hold", policy.name, cost, capacity)
        return capacity
    return cost


def tier_of(request: Any, state: Any, config: Mapping[str, Any]) -> str | None:
    """The request's tier from `RATELIMITS["TIER"]`, asked at most once per request; a
    function that fails is logged and the request has no tier."""
    if state is not None and state.tier_known:
        return state.tier  # type: ignore[no-any-return]
    tier = None
    if config["TIER"]:
        from django.utils.module_loading import import_string

        try:
            found = import_string(config["TIER"])(getattr(request, "_request", request))
            tier = None if found is None else str(found)
        except runtime.FUNCTION_FAILED:
            logger.exception("ratelimits: the TIER function failed; no tier for this request")
    if state is not None:
        state.tier, state.tier_known = tier, True
    return tier
