"""What a valid policy is: the rules of each field (shared with the policies declared in
code and loaded from files, which are checked before they are rows), and the rules
between a policy's fields that its `clean()` applies, each message on the field to
change."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import NON_FIELD_ERRORS

from ratelimits.conf import setting_or_default
from ratelimits.engine.calendar import NOMINAL_SECONDS
from ratelimits.engine.registry import (
    BURST_ALGORITHMS,
    LEARNED_ALGORITHMS,
    REGISTRY,
    WAITING_ALGORITHMS,
    WARMUP_ALGORITHMS,
)
from ratelimits.matching.keykinds import (
    KEY_KINDS,
    WEBSOCKET_RECEIVE,
    WEBSOCKET_SCOPES,
    parse_key,
)
from ratelimits.matching.paths import PathPattern
from ratelimits.matching.responses import CHARGE_WORD, RESET_WORD, parse_responses
from ratelimits.models.fields import Counting

if TYPE_CHECKING:
    from ratelimits.engine.types import Limit
    from ratelimits.models.policy import Policy

#: Records one message on the field it names.
Add = Callable[[str, str], None]

_METHOD = re.compile(r"^[A-Z]+$")
# `\Z`, not `$`: `$` also matches before a final newline, and the name reaches
# Prometheus labels, log lines and response headers.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")
NAME_RULE = "Use letters, digits, '-', '_', '.' or ':' (it appears in logs and headers)."
_SCOPE = re.compile(r"^[\w.:-]+$")

#: The longest `period` (seconds): a year, a leap year's 366 days. Quotas are sold per
#: day, month or year; a count kept longer is an account's balance, not a rate. It also
#: bounds what a refused client is told (Retry-After): at most one period, two for a
#: sliding window (its previous window still weighs), a bucket's refill, which is held to
#: a year as well, or a lockout (at most 30 days, `MAX_LOCKOUT`).
MAX_PERIOD = 366 * 86_400

# Where each rule of `Limit` lands in the form: the message's first words name the field.
_LIMIT_ERROR_FIELDS = (
    ("unknown algorithm", "algorithm"),
    ("limit must", "limit"),
    ("period must", "period"),
    ("burst", "burst"),
    ("batch", "batch"),
    ("max_wait", "max_wait"),
    ("warmup", "warmup"),
    ("floor", "floor"),
    ("cost must", "cost"),
    ("cost ", "cost"),
    ("lockout", "lockout"),
    ("charging after the response", "charge_on"),
    ("calendar", "calendar"),
    ("unknown time zone", "calendar"),
)


def name_error(name: object) -> str | None:
    """What is wrong with a policy name, or None when it is valid."""
    if not isinstance(name, str) or not name:
        return "A policy needs a name. " + NAME_RULE
    if len(name) > 100:
        return f"The name has {len(name)} characters; 100 at most."
    if not _NAME.match(name):
        return f"{name[:60]!r} is not a valid policy name. " + NAME_RULE
    return None


def rollout_error(key: str, rollout: object) -> str | None:
    """What is wrong with a rollout for a policy with this key, or None. A `global` key
    counts every request as one client: its one draw would enforce the policy for
    everyone or for no one, whatever the percentage."""
    if not isinstance(rollout, int) or rollout >= 100 or (key or "").strip() != "global":
        return None
    return (f"A global key counts every request as one client, so a rollout enforces the "
            f"policy for everyone or for no one, never for {rollout}% of requests. Set "
            "rollout to 100. To try the policy first, keep it in shadow and watch what it "
            "would refuse, or enforce it with a higher limit and lower it step by step; "
            "for a share of clients, count per client (ip, user, user_or_ip).")


def reset_error(key: str, reset_on: str) -> str | None:
    """What is wrong with clearing a count by `reset_on` under a policy counting by `key`,
    or None. A reset clears the count of the client that got the response: under a key
    that is not an account (an address, everyone, a header), an attacker gets such a
    response for itself (it logs into an account of its own) and clears the count of its
    guesses at someone else's."""
    if not (reset_on or "").strip():
        return None
    try:
        kind = KEY_KINDS[parse_key(key).kind]
    except ValueError:
        return None  # the key's own error says what to fix
    if kind.names_account or kind.calls_code:  # a function of yours: its answer is yours
        return None
    who = ("every client, counted as one" if kind.name == "global" else
           f"whoever sends the same {kind.name} value" if kind.client_sent else
           "everyone behind one address" if kind.name == "ip" else
           "clients that are not signed in by their address")
    return (f"A reset clears the count of the client that got the response, and a key of "
            f"{key!r} counts {who}: an attacker would get that response for itself (log "
            f"into an account of its own, answer its own code) and clear the count of its "
            f"guesses at other accounts. Clear reset_on, or count per account in a policy "
            f"of its own: key user, or post:username on a login form.")


