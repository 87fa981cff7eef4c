"""`manage.py ratelimits reset <policy> --key <identity>` (or `reset <policy>
<identity>`): forget one client's state under one policy."""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.management.base import BaseCommand, CommandError

from ratelimits.engine.local_first import LocalFirst
from ratelimits.management.subcommands.lookup import policy_named
from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.matching.identity import display_identity
from ratelimits.models import Policy
from ratelimits.ops import observe
from ratelimits.ops.reset import reset_client
from ratelimits.pipeline import engines
from ratelimits.pipeline.compiled import compile_policy


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("policy", help="The policy name.")
    parser.add_argument(
        "client", nargs="?",
        help="The client, as --key takes it: `reset login-ip 203.0.113.9` is "
        "`reset login-ip --key 203.0.113.9`.",
    )
    parser.add_argument(
        "--key",
        help="The client identity as logs and `status` show it (ip:203.0.113.9, user:7, "
        "header:k-123); the bare value works too (203.0.113.9, 7).",
    )


def handle(command: BaseCommand, *, policy: str, key: str | None = None,
           client: str | None = None, **_: object) -> None:
    if client is not None and key is not None and client != key:
        raise CommandError(f"two clients given, {client!r} and --key {key!r}: give one, "
                           "after the policy name or as --key")
    key = key if key is not None else client
    row = policy_named(policy)
    _check_valid(row)
    if not engines.is_shared():
        raise CommandError(
            "the limits are counted inside each server process (RATELIMITS['CACHE'] is "
            "not a Redis cache), which a management command cannot reach; restart the "
            "server processes to forget them"
        )
    if key is None or not key.strip():
        raise CommandError(
            f"reset needs --key <identity>: ratelimits never scans Redis for all the "
            f"clients of a policy. {_recent(row.name)}"
        )
    try:
        identity = reset_client(row, key)
    except ValueError as exc:
        raise CommandError(f"--key {key!r}: {exc}") from exc
    command.stdout.write(
        f"Reset {identity} under policy {row.name} ({row.human_rate()}, "
        f"{row.algorithm}): its next request starts afresh."
    )


def _check_valid(policy: Policy) -> None:
    """CommandError when `policy` does not compile, before anything else is asked."""
    try:
        compile_policy(policy)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"policy {policy.name!r} is invalid: {exc}") from exc


def _recent(name: str) -> str:
    """The clients the policy refused most lately, as a hint for `--key`; "" when the
    store does not answer."""
    try:
        engine = engines.get_engine()
        if isinstance(engine, LocalFirst):  # what this process refused, sent before reading
            engine.flush()
        recent = observe.offenders(name, 5, engine=engine)
    except Exception:  # only a hint: the error above says what matters
        return ""
    if not recent:
        return "It refused no client in the last two hours."
    shown = ", ".join(f"{display_identity(who)} ({n:,})" for who, n in recent)
    return (
        f"Clients it refused most in the last two hours: {shown}. "
        f"{observe.OFFENDERS_NOTE}"
    )


SUBCOMMAND = Subcommand(
    name="reset",
    help="Forget one client's state under one policy.",
    add_arguments=add_arguments,
    handle=handle,
)
