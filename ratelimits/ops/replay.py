"""Replay an access log against policies: what would they have refused, and whom?

Each request of the log is decided as the middleware would decide it, at the log's own
time, on a fresh in-process engine: the policies that match the path and method are
evaluated together, a request refused by an enforced policy charges none, and a shadow
policy only counts what it would have refused. Nothing touches Redis or the database;
`manage.py ratelimits replay` loads and compiles the policies and prints the `Report`.

Formats: Combined / Common Log Format, and JSON lines (see `JSON_KEYS`). What a log
cannot tell is not replayed, and the report says so: request headers and key functions
(`header:` and `call:` keys), DRF scopes (only unscoped policies apply), how long a
request was in flight (`concurrency`), and the `EXEMPT` function.

Speed: one compiled regex per line, timestamps, client identities, routes (method and
path to policies) and prepared limits cached, and `MemoryEngine.decide()`, which runs
the engine's own algorithms without building a `Decision`.
"""

from __future__ import annotations

import calendar
import datetime
import gzip
import io
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import parse_qsl, unquote

from ratelimits.engine.memory import MemoryEngine, Prepared
from ratelimits.pipeline.identity import _bounded, client_ip
from ratelimits.pipeline.paths import normalize_path
from ratelimits.pipeline.resolver import CompiledPolicy

__all__ = ["FORMATS", "LogError", "PolicyReport", "Report", "replay_file", "replay_lines"]

FORMATS = ("combined", "json")
#: JSON-lines field names, first present wins.
JSON_KEYS = {
    "time": ("time", "timestamp", "@timestamp"),
    "ip": ("ip", "client_ip", "remote_addr"),
    "method": ("method", "request_method"),
    "path": ("path", "uri", "request_uri", "url"),
    "user": ("user", "remote_user"),
}
REPLAYABLE_KEYS = frozenset({"ip", "user", "user_or_ip", "global", "query"})
#: Bounds of the per-run caches; a full cache is emptied (its content is recomputable).
CACHE_SIZE = 100_000
#: Lines between two progress reports.
PROGRESS_EVERY = 1 << 15
BAD_EXAMPLES = 5
_SHOWN = 80  # characters of a malformed line quoted in an error

_CLF = re.compile(
    r'(\S+) \S+ (\S+) \[([^\]]*)\] "([^"\\]*(?:\\.[^"\\]*)*)" (?:\d{3}|-) (?:\d+|-)(?:\s|$)'
)
_CLF_TIME = re.compile(
    r"(\d{1,2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2})(\.\d+)? ([+-])(\d{2}):?(\d{2})"
)
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_MISS = object()


class LogError(ValueError):
    """A line of the log could not be read; the message names the file and line."""


class _Bad(Exception):
    """One malformed line (the message says what is wrong)."""


@dataclass(frozen=True)
class PolicyReport:
    """What one policy would have done to the log's requests."""

    name: str
    mode: str
    matched: int  # requests the policy applied to (with an identity)
    refused: int  # requests this policy alone refused (or, in shadow, would have)
    peak_second: int  # most matched requests in one second
    peak_minute: int  # most matched requests in any 60 consecutive seconds
    offenders: tuple[tuple[str, int], ...]  # the most refused identities, most first
    unidentified: int = 0  # matching requests with no identity (anonymous, no IP)

    @property
    def refused_share(self) -> float | None:
        return self.refused / self.matched if self.matched else None


@dataclass(frozen=True)
class Report:
    """The outcome of one replay."""

    source: str
    format: str
    lines: int  # every line read, blank ones included
    policies: tuple[PolicyReport, ...]
    requests: int = 0  # lines replayed as requests
    skipped_policies: tuple[tuple[str, str], ...] = ()  # (name, why it was not replayed)
    bad_lines: int = 0
    bad_examples: tuple[int, ...] = ()  # line numbers of the first malformed lines
    no_request: int = 0  # lines without a request a Django view would see ("-", TLS probes)
    out_of_order: int = 0  # lines older than an earlier line: replayed at the later time
    first: float | None = None  # epoch seconds of the first and last request
    last: float | None = None
    seconds: float = 0.0  # wall time of the replay


def unreplayable(policy: CompiledPolicy) -> str | None:
    """Why a policy cannot be replayed from an access log, or None when it can."""
    kind = policy.key_spec.kind
    if kind == "header":
        return f"key {policy.key}: an access log does not record request headers"
    if kind == "call":
        return f"key {policy.key}: a key function needs the live request"
    if kind not in REPLAYABLE_KEYS:
        return f"key {policy.key} cannot be read from an access log"
    if policy.template.algorithm == "concurrency":
        return "concurrency: an access log does not say how long each request was in flight"
    if policy.scope:
        return f"DRF scope {policy.scope!r}: a log does not say which view served a request"
    return None