def cost_function_error(path: str) -> str | None:
    """What is wrong with a cost function's dotted path, or None when it names a
    function of the request."""
    return request_function_error(path, "myapp.costs.rows_asked")


def request_function_error(path: str, example: str) -> str | None:
    """What is wrong with the dotted path of a function the request path calls with the
    request (a cost function, a `call:` key), or None. Only a function written in Python
    that takes the request as its one argument: a builtin or a class may do anything
    with it (`sys.exit` stops the worker), and a wrong signature fails every request."""
    import inspect

    from django.utils.module_loading import import_string

    shown = repr(path[:100])
    try:
        found = import_string(path)
    except Exception as exc:  # ImportError, ValueError ("."), the module's own errors
        return (f"{shown} cannot be imported ({type(exc).__name__}: {exc}); give the dotted "
                f"path to a function of the request, e.g. {example}.")
    if not callable(found):
        return f"{shown} is not a function; give a function of the request, e.g. {example}."
    if not inspect.isfunction(found):
        what = ("a builtin" if inspect.isbuiltin(found) else
                "a class" if inspect.isclass(found) else f"a {type(found).__name__}")
        return (f"{shown} is {what}, not a function written in Python; give a module-level "
                f"function that takes the request (def name(request): ...), e.g. {example}.")
    try:
        inspect.signature(found).bind(object())
    except TypeError:
        return (f"{shown} takes {inspect.signature(found)}: it must take the request as its "
                f"one argument (def name(request): ...), e.g. {example}.")
    return None


def saved_policy_errors(policy: Policy) -> dict[str, list[str]]:
    """What a saved policy holds that the request path cannot honour, by field (empty
    when nothing): a `call:` key or a cost function that no longer imports (a deploy
    renamed it), a period or a bucket past a year (a row saved before the bound). The
    admin refuses each of them at save; a row may predate the code it names."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    try:
        spec = parse_key((policy.key or "").strip())
    except ValueError:
        pass  # no key at all: the resolver skips the row, and logs why
    else:
        if spec.kind == "call":
            error = request_function_error(spec.arg, "call:myapp.keys.tenant")
            if error is not None:
                add("key", error)
    path = (policy.cost_function or "").strip()
    error = cost_function_error(path) if path else None
    if error is not None:
        add("cost_function", error)
    _check_bounds(policy, add)
    return errors


def split_methods(value: str) -> list[str]:
    """`"get, Post"` -> `["GET", "POST"]`; empty means every method."""
    return [m.strip().upper() for m in value.split(",") if m.strip()]


def policy_errors(policy: Policy) -> dict[str, list[str]]:
    """What is wrong with a policy, by field (empty when nothing is), after putting its
    free-text fields in their one written form as a form's `clean()` does."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    # one order, so "POST,GET" and "GET,POST" are the same figures
    policy.methods = ",".join(sorted(set(split_methods(policy.methods or ""))))
    for method in split_methods(policy.methods):
        if not _METHOD.match(method):
            add("methods", f"{method!r} is not an HTTP method; write e.g. GET,POST.")
    policy.scope = (policy.scope or "").strip()
    if policy.scope and not _SCOPE.match(policy.scope):
        add("scope", "Use letters, digits, '_', '-', '.' or ':' as in DRF's throttle_scope.")
    policy.path = (policy.path or "").strip()
    try:
        PathPattern(policy.path)
    except ValueError as exc:
        add("path", str(exc))
    _check_key(policy, add)
    _check_counted(policy, add)
    _check_websocket(policy, add)
    _check_learned(policy, add)
    if (policy.batch is not None and policy.counting == Counting.PER_PROCESS
            and policy.algorithm not in LEARNED_ALGORITHMS):
        add(
            "batch",
            "A per-process policy never calls the store, so it has no batch to lease; "
            "clear batch or count shared.",
        )
    _check_bounds(policy, add)
    _check_rate(policy, add)
    return errors


