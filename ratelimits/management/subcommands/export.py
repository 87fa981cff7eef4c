"""`manage.py ratelimits export [--output FILE]`: every policy as JSON, for `import`."""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.management.base import BaseCommand

from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.ops import policy_files


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="Write to FILE instead of standard output.")


def handle(command: BaseCommand, *, output: str | None = None, **_: object) -> None:
    content = policy_files.export_policies()
    text = policy_files.dumps(content)
    if output is None:
        command.stdout.write(text, ending="")
        return
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    command.stderr.write(f"Wrote {len(content['policies'])} policies to {output}.")


SUBCOMMAND = Subcommand(
    name="export",
    help="Write every policy as JSON (for `import`).",
    add_arguments=add_arguments,
    handle=handle,
)
