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
from ratelimits.ops import charts, observe

logger = logging.getLogger("ratelimits")

#: Figures of the pages when the store cannot be read: shown as unknown, never an error.
UNKNOWN = "?"
#: The refused share of a span without requests.
NO_TRAFFIC = "—"
_HOUR_AXIS = ("60 min ago", "30 min ago", "now")

_P = ParamSpec("_P")
_T = TypeVar("_T")


def read_figures(
    what: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
) -> _T | None:
    """`fn(*args, **kwargs)`, or None when the store does not answer (`what` is logged)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # the admin must open even when Redis does not answer
        logger.warning("ratelimits: could not read %s for the admin: %s", what, exc)
        return None


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
    hour = read_figures("the last hour", observe.series, [name], 60)
    day = read_figures("the last day", observe.series, [name], 24 * 60)
    offenders = read_figures("the offenders", observe.offenders, name, 20)
    page = PolicyPage(
        store_unreadable=hour is None or day is None,
        offenders=offenders,
        key_kind=policy.key.split(":", 1)[0],
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
    policies: list[Policy], url: Callable[[Policy], str]
) -> list[DashboardRow]:
    """Every policy's last hour as a sparkline and totals, linked to `url(policy)`: one
    round trip in all."""
    names = [p.name for p in policies]
    per_minute = read_figures("the dashboard", observe.series, names, 60) if names else {}
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
