"""The replayer: each request of a log decided as the middleware would, at the log's time.

The policies that match a line's path and method are evaluated together on a fresh
in-process engine; a request refused by an enforced policy charges none, and a shadow
policy only counts what it would have refused. Nothing touches Redis or the database.

What a log cannot tell is not replayed, and the report says so: request headers and key
functions (`header:` and `call:` keys), DRF scopes (only unscoped policies apply), how
long a request was in flight (`concurrency`), and the `EXEMPT` function.

Per line, the work is a regex match, dictionary look-ups and one `MemoryEngine.decide()`:
the time of a timestamp string, the policies of a method and path (a route), and the
identities and prepared limits of a route, client IP and user (a plan) are cached.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from ratelimits.engine.charging import Prepared
from ratelimits.engine.memory import MemoryEngine
from ratelimits.engine.types import REFUND, Limit
from ratelimits.matching.identity import bounded, client_ip
from ratelimits.matching.keykinds import KEY_KINDS, KeyKind, Logged, LogReader
from ratelimits.matching.paths import normalize_path
from ratelimits.ops.replay.formats import PARSERS, BadLine, LogError, detect_format
from ratelimits.ops.replay.report import ShardTally, SlotTally
from ratelimits.pipeline.compiled import CompiledPolicy

#: Bounds of the per-run caches; a full cache is emptied (its content is recomputable).
CACHE_SIZE = 100_000
#: Lines between two progress reports (a power of two).
PROGRESS_EVERY = 1 << 15
BAD_EXAMPLES = 5
_SHOWN = 80  # characters of a malformed line quoted in an error

_NO_POLICY, _NOT_A_REQUEST = -1, -2


def unreplayable(policy: CompiledPolicy) -> str | None:
    """Why a policy cannot be replayed from an access log, or None when it can."""
    kind = KEY_KINDS[policy.key_spec.kind]
    if kind.from_log is None:
        if kind.not_in_log:
            return f"key {policy.key}: {kind.not_in_log}"
        return f"key {policy.key} cannot be read from an access log"
    if not policy.template.spec.replayable:
        algorithm = policy.template.algorithm
        if policy.template.spec.holds_slots:
            return f"{algorithm}: an access log does not say how long each request was in flight"
        return f"{algorithm} cannot be replayed from an access log"
    if policy.scope:
        return f"DRF scope {policy.scope!r}: a log does not say which view served a request"
    if policy.cost_of is not None:
        return "cost_function: an access log does not hold the request its cost is computed from"
    for rule, field, word in ((policy.charge_on, "charge_on", "failed"),
                              (policy.reset_on, "reset_on", "succeeded")):
        if rule is not None and rule.signal and not (rule.statuses or rule.classes):
            return f"{field}: an access log does not say whether a login {word}"
    return None


def split_kind(policies: Sequence[CompiledPolicy]) -> str | None:
    """The key kind to split a log by across processes, or None when it must not be split:
    the replayable policies must all count by the same per-client key (no `global`, no
    `query:`, no mix such as ip and user, whose requests tie clients together): each
    request's identities under such policies are one client's, so clients are decided
    independently."""
    kinds = {p.key_spec.kind for p in policies if unreplayable(p) is None}
    if len(kinds) == 1 and kinds <= KEY_KINDS.splittable:
        return str(kinds.pop())
    return None


def _log_reader(kind: KeyKind) -> LogReader:
    """How a log line gives a replayed policy's identity (`unreplayable` let it in)."""
    if kind.from_log is None:
        raise ValueError(f"key {kind.name} cannot be read from an access log")
    return kind.from_log


class _Plan:
    """What to ask the engine for one route, client IP and user: computed once, reused."""

    __slots__ = ("after", "idents", "missing", "per_sec", "preps", "shard", "slots")

    def __init__(
        self,
        slots: tuple[SlotTally, ...],
        idents: tuple[str, ...],
        preps: list[Prepared],
        missing: tuple[SlotTally, ...],
        per_sec: dict[int, int],
        shard: int = 0,
    ) -> None:
        self.slots, self.idents, self.preps = slots, idents, preps
        self.shard = shard  # the process that decides this client
        self.missing = missing  # matching policies with no identity for this client
        self.per_sec = per_sec  # shared by every plan with the same slots
        #: What an admitted request's status may do after it: per policy with charge_on
        #: or reset_on, (charge_on, reset_on, its settling prepared limit, its limit).
        self.after: tuple[tuple[int, Any, Any, Prepared, Limit], ...] = ()


def _path_of(target: str) -> str:
    """A request target (origin or absolute form, query removed) as the middleware sees it."""
    if not target.startswith("/"):
        _, sep, rest = target.partition("://")
        slash = rest.find("/")
        target = rest[slash:] if sep and slash >= 0 else "/"
    # The server percent-decodes PATH_INFO once before Django sees it.
    return normalize_path(unquote(target, errors="replace"))


