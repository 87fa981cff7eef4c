"""`manage.py ratelimits import FILE [--dry-run] [--delete-missing]`: create and update
policies from a file `export` wrote, all or none."""

from __future__ import annotations

import sys
from argparse import ArgumentParser

from django.core.management.base import BaseCommand, CommandError

from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.ops import policy_files

#: Each action's past tense, in the order the summary names them.
_DONE = {"create": "created", "update": "updated", "delete": "deleted",
         "unchanged": "unchanged"}


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("file", help="The JSON file; '-' reads standard input.")
    parser.add_argument("--dry-run", action="store_true",
                        help="Print what would change; write nothing.")
    parser.add_argument("--delete-missing", action="store_true",
                        help="Also delete the policies the file does not name.")


def handle(command: BaseCommand, *, file: str, dry_run: bool = False,
           delete_missing: bool = False, **_: object) -> None:
    try:
        changes = policy_files.plan_import(policy_files.read(_read(file)),
                                           delete_missing=delete_missing)
    except policy_files.PolicyFileError as exc:
        raise _refused(file, exc) from exc
    for change in changes:
        command.stdout.write(change.describe())
    summary = ", ".join(f"{n} {_DONE[a]}" for a in _DONE
                        if (n := sum(c.action == a for c in changes))) or "no policies"
    if dry_run:
        command.stdout.write(f"Dry run, nothing written; it would leave {summary}.")
        return
    try:
        policy_files.apply(changes)
    except policy_files.PolicyFileError as exc:
        raise _refused(file, exc) from exc
    command.stdout.write(f"Imported: {summary}.")


def _refused(file: str, exc: policy_files.PolicyFileError) -> CommandError:
    return CommandError(f"{file} is refused, nothing was changed:\n{exc}")


def _read(file: str) -> bytes:
    """The bytes of `file`, or of standard input for '-': no more than one past the most
    an import reads, so a huge file named by mistake is not loaded whole."""
    most = policy_files.MAX_BYTES + 1
    try:
        if file == "-":
            return sys.stdin.buffer.read(most)
        with open(file, "rb") as f:
            return f.read(most)
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from exc


SUBCOMMAND = Subcommand(
    name="import",
    help="Create and update policies from a file `export` wrote: every policy "
    "validated first, then all applied in one transaction, or none.",
    add_arguments=add_arguments,
    handle=handle,
)
