"""The subcommands of `manage.py ratelimits`, one module each, in the order `--help`
lists them. Each parses its arguments and prints; the work is done in `ratelimits.ops`.
"""

from __future__ import annotations

from ratelimits.management.subcommands import export, import_, replay, reset, status
from ratelimits.management.subcommands.subcommand import Subcommand

SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in (status.SUBCOMMAND, reset.SUBCOMMAND, replay.SUBCOMMAND, export.SUBCOMMAND,
              import_.SUBCOMMAND)
}
