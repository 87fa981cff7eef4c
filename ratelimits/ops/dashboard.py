"""What the admin's pages show about the policies, ready for their templates: a policy's
figures and charts, the dashboard's rows, the list's last hour; and the refused share as
the admin and `manage.py ratelimits` both print it.

Each page reads its figures in a bounded number of pipelined round trips (see
`observe`), never by scanning Redis; a store outage leaves the figures unknown, never
an error page.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypedDict, TypeVar

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ratelimits.engine.registry import LEARNED_ALGORITHMS
from ratelimits.models import Mode, Policy
from ratelimits.models.fields import Counting, OnError
from ratelimits.ops import charts, observe
from ratelimits.pipeline import engines
from ratelimits.pipeline.resolver import DB_CHECK_EVERY

logger = logging.getLogger("ratelimits")

#: Figures of the pages when the store cannot be read: shown as unknown, never an error.
UNKNOWN = "?"
#: The refused share of a span without requests.
NO_TRAFFIC = "—"
_HOUR_AXIS = ("60 min ago", "30 min ago", "now")

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Reads:
    """A page's reads of the store: the figures of each, and the first failure (shown by
    the page's banner, `StoreNotice`). After a failure the page's other reads are not
    tried: a store that does not answer would make each wait for its timeout."""

    def __init__(self) -> None:
        self.failure: str | None = None

    def __call__(
        self, what: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T | None:
        """`fn(*args, **kwargs)`, or None when the store does not answer (`what` is logged,
        the failure kept)."""
        if self.failure is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the admin must open even when Redis does not answer
            logger.warning("ratelimits: could not read %s for the admin: %s", what, exc)
            if self.failure is None:
                self.failure = f"{type(exc).__name__}: {exc}"
            return None

    def notice(self) -> StoreNotice | None:
        """The page's banner: None when every read was answered."""
        return None if self.failure is None else store_notice(self.failure)


# -- what the policies do while the store does not answer ------------------------------------


@dataclass(frozen=True)
class StoreNotice:
    """The banner of an admin page whose reads the store did not answer: the error, and
    what each policy does meanwhile, by what its `on_error` makes of it."""

    failure: str
    #: (what those policies do, their names), for each kind of fallback that some have.
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    #: How often each process reads the policy table while the store is away (seconds).
    table_every: float = DB_CHECK_EVERY

    @property
    def affected(self) -> int:
        return sum(len(names) for _, names in self.groups)


#: What the enforced policies of each `on_error` do while the store does not answer.
_FALLBACKS = {
    OnError.DENY: "refusing every request they match, with a 503 (on_error: deny)",
    OnError.LOCAL: ("decided by each process alone, at its share of the limit: the limit "
                    "divided by the processes last seen live (on_error: local)"),
    OnError.ALLOW: "admitting every request they match, uncounted (on_error: allow)",
}
_SHADOW = "in shadow: refusing nothing and counting nothing, whatever their on_error"
_IN_PROCESS = ("deciding as usual: they count in each process (per-process or adaptive), "
               "without the store")
#: The banner's order: what refuses most first.
_ORDER = (*_FALLBACKS.values(), _SHADOW, _IN_PROCESS)


def _fallback_of(policy: Policy) -> str:
    """What `policy` does while the store does not answer, as the banner says it."""
    if policy.counting == Counting.PER_PROCESS or policy.algorithm in LEARNED_ALGORITHMS:
        return _IN_PROCESS
    if policy.mode == Mode.SHADOW:
        return _SHADOW
    return _FALLBACKS[OnError(policy.on_error)]


def store_notice(failure: str, policies: list[Policy] | None = None) -> StoreNotice:
    """The banner for a store that failed with `failure`: the policies that are not off
    (`policies`, else read now) grouped by what they do meanwhile, what refuses first."""
    if policies is None:
        policies = list(Policy.objects.exclude(mode=Mode.OFF))
    grouped: dict[str, list[str]] = {}
    for policy in sorted(policies, key=lambda p: p.name):
        if policy.mode != Mode.OFF:
            grouped.setdefault(_fallback_of(policy), []).append(policy.name)
    return StoreNotice(failure, tuple((what, tuple(grouped[what])) for what in _ORDER
                                      if what in grouped))


