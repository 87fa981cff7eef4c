"""`manage.py ratelimits status [--json]`: every policy with its last hour of traffic.

The figures are the store's counters, all processes together. A server process counts in
memory and sends its counts to the store within a second (`engine.tally.FLUSH_EVERY`), so
the command first gives them that second: the figures count every request answered before
it started (`--no-wait` reads at once, without the last second). With the in-process
engine each server process counts in its own memory, out of a command's reach: the
policies are listed without figures, and one line says why (never zeros that look like an
idle site).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ratelimits import runtime
from ratelimits.engine.tally import FLUSH_EVERY
from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.management.subcommands.text import count, dumps, table
from ratelimits.models import Policy
from ratelimits.ops import observe
from ratelimits.ops.dashboard import UNKNOWN, percent
from ratelimits.pipeline import engines

#: How long the command lets the server processes send what they counted before it reads
#: the store: each sends its counts `FLUSH_EVERY` after counting them; the rest is time for
#: that send on a busy machine.
SETTLE = FLUSH_EVERY + 0.5

#: The scope column of a policy tied to no DRF scope (it sees what the middleware sees).
NO_SCOPE = "-"

#: What every engine shows: the policy as the admin's list does.
_SETTINGS = ("policy", "mode", "rollout", "algorithm", "rate", "key", "path", "scope")
#: The last hour's figures, right-aligned; only where a command can read them.
_FIGURES = ("admitted", "rejected", "would reject", "refused")
#: What the in-process engine prints instead of the figures, in one line.
IN_PROCESS = (
    "No figures: with the in-process engine the counts live inside the server processes, "
    "which a command cannot see (the admin's pages, served by them, show them). Use a "
    "shared store for figures here: Redis (RATELIMITS['CACHE'] on a django-redis cache, or "
    "RATELIMITS['REDIS_URL']) or PostgreSQL (RATELIMITS['DATABASE']), or any by its URL "
    "(RATELIMITS['STORE'])."
)


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
    parser.add_argument(
        "--no-wait", action="store_false", dest="wait",
        help=f"Read the counters at once, without the {SETTLE:g} s in which the server "
        "processes send the counts of the requests they have just answered.")


def handle(command: BaseCommand, *, json: bool = False, wait: bool = True,
           **_: object) -> None:
    policies = list(Policy.objects.order_by("-priority", "name"))  # the admin's order
    shared = engines.is_shared()
    error = None
    counts: dict[str, observe.PolicyCounts] = {}
    if shared:  # in process, this command's own engine has counted nothing: not read
        if wait:  # what the servers counted until now reaches the store meanwhile
            runtime.clock().sleep(SETTLE)
        try:
            counts = observe.last_hour([p.name for p in policies])
        except Exception as exc:  # the store is down: still show the policies
            error = f"{type(exc).__name__}: {exc}"
    rows = [_row(p, counts.get(p.name)) for p in policies]
    if error:
        command.stderr.write(
            f"Could not read the counters ({error}); figures shown as {UNKNOWN}.")
    if json:
        command.stdout.write(dumps({"policies": rows, "shared": shared, "error": error}))
        return
    if not rows:
        command.stdout.write("No policies. Add some in the admin (Rate limits → Policies).")
        return
    headers = _SETTINGS + _FIGURES if shared else _SETTINGS
    command.stdout.write(table(
        headers,
        [[*_settings(r), *_figures(r)] if shared else _settings(r) for r in rows],
        right={headers.index(h) for h in ("rollout", *_FIGURES) if h in headers},
    ))
    command.stdout.write(
        "Figures: the last 60 minutes, all processes (the store's counters)." if shared
        else IN_PROCESS)


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
        "cost_function": p.cost_function,
        "charge_on": p.charge_on,
        "reset_on": p.reset_on,
        "lockout": p.lockout,
        "calendar": p.calendar,
        "max_wait": p.max_wait,
        "warmup": p.warmup,
        "key": p.key,
        "path": p.path or "*",
        "methods": p.method_list,
        "scope": p.scope,
        "rollout": p.rollout,
        # None: not read (the in-process engine), or the store could not be read (`error`)
        "last_hour": None
        if c is None
        else {
            "admitted": c.admitted,
            "rejected": c.rejected,
            "would_reject": c.would_reject,
            "spared": c.spared,
            "charged": c.charged,
            "refused_share": c.refused_share,
            # an adaptive policy's samples: the mean limit and latency
            "mean_limit": c.mean_limit,
            "latency_ms": c.latency_ms,
        },
    }


def _settings(row: dict[str, Any]) -> list[str]:
    """The columns every engine shows: mode, rollout, rate, what it counts and matches."""
    return [row["name"], row["mode"], f"{row['rollout']}%", row["algorithm"], row["rate"],
            row["key"], row["path"], row["scope"] or NO_SCOPE]


def _figures(row: dict[str, Any]) -> list[str]:
    h = row["last_hour"]
    if h is None:
        return [UNKNOWN] * len(_FIGURES)
    return [count(h["admitted"]), count(h["rejected"]), count(h["would_reject"]),
            percent(h["refused_share"])]


SUBCOMMAND = Subcommand(
    name="status",
    help="Every policy with its last hour of traffic.",
    add_arguments=add_arguments,
    handle=handle,
)
