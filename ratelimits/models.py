"""The admin-managed rate-limit policy: one row is one limit."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Self

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from ratelimits.conf import setting_or_default, time_zone
from ratelimits.engine.calendar import NOMINAL_SECONDS
from ratelimits.engine.registry import (
    BURST_ALGORITHMS,
    LEARNED_ALGORITHMS,
    REGISTRY,
    WAITING_ALGORITHMS,
    WARMUP_ALGORITHMS,
)
from ratelimits.engine.types import CHARGE, RESERVE, Limit
from ratelimits.matching.keykinds import KEY_KINDS, parse_key
from ratelimits.matching.overrides import parse_match
from ratelimits.matching.paths import PathPattern
from ratelimits.matching.responses import CHARGE_WORD, RESET_WORD, parse_responses

_METHOD = re.compile(r"^[A-Z]+$")
# `\Z`, not `$`: `$` also matches before a final newline, and the name reaches
# Prometheus labels, log lines and response headers.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")
NAME_RULE = "Use letters, digits, '-', '_', '.' or ':' (it appears in logs and headers)."
_SCOPE = re.compile(r"^[\w.:-]+$")

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


class Mode(models.TextChoices):
    ENFORCE = "enforce", "enforce"
    SHADOW = "shadow", "shadow (log only)"
    OFF = "off", "off"


class Counting(models.TextChoices):
    SHARED = "shared", "shared by every process (the store)"
    PER_PROCESS = "per_process", "per process (no store call)"


class OnError(models.TextChoices):
    ALLOW = "allow", "allow the request"
    DENY = "deny", "deny with 503"
    LOCAL = "local", "decide in this process"


ALGORITHM_CHOICES = [(entry.name, entry.label) for entry in REGISTRY.values()]


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


def split_methods(value: str) -> list[str]:
    """`"get, Post"` -> `["GET", "POST"]`; empty means every method."""
    return [m.strip().upper() for m in value.split(",") if m.strip()]


_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def human_period(seconds: int) -> str:
    """`60` -> "minute", `600` -> "10 minutes", `90` -> "90 seconds"."""
    for size, unit in _UNITS:
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds} seconds"  # pragma: no cover - every integer is a multiple of 1


class KeyField(models.CharField):  # type: ignore[type-arg]
    """A policy's `key`: its form lists the key kinds declared now (`KEY_KINDS`), so a
    new kind shows in the admin without a migration for the field's help text."""

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{**kwargs, "help_text": KEY_KINDS.help_text()})


