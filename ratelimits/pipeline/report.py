"""The request path's log lines and signals: rejections, would-be rejections, failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ratelimits import signals
from ratelimits.pipeline.state import http_request, process

logger = logging.getLogger("ratelimits")


def path_of(request: Any) -> str:
    try:
        return str(http_request(request).path)[:200]
    except Exception:
        return "?"


def report(request: Any, outcome: Any, sender: type) -> None:
    """One log record and one signal for a rejection or a would-be rejection."""
    from ratelimits.pipeline.identity import display_identity

    policy, result = outcome.policy, outcome.result
    path = path_of(request)
    shown = display_identity(outcome.identity)
    kwargs = {
        "request": http_request(request),
        "policy": policy.name,
        "key": policy.key_kind,
        "identity": shown,
        "retry_after": result.retry_after,
        "path": path,
    }
    extra = {f"ratelimits_{k}": v for k, v in kwargs.items() if k != "request"}
    if policy.shadow:
        level, what, signal = logging.WARNING, "shadow policy %s would reject", (
            signals.request_would_be_limited
        )
    else:
        level, what, signal = logging.INFO, "policy %s rejected", signals.request_limited
    logger.log(
        level,
        f"ratelimits: {what} %s %s (key %s, client %s, retry after %.1fs)",
        policy.name,
        http_request(request).method,
        path,
        policy.key_kind,
        shown,
        result.retry_after,
        extra=extra,
    )
    signal.send(sender=sender, **kwargs)


def log_identity_error(request: Any, policy: Any, exc: Exception) -> None:
    logger.error(
        "ratelimits: policy %s could not identify the client on %s (%s); on_error=%s",
        policy.name,
        path_of(request),
        exc,
        policy.on_error,
    )


def log_unexpected(request: Any) -> None:
    logger.exception("ratelimits: unexpected error while evaluating %s", path_of(request))


def log_unavailable(exc: Exception, config: Mapping[str, Any]) -> None:
    """Once per breaker cool-down: an outage is news, each request during it is not."""
    now = time.monotonic()
    last = process.last_unavailable_log
    if last == 0.0 or now - last >= config["BREAKER_COOLDOWN"]:
        process.last_unavailable_log = now
        logger.error(
            "ratelimits: the rate-limit store is unavailable (%s); "
            "policies fall back to their on_error",
            exc,
        )
