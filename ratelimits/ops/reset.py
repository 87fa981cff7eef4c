"""Reset one client under one policy: what the admin's "reset this client" and
`manage.py ratelimits reset` both do with the client an operator typed; and forget a
deleted policy's figures, so a policy created later under its name starts from zero."""

from __future__ import annotations

import logging
from typing import Any

from ratelimits.conf import get_config
from ratelimits.engine.interfaces import Engine
from ratelimits.engine.local_first import HOLD
from ratelimits.matching.keykinds import identity_from_text
from ratelimits.pipeline.changes import announce_reset
from ratelimits.pipeline.compiled import compile_policy
from ratelimits.pipeline.engines import get_engine

logger = logging.getLogger("ratelimits")

#: What to type, for messages.
HINT = "as the offenders table and the logs show it (ip:203.0.113.9, user:7) or the bare value"


def reset_client(policy: Any, typed: str) -> str:
    """Forget `typed`'s state under `policy` (a Policy row) and return the identity reset.

    `typed` is read as the middleware would build the identity: "ip:203.0.113.9",
    "user:7", a hashed identity as logs show it, or a bare value ("2001:db8::1" counts as
    its /64). Raises ValueError with a message for the operator when the client cannot
    be one of this policy's, the policy is invalid, or the store does not answer.
    """
    if not (typed or "").strip():
        raise ValueError(f"enter the client to reset, {HINT}")
    try:
        compiled = compile_policy(policy)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"policy {policy.name!r} is invalid: {exc}") from exc
    identity = identity_from_text(compiled.key_spec.kind, typed, get_config()["IPV6_PREFIX"])
    try:
        get_engine().reset(compiled.limit_for(identity))
    except Exception as exc:  # a store outage: say so, never a traceback
        raise ValueError(
            f"could not reset {identity}: the store did not answer ({type(exc).__name__}: "
            f"{exc}); try again when it is back"
        ) from exc
    try:  # no process answers the client from a refusal it remembers
        announce_reset(policy.name)
    except Exception as exc:  # the reset is done: the others see it within HOLD
        logger.warning("ratelimits: reset %s under %r, but could not tell the other "
                       "processes (%s); they ask the store again within %g s", identity,
                       policy.name, exc, HOLD)
    return identity


def forget_figures(name: str, *, now: float | None = None, engine: Engine | None = None) -> None:
    """Delete what policy `name` did: its per-minute counters (the day they are kept) and
    its offenders (the hours they are kept), on the store or, for the in-process engine,
    in this process (`Engine.forget_figures`). Raises what the store raises."""
    (engine or get_engine()).forget_figures(name, now)