class Replayer:
    """Replays log lines against compiled policies on one fresh in-process engine.

    `shard=(k, n)`: decide only the clients given to process k of n (the policies must
    allow it: `split_kind()`). Every process reads every line, so the figures about lines
    and the clock (for out-of-order lines) are the whole log's, and each gives a client
    to the same process: to the one with the fewest requests so far when the client is
    first seen (a log's few heavy clients are spread out; a hash would not balance them).
    """

    def __init__(
        self,
        policies: Sequence[CompiledPolicy],
        *,
        ipv6_prefix: int = 64,
        engine: MemoryEngine | None = None,
        shard: tuple[int, int] | None = None,
    ) -> None:
        self.engine = engine or MemoryEngine(prefix="replay:")
        self.ipv6_prefix = ipv6_prefix
        self.policies: list[CompiledPolicy] = []
        self.skipped: list[tuple[str, str]] = []
        for policy in policies:
            why = unreplayable(policy)
            if why is None:
                self.policies.append(policy)
            else:
                self.skipped.append((policy.name, why))
        self.split_by = None
        if shard is not None and shard[1] > 1:
            self.split_by = split_kind(self.policies)
            if self.split_by is None:
                raise ValueError("these policies cannot be split by client")
        self.shard = shard or (0, 1)
        self.tallies = [SlotTally() for _ in self.policies]
        self._kinds = [KEY_KINDS[p.key_spec.kind] for p in self.policies]
        self._routes: dict[tuple[str, str], tuple[int, bool]] = {}
        self._route_slots: list[tuple[int, ...]] = []  # indexes into self.policies
        self._route_ids: dict[tuple[int, ...], int] = {}
        self._plans: dict[tuple[int, str | None, str | None, str | None], _Plan] = {}
        self._groups: dict[tuple[int, ...], dict[int, int]] = {}
        self._owners: dict[str, int] = {}  # client -> process; never emptied
        self._load = [0] * self.shard[1]  # requests given to each process so far

    @property
    def names(self) -> list[tuple[str, str]]:
        """(name, mode) of each replayed policy, in order."""
        return [(p.name, p.mode) for p in self.policies]

    def _route(self, method: str, path: str) -> tuple[int, bool]:
        """The id of the policies matching a method and path, and whether one reads the query."""
        if len(self._routes) >= CACHE_SIZE:
            self._routes.clear()
        if not method.isalpha() or not path.startswith(("/", "http")):
            # "-", a TLS probe, "*", CONNECT host:port: nothing a Django view would see
            self._routes[(method, path)] = (_NOT_A_REQUEST, False)
            return _NOT_A_REQUEST, False
        normal, upper, scopes = _path_of(path), method.upper(), frozenset({""})
        matching = tuple(
            i for i, p in enumerate(self.policies) if p.applies_to(normal, upper, scopes)
        )
        if not matching:
            route = (_NO_POLICY, False)
        else:
            rid = self._route_ids.get(matching)
            if rid is None:
                rid = self._route_ids[matching] = len(self._route_slots)
                self._route_slots.append(matching)
            route = (rid, any(self._kinds[i].log_query for i in matching))
        self._routes[(method, path)] = route
        return route

    def _plan(self, key: tuple[int, str | None, str | None, str | None]) -> _Plan:
        if len(self._plans) >= CACHE_SIZE:
            self._plans.clear()
        rid, ip, user, query = key
        user = None if user == "-" else user
        address = None if ip is None else client_ip({"REMOTE_ADDR": ip}, (), self.ipv6_prefix)
        line = Logged(None if address is None else f"ip:{address}",
                      None if user is None else bounded("user", user), query)
        shard = 0  # a request without an identity is only counted (unidentified), by 0
        owner = None
        if self.split_by is not None:
            owner = _log_reader(KEY_KINDS[self.split_by])(line, "")
        if owner is not None:
            shard = self._owners.get(owner, -1)
            if shard < 0:
                shard = self._owners[owner] = self._load.index(min(self._load))
        if shard != self.shard[0]:
            plan = self._plans[key] = _Plan((), (), [], (), {}, shard)
            return plan
        matched, idents, preps, missing = [], [], [], []
        after: list[tuple[int, Any, Any, Prepared, Limit]] = []
        for i in self._route_slots[rid]:
            policy = self.policies[i]
            ident = _log_reader(self._kinds[i])(line, policy.key_spec.arg)
            if ident is None:
                missing.append(self.tallies[i])
                continue
            matched.append(i)
            idents.append(ident)
            limit = policy.limit_for(ident)
            preps.append(self.engine.prepare(limit))
            if policy.charge_on is not None or policy.reset_on is not None:
                refunding = dataclasses.replace(limit, stage=REFUND)
                after.append((len(preps) - 1, policy.charge_on, policy.reset_on,
                              self.engine.prepare(refunding), limit))
        group = tuple(matched)
        per_sec = self._groups.setdefault(group, {})
        slots = tuple(self.tallies[i] for i in group)
        plan = _Plan(slots, tuple(idents), preps, tuple(missing), per_sec, shard)
        plan.after = tuple(after)
        self._plans[key] = plan
        return plan

    # One loop with everything inlined: it runs once per log line, millions of times, and
    # a function call per step would cost more than the step.
    def run(  # noqa: C901
        self,
        lines: Iterable[str],
        *,
        source: str = "<log>",
        fmt: str = "auto",
        skip_bad: bool = False,
        progress: Callable[[], None] | None = None,
    ) -> ShardTally:
        """Replay `lines` into a `ShardTally`; LogError on the first malformed line unless
        `skip_bad`. `progress()` is called every `PROGRESS_EVERY` lines and at the end."""
        it = iter(lines)
        lineno = 0
        first = ""
        for first in it:
            lineno += 1
            if first.strip():
                break
        else:
            return self._tally("empty" if fmt == "auto" else fmt, lineno)
        if fmt == "auto":
            fmt = detect_format(first)
        fast, parse, to_epoch = PARSERS[fmt]

        stamps: dict[Any, tuple[float, int]] = {}
        routes, plans, route_of, plan_of = self._routes, self._plans, self._route, self._plan
        load = self._load
        decide = self.engine.decide
        clock = float("-inf")
        first_t: float | None = None
        requests = bad = no_request = out_of_order = 0
        examples: list[int] = []
        mask = PROGRESS_EVERY - 1 if progress is not None else -1

        start = lineno
        for lineno, line in enumerate(itertools.chain((first,), it), start):
            if not lineno & mask:
                progress()  # type: ignore[misc]
            m = fast(line)
            try:
                ip, user, stamp, method, path, query, status = (
                    m.groups() if m else parse(line))
                moment = stamps.get(stamp)
                if moment is None:
                    if len(stamps) >= CACHE_SIZE:
                        stamps.clear()
                    t = to_epoch(stamp)
                    moment = stamps[stamp] = (t, int(t // 1))
            except BadLine as exc:
                if not line.strip():
                    continue
                if not skip_bad:
                    shown = line.rstrip("\r\n")
                    shown = shown if len(shown) <= _SHOWN else shown[: _SHOWN - 1] + "…"
                    raise LogError(f"{source}:{lineno}: {exc}: {shown!r}") from None
                bad += 1
                if len(examples) < BAD_EXAMPLES:
                    examples.append(lineno)
                continue
            route = routes.get((method, path))
            if route is None:
                route = route_of(method, path)
            rid, reads_query = route
            if rid == _NOT_A_REQUEST:
                no_request += 1
                continue
            requests += 1
            t, sec = moment
            if t < clock:
                # A log written as requests finish is not quite in order. The engine's
                # state must not see time go backwards: replay at the latest time seen.
                out_of_order += 1
                t, sec = clock, int(clock // 1)
            else:
                clock = t
                if first_t is None:
                    first_t = t
            if rid < 0:
                continue
            key = (rid, ip, user, query if reads_query else None)
            plan = plans.get(key)
            if plan is None:
                plan = plan_of(key)
            load[plan.shard] += 1
            if plan.missing:
                for slot in plan.missing:
                    slot.unidentified += 1
            if not plan.preps:
                continue
            admitted, allowed = decide(plan.preps, t)
            if plan.after and admitted:
                self._settle(plan.after, status, t, allowed)
            per_sec = plan.per_sec
            per_sec[sec] = per_sec.get(sec, 0) + 1
            if 0 in allowed:
                for slot, ok, ident in zip(plan.slots, allowed, plan.idents, strict=True):
                    if not ok:
                        slot.refused += 1
                        slot.offenders[ident] = slot.offenders.get(ident, 0) + 1
        if progress is not None:
            progress()
        return self._tally(
            fmt,
            lineno,
            requests=requests,
            bad_lines=bad,
            bad_examples=tuple(examples),
            no_request=no_request,
            out_of_order=out_of_order,
            first=first_t,
            last=None if first_t is None else clock,
        )

    def _settle(self, after: tuple[tuple[int, Any, Any, Prepared, Limit], ...], status: Any,
                t: float, allowed: list[int]) -> None:
        """An admitted request's status, as the middleware acts on its response: a
        `reset_on` it names clears the client, a `charge_on` that does not name it takes
        back the units its admission reserved (`settling`)."""
        code = int(status) if status and status.isdigit() else None
        for i, charge_on, reset_on, refunding, limit in after:
            if reset_on is not None and reset_on.matches(code, False):
                self.engine.reset(limit, t)
            elif (charge_on is not None and allowed[i]
                  and not charge_on.matches(code, False)):
                self.engine.decide([refunding], t)

    def _tally(self, fmt: str, lines: int, **figures: Any) -> ShardTally:
        # Plans of the same policies share one per-second count; hand it to each policy.
        for group, per_sec in self._groups.items():
            for i in group:
                counts = self.tallies[i].per_sec
                for sec, n in per_sec.items():
                    counts[sec] = counts.get(sec, 0) + n
        self._groups.clear()
        self._plans.clear()  # their per-second counts were just handed to the policies
        return ShardTally(format=fmt, lines=lines, slots=self.tallies, **figures)