# -- reading ---------------------------------------------------------------------------


@contextmanager
def open_log(path: str) -> Iterator[tuple[IO[str], Callable[[], int], int | None]]:
    """The log as text lines (gzip detected by its magic bytes), a function returning how
    many bytes of the file were read so far, and the file size ("-": stdin, no size)."""
    import os
    import sys

    raw: Any = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        size = None if path == "-" else os.fstat(raw.fileno()).st_size
        binary = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline="")

        def position() -> int:
            try:
                return int(raw.tell())
            except OSError:  # a pipe
                return 0

        yield text, position, size
    finally:
        if path != "-":
            raw.close()


def detect_format(line: str) -> str:
    return "json" if line.lstrip().startswith("{") else "combined"


def _parse_combined(line: str) -> tuple[Any, str | None, str | None, str, str]:
    m = _CLF.match(line)
    if m is None:
        raise _Bad("not a combined-log line")
    ip, user, stamp, request = m.groups()
    parts = request.split(" ")
    if len(parts) not in (2, 3):
        return stamp, ip, None, "", ""  # "-", a TLS probe ... not a request Django sees
    return stamp, ip, None if user == "-" else user, parts[0], parts[1]


def _clf_time(stamp: Any) -> float:
    m = _CLF_TIME.fullmatch(stamp)
    month = _MONTHS.get(m.group(2).lower()) if m else None
    if m is None or month is None:
        raise _Bad(f"bad timestamp [{stamp}], expected e.g. [10/Oct/2000:13:55:36 -0700]")
    day, _, year, hh, mm, ss, frac, sign, oh, om = m.groups()
    try:
        t = calendar.timegm((int(year), month, int(day), int(hh), int(mm), int(ss)))
    except ValueError as exc:
        raise _Bad(f"bad timestamp [{stamp}]: {exc}") from None
    offset = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return t - offset + (float(frac) if frac else 0)


def _first(obj: dict[str, Any], what: str) -> Any:
    for key in JSON_KEYS[what]:
        value = obj.get(key)
        if value is not None:
            return value
    return None


def _parse_json(line: str) -> tuple[Any, str | None, str | None, str, str]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise _Bad(f"not a JSON line ({exc})") from None
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    stamp, method, path = _first(obj, "time"), _first(obj, "method"), _first(obj, "path")
    for what, value in (("time", stamp), ("method", method), ("path", path)):
        if value is None or value == "":
            raise _Bad(f"no {what} (keys {', '.join(JSON_KEYS[what])})")
    if isinstance(stamp, bool) or not isinstance(stamp, (str, int, float)):
        raise _Bad(f"time {stamp!r} is neither an ISO 8601 string nor epoch seconds")
    ip, user = _first(obj, "ip"), _first(obj, "user")
    user = None if user in (None, "", "-") else str(user)
    return stamp, None if ip is None else str(ip), user, str(method), str(path)


