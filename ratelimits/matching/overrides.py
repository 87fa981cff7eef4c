"""Overrides: a client, a network, a group or a tier that gets another limit, or none.

An override's `match` is written in its policy's key terms: `user:42`, `ip:203.0.113.7`,
a network `ip:203.0.113.0/24` or `ip:2001:db8::/48`, `header:<value>` (and `query:`,
`call:` values alike), `group:<Django group name>` for user keys, `tier:<name>` for the
tier `RATELIMITS["TIER"]` gives a request. Each policy's overrides compile into one
`OverrideTable` in the snapshot, so finding a client's override costs no query: a dict
lookup for an exact identity, one lookup per distinct prefix length for networks
(longest first), one per group or tier.

Precedence, for one client under one policy: the most specific override that matches
it wins, exempt or not: an exact identity, then the longest network that holds the
client's address, then its groups and its tier, the most generous of those (an
exemption before any limit). So `ip:10.0.0.0/8` exempt with `ip:10.1.2.3` limited to 1
exempts the network but that one address. Two overrides of the same clients (which
`Override.clean()` refuses: rows saved before it did) are a tie, and the more generous
applies.

An override whose `expires` has passed stops applying at that moment, without an edit.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ratelimits.engine.types import Limit
from ratelimits.matching.keykinds import KEY_KINDS, identity_from_text, parse_key

__all__ = ["Match", "OverrideTable", "Rule", "parse_match"]

#: The match kinds that name a set of clients rather than one identity.
GROUP, TIER = "group", "tier"


@dataclass(frozen=True, slots=True)
class Match:
    """A parsed `match`: `kind` is "exact" (an identity), "network", "group" or "tier"."""

    kind: str
    value: Any  # the identity, an ip_network, or the group's or tier's name


def parse_match(key: str, text: str, ipv6_prefix: int = 64) -> Match:
    """`text` as a match for a policy keyed on `key`; ValueError saying what to write (or
    what is wrong with `key`)."""
    kind = KEY_KINDS[parse_key(key).kind]
    text = (text or "").strip()
    what, sep, value = text.partition(":")
    if not sep or not value.strip():
        raise ValueError(f"write the kind and the value, e.g. {kind.match_example}")
    value = value.strip()
    if what == GROUP:
        if not kind.reads_user:
            raise ValueError(f"group: matches users; this policy counts by {kind.name}, "
                             f"so write e.g. {kind.match_example} or tier:<name>")
        return Match(GROUP, value)
    if what == TIER:
        return Match(TIER, value)
    if what == "ip" and kind.name in KEY_KINDS.by_ip and "/" in value:
        return Match("network", _network(value, ipv6_prefix))
    if what not in kind.identity_kinds:
        raise ValueError(f"this policy counts by {key}: write e.g. {kind.match_example}, "
                         f"{GROUP + ':<Django group> or ' if kind.reads_user else ''}"
                         f"tier:<name>")
    return Match("exact", identity_from_text(what, value, ipv6_prefix))


def _network(value: str, ipv6_prefix: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not a network; write e.g. ip:203.0.113.0/24 or "
                         "ip:2001:db8::/48") from None
    address = ipaddress.ip_address(value.partition("/")[0])
    if address != network.network_address:
        # 10.1.2.3/8 is 10.0.0.0/8: a typo for the one address, or for the network?
        raise ValueError(f"{value!r} has bits set past its /{network.prefixlen}: the "
                         f"network it falls in is {network}; write ip:{network} for that "
                         f"network, or ip:{address} for the one address")
    if network.version == 6 and network.prefixlen > ipv6_prefix:
        raise ValueError(f"IPv6 clients are counted per /{ipv6_prefix} (IPV6_PREFIX): "
                         f"write a prefix of /{ipv6_prefix} or shorter")
    return network


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
    #: per IP version, (prefix length, shift, {network address as an int: rule}),
    #: longest prefix first
    networks: dict[int, list[tuple[int, int, dict[int, Rule]]]] = field(default_factory=dict)
    groups: dict[str, Rule] = field(default_factory=dict)
    tiers: dict[str, Rule] = field(default_factory=dict)
    #: per IP version, (shift, the networks' addresses shifted by it): the shortest
    #: prefix of them all, so an address outside every network costs one lookup
    coarse: dict[int, tuple[int, frozenset[int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Iterable[tuple[Match, Rule]]) -> OverrideTable:
        table = cls()
        by_length: dict[tuple[int, int], dict[int, Rule]] = {}
        for match, rule in pairs:
            if match.kind == "network":
                net = match.value
                _keep(by_length.setdefault((net.version, net.prefixlen), {}),
                      int(net.network_address), rule)
            else:
                _keep({"exact": table.exact, GROUP: table.groups}.get(match.kind, table.tiers),
                      match.value, rule)
        for (version, length), rules in sorted(by_length.items(), key=lambda kv: -kv[0][1]):
            bits = 32 if version == 4 else 128
            table.networks.setdefault(version, []).append((length, bits - length, rules))
        for version, levels in table.networks.items():
            shift = levels[-1][1]  # the shortest prefix's
            table.coarse[version] = (shift, frozenset(
                address >> shift for _, _, rules in levels for address in rules))
        return table

    def find(self, identity: str, now: float, groups: Callable[[], Iterable[str]],
             tier: Callable[[], str | None]) -> Rule | None:
        """The override that applies to `identity` at `now`, by the precedence above;
        `groups()` and `tier()` are asked only when this policy has such overrides."""
        rule = self.exact.get(identity)
        if rule is not None and rule.live(now):
            return rule  # nothing less specific can win over it
        if self.networks and identity.startswith("ip:"):
            found = next((r for r in self._in_networks(identity[3:]) if r.live(now)), None)
            if found is not None:
                return found
        shared = [r for r in self._shared(groups, tier) if r.live(now)]
        return max(shared, key=Rule.generosity) if shared else None

    def _shared(self, groups: Callable[[], Iterable[str]],
                tier: Callable[[], str | None]) -> list[Rule]:
        out: list[Rule] = []
        if self.groups:
            out += [self.groups[g] for g in groups() if g in self.groups]
        if self.tiers:
            name = tier()
            if name is not None and name in self.tiers:
                out.append(self.tiers[name])
        return out

    def _in_networks(self, text: str) -> Iterator[Rule]:
        """The networks holding an identity's address, longest first."""
        address = _address(text)
        if address is None:
            return
        version, value, own = address
        coarse = self.coarse.get(version)
        if coarse is None or value >> coarse[0] not in coarse[1]:
            return  # outside every network
        for length, shift, rules in self.networks[version]:
            if length <= own:  # not finer than the identity itself (an IPv6 /64)
                rule = rules.get(value >> shift << shift)
                if rule is not None:
                    yield rule


def _keep(slot: dict[Any, Rule], at: Any, rule: Rule) -> None:
    """Put `rule` at `at`, unless a more generous one is there: of two overrides of the
    same clients, the more generous applies, whatever order the rows come in."""
    known = slot.get(at)
    if known is None or (rule.generosity(), -rule.id) > (known.generosity(), -known.id):
        slot[at] = rule


def _address(text: str) -> tuple[int, int, int] | None:
    """An ip identity's address: (version, integer, prefix length), fast for the common
    shapes ("203.0.113.7", "2001:db8:1:2::/64"); None when it is not one."""
    address, _, prefix = text.partition("/")
    try:
        if ":" in address:
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6, address), "big")
            return 6, value, int(prefix) if prefix else 128
        return 4, int.from_bytes(socket.inet_aton(address), "big"), int(prefix or 32)
    except (OSError, ValueError):
        return None
