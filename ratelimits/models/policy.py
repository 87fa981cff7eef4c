"""The policy row: one rate limit, its columns, and the engine `Limit` it becomes."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from ratelimits.conf import time_zone
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import CHARGE, RESERVE, Limit
from ratelimits.models.fields import AlgorithmField, Counting, KeyField, Mode, OnError
from ratelimits.models.validation import NAME_RULE, name_error, policy_errors, split_methods

_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def human_period(seconds: int) -> str:
    """`60` -> "minute", `600` -> "10 minutes", `90` -> "90 seconds"."""
    for size, unit in _UNITS:
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds} seconds"  # pragma: no cover - every integer is a multiple of 1


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
        """The rules between the fields (`validation.policy_errors`), each message on
        the field to change."""
        errors = policy_errors(self)
        if errors:
            raise ValidationError(errors)

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
