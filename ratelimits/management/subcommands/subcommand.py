"""What every subcommand of `manage.py ratelimits` declares."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name, its help line, its arguments and what it does.

    `handle(command, **options)` receives the running command (for its `stdout` and
    `stderr`) and every parsed option, the command's own included.
    """

    name: str
    help: str
    add_arguments: Callable[[ArgumentParser], None]
    handle: Callable[..., None]
