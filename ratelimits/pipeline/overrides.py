"""Overrides: a client, a network, a group or a tier that gets another limit, or none.

An override's `match` is written in its policy's key terms: `user:42`, `ip:203.0.113.7`,
a network `ip:203.0.113.0/24` or `ip:2001:db8::/48`, `header:<value>` (and `query:`,
`call:` values alike), `group:<Django group name>` for user keys, `tier:<name>` for the
tier `RATELIMITS["TIER"]` gives a request. Each policy's overrides compile into one
`OverrideTable` in the snapshot, so finding a client's override costs no query: a dict
lookup for an exact identity, one lookup per distinct prefix length for networks
(longest first), one per group or tier.

Precedence, for one client under one policy:

1. an exemption that matches it, at any level, wins (the policy skips the client);
2. else the most specific limit: an exact identity, then the longest network that holds
   the client's address, then its groups and its tier, the most generous of those.

An override whose `expires` has passed stops applying at that moment, without an edit.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ratelimits.engine.types import Limit
from ratelimits.pipeline.identity import identity_from_text

__all__ = ["Match", "OverrideTable", "Rule", "parse_match"]

#: The match kinds that name a set of clients rather than one identity.
GROUP, TIER = "group", "tier"
_USER_KEYS = frozenset({"user", "user_or_ip"})
_IP_KEYS = frozenset({"ip", "user_or_ip"})


@dataclass(frozen=True, slots=True)
class Match:
    """A parsed `match`: `kind` is "exact" (an identity), "network", "group" or "tier"."""

    kind: str
    value: Any  # the identity, an ip_network, or the group's or tier's name


def parse_match(key: str, text: str, ipv6_prefix: int = 64) -> Match:
    """`text` as a match for a policy keyed on `key`; ValueError saying what to write."""
    kind = key.split(":", 1)[0]
    text = (text or "").strip()
    what, sep, value = text.partition(":")
    if not sep or not value.strip():
        raise ValueError(f"write the kind and the value, e.g. {_example(kind)}")
    value = value.strip()
    if what == GROUP:
        if kind not in _USER_KEYS:
            raise ValueError(f"group: matches users; this policy counts by {kind}, "
                             f"so write e.g. {_example(kind)} or tier:<name>")
        return Match(GROUP, value)
    if what == TIER:
        return Match(TIER, value)
    if what == "ip" and kind in _IP_KEYS and "/" in value:
        return Match("network", _network(value, ipv6_prefix))
    allowed = ("user", "ip") if kind == "user_or_ip" else (kind,)
    if what not in allowed:
        raise ValueError(f"this policy counts by {key}: write e.g. {_example(kind)}, "
                         f"{GROUP + ':<Django group> or ' if kind in _USER_KEYS else ''}"
                         f"tier:<name>")
    return Match("exact", identity_from_text(what, value, ipv6_prefix))


def _network(value: str, ipv6_prefix: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not a network; write e.g. ip:203.0.113.0/24 or "
                         "ip:2001:db8::/48") from None
    if network.version == 6 and network.prefixlen > ipv6_prefix:
        raise ValueError(f"IPv6 clients are counted per /{ipv6_prefix} (IPV6_PREFIX): "
                         f"write a prefix of /{ipv6_prefix} or shorter")
    return network


def _example(kind: str) -> str:
    return {"ip": "ip:203.0.113.7 or ip:203.0.113.0/24", "user": "user:42",
            "user_or_ip": "user:42 or ip:203.0.113.0/24", "global": "tier:<name>"}.get(
                kind, f"{kind}:<value>")


@dataclass(frozen=True, slots=True)
class Rule:
    """What an override gives: `exempt`, or the engine limit `template` (its limit,
    burst and batch replace the policy's); `expires` (epoch seconds) or None."""

    id: int
    exempt: bool
    template: Limit | None = None
    expires: float | None = None

    def live(self, now: float) -> bool:
        return self.expires is None or now < self.expires

    def generosity(self) -> tuple[int, int, int]:
        t = self.template
        return (int(self.exempt), 0 if t is None else t.limit, 0 if t is None else t.burst or 0)


@dataclass(slots=True)
class OverrideTable:
    """One policy's overrides, laid out for lookups without a query."""

    exact: dict[str, Rule] = field(default_factory=dict)
    #: (IP version, prefix length) -> {network address as an int: rule}
    networks: dict[tuple[int, int], dict[int, Rule]] = field(default_factory=dict)
    #: per IP version, the prefix lengths present, longest first
    lengths: dict[int, list[int]] = field(default_factory=dict)
    groups: dict[str, Rule] = field(default_factory=dict)
    tiers: dict[str, Rule] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Iterable[tuple[Match, Rule]]) -> OverrideTable:
        table = cls()
        for match, rule in pairs:
            if match.kind == "exact":
                table.exact[match.value] = rule
            elif match.kind == "network":
                net = match.value
                table.networks.setdefault((net.version, net.prefixlen), {})[
                    int(net.network_address)] = rule
            elif match.kind == GROUP:
                table.groups[match.value] = rule
            else:
                table.tiers[match.value] = rule
        for version, length in table.networks:
            table.lengths.setdefault(version, []).append(length)
        for lengths in table.lengths.values():
            lengths.sort(reverse=True)
        return table

    @property
    def wants_groups(self) -> bool:
        return bool(self.groups)

    @property
    def wants_tier(self) -> bool:
        return bool(self.tiers)

    def find(self, identity: str, now: float, groups: Callable[[], Iterable[str]],
             tier: Callable[[], str | None]) -> Rule | None:
        """The override that applies to `identity` at `now`, by the precedence above;
        `groups()` and `tier()` are asked only when this policy has such overrides."""
        found = [r for r in self._candidates(identity, groups, tier) if r.live(now)]
        if not found:
            return None
        exempt = next((r for r in found if r.exempt), None)
        return exempt or found[0]

    def _candidates(self, identity: str, groups: Callable[[], Iterable[str]],
                    tier: Callable[[], str | None]) -> list[Rule]:
        """Matching rules, most specific first (groups and tiers: most generous first)."""
        out = []
        rule = self.exact.get(identity)
        if rule is not None:
            out.append(rule)
        if self.networks and identity.startswith("ip:"):
            out += self._in_networks(identity[3:])
        shared = []
        if self.groups:
            shared += [self.groups[g] for g in groups() if g in self.groups]
        if self.tiers:
            name = tier()
            if name is not None and name in self.tiers:
                shared.append(self.tiers[name])
        return out + sorted(shared, key=Rule.generosity, reverse=True)

    def _in_networks(self, text: str) -> list[Rule]:
        try:  # an IPv6 identity is its /64 network ("2001:db8:1:2::/64")
            address = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return []
        bits = address.max_prefixlen
        value = int(address.network_address)
        out = []
        for length in self.lengths.get(address.version, ()):
            if length > address.prefixlen:
                continue  # finer than the identity itself
            masked = value >> (bits - length) << (bits - length)
            rule = self.networks[(address.version, length)].get(masked)
            if rule is not None:
                out.append(rule)
        return out
