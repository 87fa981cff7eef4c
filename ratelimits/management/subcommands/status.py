"""`manage.py ratelimits status [--json]`: every policy with its last hour of traffic."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.management.subcommands.text import count, dumps, table
from ratelimits.models import Policy
from ratelimits.ops import observe
from ratelimits.ops.dashboard import UNKNOWN, percent
from ratelimits.pipeline import engines

_HEADERS = ("policy", "mode", "algorithm", "rate", "key", "path", "admitted", "rejected",
            "would reject", "refused")
#: The figures' columns, right-aligned.
_FIGURES = {6, 7, 8, 9}


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


def handle(command: BaseCommand, *, json: bool = False, **_: object) -> None:
    policies = list(Policy.objects.order_by("-priority", "name"))  # the admin's order
    error = None
    try:
        counts = observe.last_hour([p.name for p in policies])
    except Exception as exc:  # the store is down: still show the policies
        error, counts = f"{type(exc).__name__}: {exc}", {}
    rows = [_row(p, counts.get(p.name)) for p in policies]
    if error:
        command.stderr.write(
            f"Could not read the counters ({error}); figures shown as {UNKNOWN}.")
    if json:
        command.stdout.write(dumps({"policies": rows, "error": error}))
        return
    if not rows:
        command.stdout.write("No policies. Add some in the admin (Rate limits → Policies).")
        return
    command.stdout.write(table(
        _HEADERS,
        [[r["name"], r["mode"], r["algorithm"], r["rate"], r["key"], r["path"], *_figures(r)]
         for r in rows],
        right=_FIGURES,
    ))
    command.stdout.write(_source())


def _row(p: Policy, c: observe.PolicyCounts | None) -> dict[str, Any]:
    """One policy as `--json` prints it: its settings and its last hour (None: unread)."""
    return {
        "name": p.name,
        "mode": p.mode,
        "algorithm": p.algorithm,
        "rate": p.human_rate(),
        "limit": p.limit,
        "floor": p.floor,
        "period": p.period,
        "burst": p.burst,
        "cost": p.cost,
        "max_wait": p.max_wait,
        "warmup": p.warmup,
        "key": p.key,
        "path": p.path or "*",
        "methods": p.method_list,
        "scope": p.scope,
        "last_hour": None
        if c is None
        else {
            "admitted": c.admitted,
            "rejected": c.rejected,
            "would_reject": c.would_reject,
            "spared": c.spared,
            "refused_share": c.refused_share,
            # an adaptive policy's samples: the mean limit and latency
            "mean_limit": c.mean_limit,
            "latency_ms": c.latency_ms,
        },
    }


def _figures(row: dict[str, Any]) -> list[str]:
    h = row["last_hour"]
    if h is None:
        return [UNKNOWN] * 4
    return [count(h["admitted"]), count(h["rejected"]), count(h["would_reject"]),
            percent(h["refused_share"])]


def _source() -> str:
    """Where the figures come from, and why there are none without a shared store."""
    if engines.is_shared():
        return "Figures: the last 60 minutes, all processes (the store's counters)."
    return (
        "Figures: none to read. Without a Redis cache each server process counts in its "
        "own memory, which a command cannot see; the admin's pages (served by those "
        "processes) show them, or set up Redis (RATELIMITS['CACHE'])."
    )


SUBCOMMAND = Subcommand(
    name="status",
    help="Every policy with its last hour of traffic.",
    add_arguments=add_arguments,
    handle=handle,
)
