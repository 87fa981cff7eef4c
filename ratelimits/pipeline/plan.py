"""Who the client is for each matching policy, and the engine limit to check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratelimits.engine.types import Limit
from ratelimits.pipeline.report import log_identity_error


@dataclass(frozen=True, slots=True)
class Planned:
    """One policy to decide for this request: the client's identity and its limit."""

    policy: Any  # resolver.CompiledPolicy
    identity: str
    limit: Limit


def plan(
    request: Any, policies: Sequence[Any], config: Mapping[str, Any]
) -> tuple[list[Planned], list[Any]]:
    """The planned policies, and those whose key function raised (`failed`).

    A policy whose key finds no client (a `user` key on an anonymous request) is in
    neither: it does not apply.
    """
    from ratelimits.pipeline.identity import IdentityError

    planned: list[Planned] = []
    failed: list[Any] = []
    trusted, prefix = config["TRUSTED_PROXIES"], config["IPV6_PREFIX"]
    seen: dict[Any, str | None] = {}  # policies sharing a key identify the client once
    for policy in policies:
        spec = policy.key_spec
        try:
            if spec in seen:
                identity = seen[spec]
            else:
                identity = seen[spec] = spec.identify(
                    request,
                    trusted_proxies=trusted,
                    ipv6_prefix=prefix,
                    proxy_header=config["PROXY_HEADER"],
                )
        except IdentityError as exc:
            log_identity_error(request, policy, exc)
            failed.append(policy)
            continue
        if identity is not None:
            planned.append(Planned(policy, identity, policy.limit_for(identity)))
    return planned, failed
