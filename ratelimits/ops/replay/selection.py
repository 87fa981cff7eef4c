"""The policies a replay runs: compiled in the resolver's order, an 'off' one named
explicitly observed as shadow, the invalid ones set aside with the reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from ratelimits.models import Mode, Policy
from ratelimits.pipeline.compiled import CompiledPolicy, compile_policy


@dataclass(frozen=True)
class Selection:
    """The compiled policies to replay, and (name, why) for those that could not be."""

    policies: tuple[CompiledPolicy, ...]
    invalid: tuple[tuple[str, str], ...]


def enabled_policies() -> list[Policy]:
    """What a replay runs when no policy is named: every policy that is not off."""
    return list(Policy.objects.exclude(mode=Mode.OFF))


def select(rows: Iterable[Policy]) -> Selection:
    """`rows` compiled for a replay, in the resolver's order; an 'off' one replays as
    shadow, so a policy named explicitly is observed and never blocks."""
    compiled, invalid = [], []
    for row in rows:
        try:
            c = compile_policy(row)
        except (ValueError, TypeError) as exc:
            invalid.append((row.name, f"invalid: {exc}"))
            continue
        if c.mode == "off":
            c = dataclasses.replace(c, template=dataclasses.replace(c.template, shadow=True))
        compiled.append(c)
    compiled.sort(key=lambda p: (-p.priority, -p.pattern.specificity, p.name))
    return Selection(tuple(compiled), tuple(invalid))