class AlgorithmField(models.CharField):  # type: ignore[type-arg]
    """A policy's `algorithm`, one of the registry's (`engine.registry.REGISTRY`): the
    choices are read from it when the model loads and are not written into migrations,
    so a new algorithm is its registry entry, with no migration for the field."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["choices"] = ALGORITHM_CHOICES
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("choices", None)
        return name, path, args, kwargs


class Policy(models.Model):
    """One rate limit: who is counted (`key`), on which requests, how many per period."""

    name = models.CharField(
        max_length=100,
        unique=True,
        validators=[
            RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$", NAME_RULE)
        ],
        help_text="Unique; shown in logs, response headers and signals.",
    )
    description = models.TextField(blank=True)
    mode = models.CharField(
        max_length=10,
        choices=Mode.choices,
        default=Mode.SHADOW,
        help_text="Shadow only logs what it would reject; start there, then enforce.",
    )
    rollout = models.PositiveSmallIntegerField(
        default=100,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Percent of clients an enforced policy is enforced for (1-100); the others "
        "are counted as in shadow. The same clients stay in as it rises.",
    )
    algorithm = AlgorithmField(max_length=20, default="sliding_window")
    limit = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Requests (or cost units) per period; for concurrency, requests in flight; "
        "for adaptive, the most requests in flight it may ever learn, per process.",
    )
    period = models.PositiveIntegerField(
        default=60,
        validators=[MinValueValidator(1)],
        help_text="Seconds, e.g. 1, 60, 600 (10 minutes), 3600; for adaptive, the time "
        "between probes of the unloaded latency (at least 2).",
    )
    floor = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Adaptive only: the fewest requests in flight it ever allows per process "
        "(1 to the limit); empty: 1.",
    )
    burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Capacity of token bucket, leaky bucket and gcra (how many requests may "
        "come at once); empty: the limit. Other algorithms have none.",
    )
    cost = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="Units one request consumes."
    )
    cost_function = models.CharField(
        "cost function",
        max_length=255,
        blank=True,
        help_text="Dotted path to a function of the request returning its cost (a positive "
        "integer), e.g. myapp.costs.rows_asked; empty: the cost above. A wrong answer is "
        "logged and the cost above charged.",
    )
    charge_on = models.CharField(
        "charge on",
        max_length=100,
        blank=True,
        help_text="Charge only these responses: status codes and classes (401,403 or 4xx), "
        "or login_failed (Django's user_login_failed during the request). A client at its "
        "limit is still refused before the view. Empty: every admitted request.",
    )
    reset_on = models.CharField(
        "reset on",
        max_length=100,
        blank=True,
        help_text="Responses that clear the client's count (and lockout): status codes and "
        "classes, or login (Django's user_logged_in during the request). Empty: none.",
    )
    lockout = models.PositiveIntegerField(
        default=0,
        help_text="Seconds a client this policy refuses stays refused, whatever its count "
        "does; Retry-After says when it ends, and Reset this client ends it. 0: none.",
    )
    calendar = models.CharField(
        max_length=5,
        blank=True,
        choices=[("day", "calendar day"), ("week", "calendar week (from Monday)"),
                 ("month", "calendar month")],
        help_text="Fixed window only: count per day, week or month of settings.TIME_ZONE, "
        "reset at local midnight and on the 1st, instead of per period.",
    )
    max_wait = models.FloatField(
        "max wait",
        default=0,
        validators=[MinValueValidator(0)],
        help_text="Seconds a request may wait for its turn instead of being refused: one "
        "whose turn comes within it is held that long, then served. Token bucket, leaky "
        "bucket and gcra; 0: refuse at once.",
    )
    warmup = models.PositiveIntegerField(
        "warm-up",
        default=0,
        help_text="Seconds of use over which a client that was idle starts at a third of "
        "the rate, without burst, and rises to the full rate. Token bucket and gcra; 0: "
        "none.",
    )
    batch = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Units a process takes from the store at once and spends locally (a "
        "lease): far fewer store calls, never more admitted than the limit. Fixed and "
        "sliding window only; empty: every request asks the store.",
    )
    counting = models.CharField(
        max_length=12,
        choices=Counting.choices,
        default=Counting.SHARED,
        help_text="Per process: each process counts alone, without a store call (a "
        "per-node safety net beside a shared limit).",
    )
    key = KeyField(
        max_length=255,
        default="ip",
        help_text="Who is counted, e.g. ip, user or header:X-Api-Key; the docs' Policies "
        "page (Keys) lists every kind.",
    )
    path = models.CharField(
        max_length=255,
        default="*",
        blank=True,
        help_text="Path pattern: /api/login/, /api/*/items/ (* is one segment), "
        "/static/** (** is any number); * or empty: every path.",
    )
    methods = models.CharField(
        max_length=100, blank=True, help_text="Comma-separated, e.g. POST,PUT; empty: all."
    )
    scope = models.CharField(
        max_length=100,
        blank=True,
        help_text="DRF throttle_scope: the policy then applies only to DRF views with that "
        "scope (through PolicyThrottle).",
    )
    on_error = models.CharField(
        max_length=10,
        choices=OnError.choices,
        default=OnError.ALLOW,
        help_text="What to do when the store is unreachable.",
    )
    priority = models.IntegerField(
        default=0, help_text="Higher first when several policies match (headers, logs)."
    )
    declared = models.BooleanField(
        default=False,
        editable=False,
        help_text="Declared in code with @ratelimit: the code sets its rate, key and "
        "methods; mode, rollout, on_error and overrides are yours.",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-priority", "name"]
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.name

    # -- validation ---------------------------------------------------------------------

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refuse an invalid name on every save: code that creates rows without
        `full_clean()` must not put a raw control character in a metric label or a log."""
        error = name_error(self.name)
        if error is not None:
            raise ValidationError({"name": [error]})
        super().save(*args, **kwargs)

    def clean_fields(self, exclude: Any = None) -> None:
        # The field's validator is a `$` regex, which lets a final newline through; check
        # the name as save() will, so a form shows the error on the field instead.
        errors: dict[str, Any] = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        if "name" not in errors and "name" not in (exclude or ()):
            error = name_error(self.name)
            if error is not None:
                errors["name"] = [error]
        if errors:
            raise ValidationError(errors)

    def validate_unique(self, exclude: Any = None) -> None:
        """Unique names, ignoring case as well: `Login` beside `login` would be two
        policies that logs, headers and metrics cannot tell apart at a glance."""
        super().validate_unique(exclude)
        if "name" in (exclude or ()) or not isinstance(self.name, str) or not self.name:
            return
        other = (Policy.objects.filter(name__iexact=self.name).exclude(pk=self.pk)
                 .values_list("name", flat=True).first())
        if other is not None and other != self.name:  # the same name: the field says so
            raise ValidationError({"name": [
                f"A policy named {other!r} exists; names may not differ only in case. "
                "Choose another name, or change that policy."]})

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}

        def add(field: str, message: str) -> None:
            errors.setdefault(field, []).append(message)

        # one order, so "POST,GET" and "GET,POST" are the same figures
        self.methods = ",".join(sorted(set(split_methods(self.methods or ""))))
        for method in split_methods(self.methods):
            if not _METHOD.match(method):
                add("methods", f"{method!r} is not an HTTP method; write e.g. GET,POST.")
        self.scope = (self.scope or "").strip()
        if self.scope and not _SCOPE.match(self.scope):
            add("scope", "Use letters, digits, '_', '-', '.' or ':' as in DRF's throttle_scope.")
        self.path = (self.path or "").strip()
        try:
            PathPattern(self.path)
        except ValueError as exc:
            add("path", str(exc))
        self._check_key(add)
        self._check_counted(add)
        self._check_learned(add)
        if (self.batch is not None and self.counting == Counting.PER_PROCESS
                and self.algorithm not in LEARNED_ALGORITHMS):
            add(
                "batch",
                "A per-process policy never calls the store, so it has no batch to lease; "
                "clear batch or count shared.",
            )
        self._check_rate(add)
        if errors:
            raise ValidationError(errors)

    def _check_key(self, add: Any) -> None:
        """The key, and what it must be for a rollout, a reset or a function of yours."""
        self.key = (self.key or "").strip()
        try:
            spec = parse_key(self.key)
        except ValueError as exc:
            add("key", str(exc))
        else:
            error = (request_function_error(spec.arg, "call:myapp.keys.tenant")
                     if spec.kind == "call" else None)
            if error is not None:
                add("key", error)
        for field, error in (("rollout", rollout_error(self.key, self.rollout)),
                             ("reset_on", reset_error(self.key, self.reset_on))):
            if error is not None:
                add(field, error)

    def _check_counted(self, add: Any) -> None:
        """What is charged: the responses (`charge_on`, `reset_on`), the cost function,
        the calendar (which sets the period its windows are nominally long)."""
        rules = []
        for field, word in (("charge_on", CHARGE_WORD), ("reset_on", RESET_WORD)):
            value = (getattr(self, field) or "").strip()
            setattr(self, field, value)
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
        self.cost_function = (self.cost_function or "").strip()
        if self.cost_function:
            error = cost_function_error(self.cost_function)
            if error is not None:
                add("cost_function", error)
        if self.calendar in NOMINAL_SECONDS:
            self.period = NOMINAL_SECONDS[self.calendar]

    def _check_learned(self, add: Any) -> None:
        """An adaptive policy learns one limit per process from everything it matches:
        its key is `global` and it counts in process. (Its floor, cost and period are
        checked with the rest of the rate, by `Limit`.)"""
        spec = REGISTRY.get(self.algorithm)
        if spec is None or not spec.learned:
            return
        self.counting = Counting.PER_PROCESS  # each process learns its own limit
        if self.key != "global":
            add("key", "An adaptive limit is learnt from all the requests the policy "
                "matches in a process, not per client: set the key to global.")
        if self.batch is not None:
            add("batch", "An adaptive policy never calls the store; clear batch.")


    def _check_rate(self, add: Any) -> None:
        """The algorithm's own rules (burst, capacity, batch), as the engine's `Limit`
        checks them: one message per mistake, on the field to change."""
        spec = REGISTRY.get(self.algorithm)
        if spec is not None and not self._check_waits(spec, add):
            return
        if self.burst is not None and spec is not None and not spec.has_burst:
            choices = [REGISTRY[name].label for name in BURST_ALGORITHMS]
            add(
                "burst",
                f"{spec.label.capitalize()} has no burst; clear it or choose "
                f"{', '.join(choices[:-1])} or {choices[-1]}.",
            )
        elif self.burst == 0:
            add("burst", "Burst must be at least 1 (how many requests may come at once); "
                "leave it empty for the limit.")
        elif spec is not None and None not in (self.limit, self.period, self.cost) and min(
            self.limit, self.period, self.cost
        ) >= 1:  # an unknown algorithm, a value below 1: their field's validator said so
            try:
                limit = self.as_limit("")
            except ValueError as exc:
                message = str(exc)
                field = next(
                    (f for prefix, f in _LIMIT_ERROR_FIELDS if message.startswith(prefix)),
                    NON_FIELD_ERRORS,
                )
                add(field, message[0].upper() + message[1:] + ".")
            else:
                self._check_queue(spec, limit, add)

    def _check_waits(self, spec: Any, add: Any) -> bool:
        """max_wait and warm-up on an algorithm that takes them, and a wait no longer
        than MAX_DELAY; False when one is wrong (the rest is then not worth checking)."""
        if self.max_wait is None or self.max_wait < 0:
            return False  # the field's own validator says so
        ok = True
        for field, label, value, allowed, names in (
            ("max_wait", "max wait", self.max_wait, spec.reserves, WAITING_ALGORITHMS),
            ("warmup", "warm-up", self.warmup, spec.warms, WARMUP_ALGORITHMS),
        ):
            if value and not allowed:
                choices = [REGISTRY[name].label for name in names]
                add(field, f"{spec.label.capitalize()} cannot take a {label}; set it to 0 "
                    f"or choose {', '.join(choices[:-1])} or {choices[-1]}.")
                ok = False
        max_delay = setting_or_default("MAX_DELAY")
        if self.max_wait > max_delay:
            add("max_wait", f"A request is never held longer than RATELIMITS['MAX_DELAY'] "
                f"({max_delay:g} s); set the max wait to at most {max_delay:g} or raise "
                "MAX_DELAY.")
            ok = False
        return ok

    @staticmethod
    def _check_queue(spec: Any, limit: Limit, add: Any) -> None:
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

    # -- engine view ----------------------------------------------------------------------

    def as_limit(self, key: str) -> Limit:
        """The engine's `Limit` for one client identity under this policy."""
        return Limit(
            key=key,
            algorithm=self.algorithm,
            limit=self.limit,
            period=float(self.period),
            burst=self.burst,
            cost=self.cost,
            shadow=self.mode == Mode.SHADOW,
            name=self.name,
            batch=self.batch if self.counting == Counting.SHARED else None,
            max_wait=float(self.max_wait or 0),
            warmup=float(self.warmup or 0),
            floor=self.floor,
            lockout=float(self.lockout or 0),
            stage=RESERVE if (self.charge_on or "").strip() else CHARGE,
            calendar=self.calendar or "",
            zone=time_zone(),
        )

    @property
    def method_list(self) -> list[str]:
        return split_methods(self.methods)

    def human_rate(self) -> str:
        """The rate as an operator reads it: "100 per minute, burst 20"."""
        if self.limit is None:
            return ""
        spec = REGISTRY.get(self.algorithm)
        if spec is not None and spec.learned:
            text = f"{self.floor or 1} to {self.limit} at a time, learnt"
        elif spec is not None and spec.holds_slots:
            text = f"{self.limit} at a time"
        elif self.calendar:
            text = f"{self.limit} per calendar {self.calendar}"
        else:
            text = f"{self.limit} per {human_period(self.period or 1)}"
        if self.burst is not None:
            text += f", {spec.burst_word if spec else 'burst'} {self.burst}"
        if self.cost and self.cost != 1:
            text += f", cost {self.cost}"
        if self.max_wait:
            text += f", waits up to {self.max_wait:g} s"
        if self.warmup:
            text += f", warm-up {self.warmup} s"
        if self.charge_on:
            text += f", charged on {self.charge_on}"
        if self.lockout:
            text += f", lockout {human_period(self.lockout)}"
        return text

    human_rate.short_description = "rate"  # type: ignore[attr-defined]