def probe_store() -> StoreNotice | None:
    """One read of the store (the policy version) for a page that reads no figures: its
    banner when the store does not answer, else None."""
    reads = Reads()
    reads("the store's policy version", lambda: engines.get_engine().read_version())
    return reads.notice()


def percent(share: float | None) -> str:
    """A refused share as "12.5%", or `NO_TRAFFIC` for a span without requests."""
    return NO_TRAFFIC if share is None else f"{100 * share:.1f}%"


def share_of(counts: observe.PolicyCounts | None) -> str:
    """The refused share of `counts`, or `UNKNOWN` when they could not be read."""
    return UNKNOWN if counts is None else percent(counts.refused_share)


def _safe(svg: str) -> SafeString:
    return mark_safe(svg)  # `charts` escapes every text it draws


# -- the policy list's last hour -----------------------------------------------------------


def short_count(n: int) -> str:
    """A count in at most four characters: 987, 1.2k, 45k, 1.2M (the cell's title gives
    it in full)."""
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            scaled = n / size
            text = f"{scaled:.1f}" if scaled < 9.95 else f"{round(scaled)}"
            return text.removesuffix(".0") + unit
    return str(n)


@dataclass(frozen=True)
class Figure:
    """One figure of the list's last-hour cell: `short` shown, `label` beside it, and the
    whole figure (`long`) as its title."""

    css: str
    short: str
    long: str
    label: str


def hour_figures(policy: Policy, counts: observe.PolicyCounts) -> list[list[Figure]]:
    """The list's last-hour cell in two lines: what it admitted; then what it refused or
    would have (each shown when its mode can make it or the hour has some) and the
    refused share."""
    refusals = []
    if policy.mode == Mode.ENFORCE or counts.rejected:
        refusals.append(("rl-rejected", counts.rejected, "rejected", "rejected"))
    if policy.mode == Mode.SHADOW or counts.would_reject:
        refusals.append(("rl-would-reject", counts.would_reject, "would reject",
                         "would have been rejected (shadow)"))
    if not refusals:
        refusals.append(("rl-refused", counts.refused, "refused", "refused"))
    share = share_of(counts)
    admitted = [Figure("rl-admitted", short_count(counts.admitted),
                       f"{counts.admitted:,} admitted", "admitted")]
    if policy.charge_on or counts.charged:
        admitted.append(Figure("rl-charged", short_count(counts.charged),
                               f"{counts.charged:,} charged after their response "
                               f"({policy.charge_on or 'charge on'})", "charged"))
    if counts.fallback:
        admitted.append(Figure("rl-fallback", short_count(counts.fallback),
                               f"{counts.fallback:,} decided by its on_error "
                               f"({policy.on_error}): the store did not answer",
                               "on_error"))
    return [
        admitted,
        [*(Figure(css, short_count(n), f"{n:,} {long}", label)
           for css, n, label, long in refusals),
         Figure("rl-share", share, f"{share} of the requests refused or would have been"
                if counts.total else "no requests", "")],
    ]


def hour_cell(policy: Policy, counts: observe.PolicyCounts | None) -> SafeString | str:
    """The list's last-hour cell: `hour_figures` as HTML, short figures with their full
    form as a title; `UNKNOWN` when the store could not be read."""
    if counts is None:
        return UNKNOWN
    lines = (
        format_html_join(" · ", '<span class="{}" title="{}">{}</span>{}', (
            (f.css, f.long, f.short, f" {f.label}" if f.label else "") for f in line))
        for line in hour_figures(policy, counts)
    )
    return format_html('<span class="rl-hour">{}</span>',
                       format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines)))


