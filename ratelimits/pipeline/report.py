"""The request path's log lines and signals: rejections, would-be rejections, failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ratelimits import runtime, signals
from ratelimits.pipeline.state import http_request, process

logger = logging.getLogger("ratelimits")


#: Longest client-controlled value a log line shows (paths, methods, error texts).
MAX_LOGGED = 200


#: A signal to send: (signal, sender, keyword arguments).
Deferred = tuple[Any, Any, dict[str, Any]]

#: While set (the async stack deciding on the event loop), the signals of refusals are
#: collected here, and sent with `Signal.asend()` once the decision is made: your
#: receivers may be synchronous and query the database.
deferred_signals: ContextVar[list[Deferred] | None] = ContextVar(
    "ratelimits_deferred_signals", default=None
)


@contextmanager
def signals_deferred() -> Iterator[list[Deferred]]:
    """Collect the signals `report()` sends while this block runs, for `asend_all()`."""
    pending: list[Deferred] = []
    token = deferred_signals.set(pending)
    try:
        yield pending
    finally:
        deferred_signals.reset(token)


async def asend_all(pending: list[Deferred]) -> None:
    """Send the collected signals, in order (`Signal.asend()`)."""
    for signal, sender, kwargs in pending:
        await signal.asend(sender=sender, **kwargs)


def log_safe(value: Any, limit: int = MAX_LOGGED) -> str:
    """A client-controlled value made safe for one log line.

    CR, LF and every other non-printable character are escaped (`\\r\\n`), so a
    request cannot end our line and forge another; long values are cut with "…".
    """
    text = value if isinstance(value, str) else str(value)
    head = text[: limit + 1]
    if not head.isprintable():
        head = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in head)
    if len(head) > limit:
        return head[: limit - 1] + "…"
    return head


def path_of(request: Any) -> str:
    try:
        return log_safe(http_request(request).path)
    except Exception:
        return "?"


def method_of(request: Any) -> str:
    try:
        return log_safe(http_request(request).method, 20)
    except Exception:
        return "?"


def report(request: Any, outcome: Any, sender: type) -> None:
    """One log record and one signal for a rejection or a would-be rejection."""
    from ratelimits.matching.identity import display_identity

    if outcome.shadow:
        level, what, signal = logging.WARNING, "shadow policy %s would reject", (
            signals.request_would_be_limited
        )
    else:
        level, what, signal = logging.INFO, "policy %s rejected", signals.request_limited
    if not signal.receivers and not logger.isEnabledFor(level):
        return  # a flood answered from memory: nothing to tell, nothing to build
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
    logger.log(
        level,
        f"ratelimits: {what} %s %s (key %s, client %s, retry after %.1fs)",
        policy.name,
        method_of(request),
        path,
        policy.key_kind,
        shown,
        result.retry_after,
        extra=extra,
    )
    pending = deferred_signals.get()
    if pending is None:
        signal.send(sender=sender, **kwargs)
    else:  # the async stack sends them after the decision (receivers may query)
        pending.append((signal, sender, kwargs))


def log_unexpected(request: Any) -> None:
    logger.exception("ratelimits: unexpected error while evaluating %s", path_of(request))


def log_unavailable(exc: Exception, config: Mapping[str, Any]) -> None:
    """Once per breaker cool-down: an outage is news, each request during it is not."""
    now = runtime.clock().monotonic()
    last = process.last_unavailable_log
    if last == 0.0 or now - last >= config["BREAKER_COOLDOWN"]:
        process.last_unavailable_log = now
        logger.error(
            "ratelimits: the rate-limit store is unavailable (%s); "
            "policies fall back to their on_error",
            exc,
        )


#: Seconds between two lines about one policy decided by its on_error in one process: an
#: outage logs a line per policy every so often, with a count of the requests it held
#: back, never one per request.
FALLBACK_LOG_EVERY = 10.0

#: What each on_error did with the request, as a line about it says.
_FALLBACK_EFFECT = {
    "allow": "admitted the request, uncounted",
    "deny": "refused the request with 503",
    "local": "decided the request in this process, with its share of the limit",
    "shadow": "admitted the request: in shadow (or outside its rollout) a policy never "
              "refuses, whatever its on_error",
}


class LogThrottle:
    """Per subject (a policy's name), when a line was last logged and how many were held
    back since: a line passes once every `every` seconds. Thread-safe; its times are
    `runtime.clock().monotonic()` readings."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}

    def admit(self, subject: str, now: float) -> tuple[int, float] | None:
        """None: hold this line back (it is counted). Else the lines held back since the
        last one about `subject`, and how many seconds ago that one was (0, 0.0 for the
        first)."""
        with self._lock:
            last = self._seen.get(subject)
            if last is not None and now - last[0] < self.every:
                self._seen[subject] = (last[0], last[1] + 1)
                return None
            self._seen[subject] = (now, 0)
            return (0, 0.0) if last is None else (last[1], now - last[0])

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()


fallback_lines = LogThrottle(FALLBACK_LOG_EVERY)
runtime.on_reset(fallback_lines.reset)


def log_fallback(decided: Iterable[tuple[Any, bool]], exc: Exception) -> None:
    """A WARNING per policy whose request the store did not decide, so its on_error did:
    which policy, what its on_error did, and why; at most one per policy every
    `FALLBACK_LOG_EVERY` seconds, which counts the requests held back since the last.
    `decided`: (the compiled policy, whether it decides as in shadow) pairs."""
    if not logger.isEnabledFor(logging.WARNING):
        return
    now = runtime.clock().monotonic()
    cause = None
    for policy, shadow in decided:
        admitted = fallback_lines.admit(policy.name, now)
        if admitted is None:
            continue
        held, ago = admitted
        applied = "shadow" if shadow else policy.on_error
        cause = cause or log_safe(f"{type(exc).__name__}: {exc}")
        since = _held_back(held, ago)
        logger.warning(
            "ratelimits: policy %s decided by its on_error=%s: the store did not answer "
            "(%s), so it %s%s",
            policy.name, policy.on_error, cause,
            _FALLBACK_EFFECT.get(applied, applied), since,
            extra={"ratelimits_policy": policy.name, "ratelimits_on_error": policy.on_error,
                   "ratelimits_fallback": applied, "ratelimits_held_back": held},
        )


identity_lines = LogThrottle(FALLBACK_LOG_EVERY)
runtime.on_reset(identity_lines.reset)


def log_identity_error(request: Any, policy: Any, exc: Exception) -> None:
    """An ERROR when a policy's key could not be read (a key function raised): at most one
    per policy every `FALLBACK_LOG_EVERY` seconds, counting the requests held back, since
    a function that fails fails on every request."""
    admitted = identity_lines.admit(policy.name, runtime.clock().monotonic())
    if admitted is None:
        return
    held, ago = admitted
    logger.error(
        "ratelimits: policy %s could not identify the client on %s (%s); on_error=%s%s",
        policy.name,
        path_of(request),
        log_safe(exc),
        policy.on_error,
        _held_back(held, ago),
    )


def _held_back(held: int, ago: float) -> str:
    """What a rate-limited line adds: the lines held back since the last one."""
    if not held:
        return ""
    return (f" ({held} more such request{'' if held == 1 else 's'} in the {ago:.0f} s "
            "since the last line about it)")