def _json_time(stamp: Any) -> float:
    if isinstance(stamp, (int, float)):
        return float(stamp)
    try:
        return float(stamp)  # epoch seconds written as a string
    except ValueError:
        pass
    text = stamp.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _Bad(f"time {stamp!r} is not ISO 8601 (e.g. 2024-05-01T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)  # naive: taken as UTC
    return moment.timestamp()


_PARSERS = {"combined": (_parse_combined, _clf_time), "json": (_parse_json, _json_time)}


# -- replaying -------------------------------------------------------------------------


class _Slot:
    """One replayed policy and what it saw."""

    __slots__ = ("kind", "offenders", "per_sec", "policy", "refused", "unidentified")

    def __init__(self, policy: CompiledPolicy) -> None:
        self.policy = policy
        self.kind = policy.key_spec.kind
        self.per_sec: dict[int, int] = {}  # matched requests per second (filled at the end)
        self.refused = 0
        self.offenders: dict[str, int] = {}
        self.unidentified = 0

    def report(self, top: int) -> PolicyReport:
        offenders = sorted(self.offenders.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return PolicyReport(
            name=self.policy.name,
            mode=self.policy.mode,
            matched=sum(self.per_sec.values()),
            refused=self.refused,
            peak_second=max(self.per_sec.values(), default=0),
            peak_minute=_peak(self.per_sec, 60),
            offenders=tuple(offenders),
            unidentified=self.unidentified,
        )


class _Plan:
    """What to ask the engine for one route, client IP and user: computed once, reused."""

    __slots__ = ("idents", "missing", "per_sec", "preps", "slots")

    def __init__(
        self,
        slots: tuple[_Slot, ...],
        idents: tuple[str, ...],
        preps: list[Prepared],
        missing: tuple[_Slot, ...],
        per_sec: dict[int, int],
    ) -> None:
        self.slots, self.idents, self.preps = slots, idents, preps
        self.missing = missing  # matching policies with no identity for this client
        self.per_sec = per_sec  # shared by every plan with the same slots


def _peak(per_sec: dict[int, int], window: int) -> int:
    """The most requests in any `window` consecutive seconds."""
    seconds = sorted(per_sec)
    best = total = lo = 0
    for sec in seconds:
        total += per_sec[sec]
        while seconds[lo] <= sec - window:
            total -= per_sec[seconds[lo]]
            lo += 1
        best = max(best, total)
    return best


def _path_of(target: str) -> str:
    """A request target (origin or absolute form, query removed) as the middleware sees it."""
    if not target.startswith("/"):
        _, sep, rest = target.partition("://")
        slash = rest.find("/")
        target = rest[slash:] if sep and slash >= 0 else "/"
    # The server percent-decodes PATH_INFO once before Django sees it.
    return normalize_path(unquote(target, errors="replace"))


def _query_identity(query: str | None, name: str) -> str | None:
    """What `request.GET.get(name)` gives (the last value), as a `query:` identity."""
    value = None
    for k, v in parse_qsl(query or "", keep_blank_values=True):
        if k == name:
            value = v
    value = value.strip() if value else None
    return _bounded("query", value) if value else None


_NO_POLICY, _NOT_A_REQUEST = -1, -2


class Replayer:
    """Replays log lines against compiled policies on one fresh in-process engine.

    Per line, the work is a regex match, dictionary look-ups and one `decide()`: the
    time of a timestamp string, the policies of a method and path (a route), and the
    identities and prepared limits of a route, client IP and user (a plan) are cached.
    """

    def __init__(
        self,
        policies: Sequence[CompiledPolicy],
        *,
        ipv6_prefix: int = 64,
        engine: MemoryEngine | None = None,
    ) -> None:
        self.engine = engine or MemoryEngine(prefix="replay:")
        self.ipv6_prefix = ipv6_prefix
        self.slots: list[_Slot] = []
        self.skipped: list[tuple[str, str]] = []
        for policy in policies:
            why = unreplayable(policy)
            if why is None:
                self.slots.append(_Slot(policy))
            else:
                self.skipped.append((policy.name, why))
        self._routes: dict[tuple[str, str], tuple[int, bool]] = {}
        self._route_slots: list[tuple[_Slot, ...]] = []
        self._route_ids: dict[tuple[_Slot, ...], int] = {}
        self._plans: dict[tuple[int, str | None, str | None, str | None], _Plan] = {}
        self._groups: dict[tuple[_Slot, ...], dict[int, int]] = {}

    def _route(self, method: str, path: str) -> tuple[int, bool]:
        """The id of the policies matching a method and path, and whether one reads the query."""
        if len(self._routes) >= CACHE_SIZE:
            self._routes.clear()
        if not method.isalpha() or not path.startswith(("/", "http")):
            # "-", a TLS probe, "*", CONNECT host:port: nothing a Django view would see
            self._routes[(method, path)] = (_NOT_A_REQUEST, False)
            return _NOT_A_REQUEST, False
        normal, upper = _path_of(path), method.upper()
        slots = tuple(s for s in self.slots if s.policy.applies_to(normal, upper, frozenset({""})))
        if not slots:
            route = (_NO_POLICY, False)
        else:
            rid = self._route_ids.get(slots)
            if rid is None:
                rid = self._route_ids[slots] = len(self._route_slots)
                self._route_slots.append(slots)
            route = (rid, any(s.kind == "query" for s in slots))
        self._routes[(method, path)] = route
        return route

    def _plan(self, key: tuple[int, str | None, str | None, str | None]) -> _Plan:
        if len(self._plans) >= CACHE_SIZE:
            self._plans.clear()
        rid, ip, user, query = key
        address = None if ip is None else client_ip({"REMOTE_ADDR": ip}, (), self.ipv6_prefix)
        by_kind: dict[str, str | None] = {
            "ip": None if address is None else f"ip:{address}",
            "user": None if user is None else _bounded("user", user),
            "global": "global",
        }
        by_kind["user_or_ip"] = by_kind["user"] or by_kind["ip"]
        slots, idents, preps, missing = [], [], [], []
        for slot in self._route_slots[rid]:
            if slot.kind == "query":
                ident = _query_identity(query, slot.policy.key_spec.arg)
            else:
                ident = by_kind[slot.kind]
            if ident is None:
                missing.append(slot)
                continue
            slots.append(slot)
            idents.append(ident)
            preps.append(self.engine.prepare(slot.policy.limit_for(ident)))
        group = tuple(slots)
        per_sec = self._groups.setdefault(group, {})
        plan = self._plans[key] = _Plan(group, tuple(idents), preps, tuple(missing), per_sec)
        return plan

    def run(
        self,
        lines: Iterable[str],
        *,
        source: str = "<log>",
        fmt: str = "auto",
        skip_bad: bool = False,
        top: int = 10,
        progress: Callable[[], None] | None = None,
    ) -> Report:
        """Replay `lines`; LogError on the first malformed line unless `skip_bad`."""
        started = time.perf_counter()
        it = iter(lines)
        lineno = 0
        first = ""
        for first in it:
            lineno += 1
            if first.strip():
                break
        else:
            return self._report(source, "empty" if fmt == "auto" else fmt, lineno, top, started)
        if fmt == "auto":
            fmt = detect_format(first)
        parse, to_epoch = _PARSERS[fmt]

        stamps: dict[Any, tuple[float, int]] = {}
        routes, plans = self._routes, self._plans
        decide = self.engine.decide
        clock = float("-inf")
        first_t: float | None = None
        requests = bad = no_request = out_of_order = 0
        examples: list[int] = []

        start = lineno
        for lineno, line in enumerate(itertools.chain((first,), it), start):
            if progress is not None and not lineno % PROGRESS_EVERY:
                progress()
            try:
                stamp, ip, user, method, target = parse(line)
                moment = stamps.get(stamp)
                if moment is None:
                    if len(stamps) >= CACHE_SIZE:
                        stamps.clear()
                    t = to_epoch(stamp)
                    moment = stamps[stamp] = (t, int(t // 1))
            except _Bad as exc:
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
            q = target.find("?")
            path = target if q < 0 else target[:q]
            route = routes.get((method, path))
            if route is None:
                route = self._route(method, path)
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
            key = (rid, ip, user, target[q + 1 :] if reads_query and q >= 0 else None)
            plan = plans.get(key)
            if plan is None:
                plan = self._plan(key)
            if plan.missing:
                for slot in plan.missing:
                    slot.unidentified += 1
            if not plan.preps:
                continue
            _, allowed = decide(plan.preps, t)
            per_sec = plan.per_sec
            per_sec[sec] = per_sec.get(sec, 0) + 1
            if 0 in allowed:
                for slot, ok, ident in zip(plan.slots, allowed, plan.idents, strict=True):
                    if not ok:
                        slot.refused += 1
                        slot.offenders[ident] = slot.offenders.get(ident, 0) + 1
        if progress is not None:
            progress()
        return self._report(
            source,
            fmt,
            lineno,
            top,
            started,
            requests=requests,
            bad_lines=bad,
            bad_examples=tuple(examples),
            no_request=no_request,
            out_of_order=out_of_order,
            first=first_t,
            last=None if first_t is None else clock,
        )

    def _report(
        self, source: str, fmt: str, lines: int, top: int, started: float, **figures: Any
    ) -> Report:
        for group, per_sec in self._groups.items():
            for slot in group:
                for sec, n in per_sec.items():
                    slot.per_sec[sec] = slot.per_sec.get(sec, 0) + n
        self._groups.clear()
        self._plans.clear()  # their per-second counts were just handed to the policies
        return Report(
            source=source,
            format=fmt,
            lines=lines,
            policies=tuple(s.report(top) for s in self.slots),
            skipped_policies=tuple(self.skipped),
            seconds=time.perf_counter() - started,
            **figures,
        )


def replay_lines(
    lines: Iterable[str],
    policies: Sequence[CompiledPolicy],
    *,
    ipv6_prefix: int = 64,
    **options: Any,
) -> Report:
    """Replay text lines; `options` as `Replayer.run()`."""
    return Replayer(policies, ipv6_prefix=ipv6_prefix).run(lines, **options)


def replay_file(
    path: str,
    policies: Sequence[CompiledPolicy],
    *,
    ipv6_prefix: int = 64,
    progress: Callable[[int, int | None], None] | None = None,
    **options: Any,
) -> Report:
    """Replay a log file (plain or gzip; "-" for stdin); `progress(bytes_read, size)`."""
    with open_log(path) as (text, position, size):
        tick = None if progress is None else (lambda: progress(position(), size))
        return Replayer(policies, ipv6_prefix=ipv6_prefix).run(
            text, source=path, progress=tick, **options
        )
