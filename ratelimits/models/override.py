"""An override: some clients of one policy get another limit, or none."""

from __future__ import annotations

import dataclasses
from typing import Any, Self

from django.core.exceptions import ValidationError
from django.db import models

from ratelimits.conf import setting_or_default
from ratelimits.engine.registry import LEARNED_ALGORITHMS, REGISTRY
from ratelimits.engine.types import Limit
from ratelimits.matching.overrides import parse_match
from ratelimits.models.policy import Policy


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