def _check_key(policy: Policy, add: Add) -> None:
    """The key, and what it must be for a rollout, a reset or a function of yours."""
    policy.key = (policy.key or "").strip()
    try:
        spec = parse_key(policy.key)
    except ValueError as exc:
        add("key", str(exc))
    else:
        error = (request_function_error(spec.arg, "call:myapp.keys.tenant")
                 if spec.kind == "call" else None)
        if error is not None:
            add("key", error)
    for field, error in (("rollout", rollout_error(policy.key, policy.rollout)),
                         ("reset_on", reset_error(policy.key, policy.reset_on))):
        if error is not None:
            add(field, error)


def _check_websocket(policy: Policy, add: Add) -> None:
    """What a WebSocket policy cannot have: methods (a connection attempt and a message
    are matched by path alone) and responses (a WebSocket has none); and the `connection`
    key, which names no one but the sender of a message."""
    if policy.key.partition(":")[0].lower() == "connection" and (
            policy.scope != WEBSOCKET_RECEIVE):
        add("key", f"connection counts the messages of each WebSocket connection: give the "
            f"policy the scope {WEBSOCKET_RECEIVE}, or choose another key.")
    if policy.scope not in WEBSOCKET_SCOPES:
        return
    if policy.methods:
        add("methods", "A WebSocket policy is matched by its path alone: leave methods empty.")
    for field in ("charge_on", "reset_on"):
        if getattr(policy, field):
            add(field, f"A WebSocket has no responses to look at: leave {field} empty.")


def _check_counted(policy: Policy, add: Add) -> None:
    """What is charged: the responses (`charge_on`, `reset_on`), the cost function,
    the calendar (which sets the period its windows are nominally long)."""
    rules = []
    for field, word in (("charge_on", CHARGE_WORD), ("reset_on", RESET_WORD)):
        value = (getattr(policy, field) or "").strip()
        setattr(policy, field, value)
        try:
            rules.append(parse_responses(value, word))
        except ValueError as exc:
            add(field, str(exc)[0].upper() + str(exc)[1:] + ".")
    charge, reset = rules if len(rules) == 2 else (None, None)
    if charge is not None and reset is not None:
        shared = charge.shared_with(reset)
        if shared:
            # a response that resets is not charged (settling): such a policy
            # would clear the very failures it is there to count
            add("reset_on", f"charge_on and reset_on both name {shared}: each such "
                "response would clear the client's count instead of being charged, so "
                "the policy would never count it. Name the failures in charge_on and "
                "the successes in reset_on.")
    policy.cost_function = (policy.cost_function or "").strip()
    if policy.cost_function:
        error = cost_function_error(policy.cost_function)
        if error is not None:
            add("cost_function", error)
    if policy.calendar in NOMINAL_SECONDS:
        policy.period = NOMINAL_SECONDS[policy.calendar]


def _check_learned(policy: Policy, add: Add) -> None:
    """An adaptive policy learns one limit per process from everything it matches:
    its key is `global` and it counts in process. (Its floor, cost and period are
    checked with the rest of the rate, by `Limit`.)"""
    spec = REGISTRY.get(policy.algorithm)
    if spec is None or not spec.learned:
        return
    policy.counting = Counting.PER_PROCESS  # each process learns its own limit
    if policy.key != "global":
        add("key", "An adaptive limit is learnt from all the requests the policy "
            "matches in a process, not per client: set the key to global.")
    if policy.batch is not None:
        add("batch", "An adaptive policy never calls the store; clear batch.")