# -- a policy's page -----------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyPage:
    """What a policy's page shows above its form; each field is a name its template reads.

    The `hour_*` figures and the adaptive charts are None when the last hour could not be
    read (or, for the adaptive ones, for a policy that learns nothing); `day_chart` when
    the last day could not be; `offenders` when they could not be.
    """

    store_unreadable: bool
    offenders: list[tuple[str, int]] | None
    key_kind: str
    #: The banner: what the policies do while the store does not answer.
    store_notice: StoreNotice | None = None
    hour_counts: observe.PolicyCounts | None = None
    hour_share: str | None = None
    hour_chart: SafeString | None = None
    hour_rows: list[tuple[str, observe.PolicyCounts]] | None = None
    limit_chart: SafeString | None = None
    latency_chart: SafeString | None = None
    learnt_now: observe.PolicyCounts | None = None
    day_chart: SafeString | None = None

    def context(self) -> dict[str, Any]:
        """The template context: one name per field."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def policy_page(policy: Policy) -> PolicyPage:
    """A policy page's figures: three pipelined round trips (hour, day, offenders)."""
    name = policy.name
    reads = Reads()
    hour = reads("the last hour", observe.series, [name], 60)
    day = reads("the last day", observe.series, [name], 24 * 60)
    offenders = reads("the offenders", observe.offenders, name, 20)
    page = PolicyPage(
        store_unreadable=reads.failure is not None,
        offenders=offenders,
        key_kind=policy.key.split(":", 1)[0],
        store_notice=reads.notice(),
    )
    if hour is not None:
        page = _with_hour(page, name, hour[name])
        if policy.algorithm in LEARNED_ALGORITHMS:
            page = _with_learnt(page, name, hour[name])
    if day is not None:
        page = dataclasses.replace(page, day_chart=_safe(charts.line_chart(
            observe.buckets(day[name], 10),
            title=f"{name}: requests per 10 minutes, last 24 hours",
            axis=("24 h ago", "12 h ago", "now"), markers_every=12,
        )))
    return page


def _with_hour(page: PolicyPage, name: str, minutes: list[observe.PolicyCounts]) -> PolicyPage:
    """`page` with the last hour's totals, chart and table (minutes with traffic, newest
    first)."""
    counts = sum(minutes, observe.PolicyCounts())
    return dataclasses.replace(
        page,
        hour_counts=counts,
        hour_share=share_of(counts),
        hour_chart=_safe(charts.line_chart(
            minutes, title=f"{name}: requests per minute, last hour", axis=_HOUR_AXIS)),
        hour_rows=[
            (f"{60 - i} min ago" if i < 59 else "this minute", c)
            for i, c in enumerate(minutes) if c.total
        ][::-1],
    )


def _with_learnt(page: PolicyPage, name: str, minutes: list[observe.PolicyCounts]) -> PolicyPage:
    """`page` with an adaptive policy's limit and latency over the last hour, minute by
    minute, and its last minute with samples."""
    return dataclasses.replace(
        page,
        limit_chart=_safe(charts.line_chart(
            minutes, title=f"{name}: the limit learnt (requests in flight), last hour",
            axis=_HOUR_AXIS, series=charts.LIMIT_SERIES)),
        latency_chart=_safe(charts.line_chart(
            minutes, title=f"{name}: latency of the requests it admitted (ms), last hour",
            axis=_HOUR_AXIS, series=charts.LATENCY_SERIES)),
        learnt_now=next((c for c in reversed(minutes) if c.samples), None),
    )


# -- the dashboard -------------------------------------------------------------------------


class DashboardRow(TypedDict):
    """One policy on the dashboard: its last hour as totals and a sparkline."""

    policy: Policy
    url: str  # its page
    counts: observe.PolicyCounts | None  # None: the store could not be read
    share: str
    spark: SafeString | str  # "" without figures


def dashboard_rows(
    policies: list[Policy], url: Callable[[Policy], str], reads: Reads | None = None
) -> list[DashboardRow]:
    """Every policy's last hour as a sparkline and totals, linked to `url(policy)`: one
    round trip in all (through `reads`, which keeps its failure for the page's banner)."""
    names = [p.name for p in policies]
    reads = Reads() if reads is None else reads
    per_minute = reads("the dashboard", observe.series, names, 60) if names else {}
    rows = []
    for policy in policies:
        minutes = None if per_minute is None else per_minute.get(policy.name)
        counts = None if minutes is None else sum(minutes, observe.PolicyCounts())
        rows.append(DashboardRow(
            policy=policy,
            url=url(policy),
            counts=counts,
            share=share_of(counts),
            spark=_safe(charts.sparkline(minutes)) if minutes else "",
        ))
    return rows
