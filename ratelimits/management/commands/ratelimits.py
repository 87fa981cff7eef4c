"""`manage.py ratelimits status | reset | replay | export | import`: look at, reset, try
out and move policies.

manage.py ratelimits status [--json]
manage.py ratelimits reset <policy> --key <identity>
manage.py ratelimits replay <access-log> [--format auto|combined|json] [--top N]
                            [--policy NAME ...] [--skip-bad] [--progress] [--jobs N]
                            [--json]
manage.py ratelimits export [--output FILE]
manage.py ratelimits import FILE [--dry-run] [--delete-missing]

Each subcommand is a module of `ratelimits.management.subcommands`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ratelimits.management.subcommands import SUBCOMMANDS


class Command(BaseCommand):
    help = ("Rate-limit policies: their last hour (status), reset a client, replay a log, "
            "export and import them as JSON.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        for subcommand in SUBCOMMANDS.values():
            subcommand.add_arguments(sub.add_parser(subcommand.name, help=subcommand.help))

    def handle(self, *args: Any, **options: Any) -> None:
        SUBCOMMANDS[options["subcommand"]].handle(self, **options)