def _check_bounds(policy: Policy, add: Add) -> None:
    """A period of at most a year, and a bucket that refills within one: what a refused
    client is told to wait for stays within them (`MAX_PERIOD`)."""
    period, limit = policy.period, policy.limit
    if not isinstance(period, int) or not isinstance(limit, int) or min(period, limit) < 1:
        return  # the fields' own validators say what is wrong
    if period > MAX_PERIOD:
        add("period", f"A period of {period} s is longer than a year: set at most "
            f"{MAX_PERIOD} (366 days). A refused client is told to come back when the "
            f"period lets it, and nothing is counted for longer than a year; for a quota "
            "per calendar day, week or month, choose the calendar instead.")
        return
    spec = REGISTRY.get(policy.algorithm)
    if spec is None or not spec.has_burst or spec.delays or policy.burst == 0:
        return  # a queue is held to MAX_DELAY (`_check_queue`); burst 0 has its message
    capacity = policy.burst if isinstance(policy.burst, int) else limit
    # a cold client is first paced at a third of the rate (`warmup`)
    slowest = 3 if policy.warmup else 1
    refill = capacity * period * slowest / limit
    if refill > MAX_PERIOD:
        longest = MAX_PERIOD * limit // (period * slowest)
        fixes = [f"set the burst to at most {longest}"] if longest >= 1 else []
        fixes += ["shorten the period or raise the limit"]
        if slowest > 1:
            fixes.append("clear the warm-up")
        warm = " with a warm-up (a cold client at a third of the rate)" if slowest > 1 else ""
        fix = "; ".join(fixes)
        add("burst", f"A bucket of {capacity} at {limit} per {period} s{warm} takes "
            f"{refill:.0f} s to refill, longer than a year ({MAX_PERIOD} s): a client that "
            f"spent it would be told to wait as long. {fix[0].upper()}{fix[1:]}.")


def _check_rate(policy: Policy, add: Add) -> None:
    """The algorithm's own rules (burst, capacity, batch), as the engine's `Limit`
    checks them: one message per mistake, on the field to change."""
    spec = REGISTRY.get(policy.algorithm)
    if spec is not None and not _check_waits(policy, spec, add):
        return
    if policy.burst is not None and spec is not None and not spec.has_burst:
        choices = [REGISTRY[name].label for name in BURST_ALGORITHMS]
        add(
            "burst",
            f"{spec.label.capitalize()} has no burst; clear it or choose "
            f"{', '.join(choices[:-1])} or {choices[-1]}.",
        )
    elif policy.burst == 0:
        add("burst", "Burst must be at least 1 (how many requests may come at once); "
            "leave it empty for the limit.")
    elif spec is not None and None not in (policy.limit, policy.period, policy.cost) and min(
        policy.limit, policy.period, policy.cost
    ) >= 1:  # an unknown algorithm, a value below 1: their field's validator said so
        try:
            limit = policy.as_limit("")
        except ValueError as exc:
            message = str(exc)
            field = next(
                (f for prefix, f in _LIMIT_ERROR_FIELDS if message.startswith(prefix)),
                NON_FIELD_ERRORS,
            )
            add(field, message[0].upper() + message[1:] + ".")
        else:
            _check_queue(spec, limit, add)


def _check_waits(policy: Policy, spec: Any, add: Add) -> bool:
    """max_wait and warm-up on an algorithm that takes them, and a wait no longer
    than MAX_DELAY; False when one is wrong (the rest is then not worth checking)."""
    if policy.max_wait is None or policy.max_wait < 0:
        return False  # the field's own validator says so
    ok = True
    for field, label, value, allowed, names in (
        ("max_wait", "max wait", policy.max_wait, spec.reserves, WAITING_ALGORITHMS),
        ("warmup", "warm-up", policy.warmup, spec.warms, WARMUP_ALGORITHMS),
    ):
        if value and not allowed:
            choices = [REGISTRY[name].label for name in names]
            add(field, f"{spec.label.capitalize()} cannot take a {label}; set it to 0 "
                f"or choose {', '.join(choices[:-1])} or {choices[-1]}.")
            ok = False
    max_delay = setting_or_default("MAX_DELAY")
    if policy.max_wait > max_delay:
        add("max_wait", f"A request is never held longer than RATELIMITS['MAX_DELAY'] "
            f"({max_delay:g} s); set the max wait to at most {max_delay:g} or raise "
            "MAX_DELAY.")
        ok = False
    return ok


def _check_queue(spec: Any, limit: Limit, add: Add) -> None:
    """A queue must drain within MAX_DELAY, less the max wait: a request is never
    held longer, so a longer queue would refuse requests that it claims to admit."""
    if not spec.delays:
        return
    max_delay = setting_or_default("MAX_DELAY")
    longest = spec.queue_within(limit, max_delay - limit.max_wait)
    if spec.burst_of(limit) > longest:
        wait = spec.burst_of(limit) * limit.period / limit.limit + limit.max_wait
        add("burst", f"A queue of {spec.burst_of(limit)} at this rate"
            f"{' and this max wait' if limit.max_wait else ''} holds a request up to "
            f"{wait:g} s, longer than RATELIMITS['MAX_DELAY'] ({max_delay:g} s); set the "
            f"queue to at most {longest}, raise the rate, or raise MAX_DELAY.")