class PolicyDashboard(Policy):
    """No table of its own: the admin index entry that opens the policies' dashboard."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class Override(models.Model):
    """A client, network, group or tier that gets another limit under one policy, or is
    exempt from it (see `ratelimits.matching.overrides` for the precedence)."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="overrides")
    match = models.CharField(
        max_length=255,
        help_text="In the policy's key terms: user:42, ip:203.0.113.7, ip:203.0.113.0/24, "
        "ip:2001:db8::/48, header:<value>, group:<Django group> (user keys), tier:<name>.",
    )
    exempt = models.BooleanField(
        default=False, help_text="The policy does not apply to these clients at all."
    )
    limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Instead of the policy's limit (same period)."
    )
    burst = models.PositiveIntegerField(
        null=True, blank=True, help_text="Instead of the policy's burst (bucket algorithms)."
    )
    expires = models.DateTimeField(
        null=True, blank=True, help_text="Stops applying then, without an edit; empty: never."
    )
    note = models.CharField(max_length=255, blank=True, help_text="Who asked, and why.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["policy__name", "match"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "match"], name="ratelimits_override_once")
        ]

    def __str__(self) -> str:
        return f"{self.policy.name if self.policy_id else '?'}: {self.match}"

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}

        def add(field: str, message: str) -> None:
            errors.setdefault(field, []).append(message)

        self.match = (self.match or "").strip()
        try:
            policy: Policy | None = self.policy  # saved, or one an import is creating
        except Policy.DoesNotExist:
            policy = None
        if policy is not None:
            try:
                parse_match(policy.key, self.match, setting_or_default("IPV6_PREFIX"))
            except ValueError as exc:
                add("match", str(exc)[0].upper() + str(exc)[1:] + ".")
        if policy is not None and policy.algorithm in LEARNED_ALGORITHMS:
            add("match", "An adaptive policy learns one limit per process from all the "
                "requests it matches, so it has no clients to override; delete this "
                "override, or give these clients a policy of their own.")
        elif self.exempt and (self.limit is not None or self.burst is not None):
            add("exempt", "An exempt client has no limit: clear limit and burst, or "
                "untick exempt.")
        elif not self.exempt and self.limit is None:
            add("limit", "Give the limit these clients get, or tick exempt.")
        elif policy is not None and not self.exempt and self.limit is not None:
            self._check_limit(policy, add)
        if errors:
            raise ValidationError(errors)

    def validate_unique(self, exclude: Any = None) -> None:
        """One override per set of clients: `ip:10.1.2.3/8` is `ip:10.0.0.0/8`, and
        `ip:2001:db8::1` and `ip:2001:db8::2` are one /64 client. Two such rows would
        leave the policy to choose between them (the more generous would apply)."""
        super().validate_unique(exclude)
        # a row saved with this match was checked then: a page of many overrides saves
        # without comparing each one with all the others
        unchanged = self.pk is not None and self.match == getattr(self, "_loaded_match", None)
        same = None if unchanged or "match" in (exclude or ()) else self.same_clients()
        if same is not None:
            raise ValidationError({"match": [
                f"This policy already has an override for the same clients, "
                f"{same!r}: change that one, or delete it first."]})

    #: The match the row was read from the database with (None: not read).
    _loaded_match: str | None = None

    @classmethod
    def from_db(cls, *args: Any, **kwargs: Any) -> Self:  # Django 6.1 adds a keyword
        row = super().from_db(*args, **kwargs)
        row._loaded_match = row.match  # see validate_unique
        return row

    def same_clients(self) -> str | None:
        """The match of another override of this policy for the same clients, or None."""
        try:
            policy = self.policy
        except Policy.DoesNotExist:
            return None
        prefix = setting_or_default("IPV6_PREFIX")
        try:
            mine = parse_match(policy.key, self.match, prefix)
        except ValueError:
            return None  # clean() says what is wrong with it
        # the same text is the unique constraint's to refuse (its message is the admin's)
        others = Override.objects.filter(policy=policy).exclude(pk=self.pk).exclude(
            match=self.match)
        kind = (self.match or "").partition(":")[0]
        for match in others.filter(match__startswith=kind).values_list("match", flat=True):
            try:
                if parse_match(policy.key, match, prefix) == mine:
                    return match
            except ValueError:
                continue  # a row the policy's key no longer takes
        return None

    def _check_limit(self, policy: Policy, add: Any) -> None:
        """The policy's rules, on the policy with this override's limit and burst."""
        if self.limit == 0:
            add("limit", "0 is not a limit: leave it empty for the policy's limit, or tick "
                "exempt to let this client through untouched.")
            return
        spec = REGISTRY.get(policy.algorithm)
        if self.burst is not None and spec is not None and not spec.has_burst:
            add("burst", f"{spec.label.capitalize()} has no burst; clear it.")
            return
        try:
            self.as_limit(policy, "")
        except ValueError as exc:
            field = "burst" if str(exc).startswith("burst") else "limit"
            add(field, str(exc)[0].upper() + str(exc)[1:] + ".")

    def as_limit(self, policy: Policy, key: str) -> Limit:
        """The engine limit this override gives one client of `policy`."""
        base = policy.as_limit(key)
        burst = self.burst if self.burst is not None else policy.burst
        return dataclasses.replace(
            base, limit=self.limit or base.limit, burst=burst,
            batch=None if base.batch is None else min(base.batch, self.limit or base.limit))
