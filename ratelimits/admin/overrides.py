"""The overrides in the admin: edited inline on their policy's page (the first few, the
others checked against the policy as edited), and listed across policies in their own
list, with a warning when one exempts a whole address family."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.utils import timezone

from ratelimits.admin.store import StoreBanner
from ratelimits.engine.registry import BURST_ALGORITHMS, LEARNED_ALGORITHMS, REGISTRY
from ratelimits.matching.overrides import parse_match
from ratelimits.models import Override, Policy

#: The overrides a policy's page shows (by match); all of them are in their own list.
INLINE_OVERRIDES = 20


#: The overrides inline's widgets: short inputs, and the browser's own date-and-time
#: picker in one input instead of the admin's two (date, time) with their shortcuts.
_INLINE_WIDGETS: dict[str, Callable[[], forms.Widget]] = {
    "match": lambda: forms.TextInput(attrs={"size": 22, "placeholder": "ip:203.0.113.7"}),
    "note": lambda: forms.TextInput(attrs={"size": 22}),
    "limit": lambda: forms.NumberInput(attrs={"min": 1, "style": "width: 6em"}),
    "burst": lambda: forms.NumberInput(attrs={"min": 1, "style": "width: 6em"}),
    "expires": lambda: forms.DateTimeInput(attrs={"type": "datetime-local"},
                                           format="%Y-%m-%dT%H:%M"),
}


class OverrideFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """A policy's overrides on its page: the first `INLINE_OVERRIDES` by match (a page of
    every one would be megabytes, and past Django's 1,000 posted fields it cannot be
    saved). The others stay where they are, checked against the policy as edited."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = self.instance
        # the policy's overrides (none for a new one), each row naming it without a query
        mine = (Override.objects.none() if policy.pk is None
                else Override.objects.filter(policy=policy)).select_related("policy")
        #: How many overrides the policy has, shown or not.
        self.total = mine.count()
        if self.is_bound:  # the ones the page showed, whatever was added since
            self.queryset = mine.filter(pk__in=self._posted_ids())
        else:
            # ordered totally (pk last), or the formset reorders the slice, which Django 6
            # refuses
            self.queryset = mine.order_by("match", "pk")[:INLINE_OVERRIDES]

    @property
    def hidden(self) -> int:
        """How many of the policy's overrides the page does not show."""
        return self.total - self.initial_form_count()

    def _posted_ids(self) -> list[int]:
        field = re.compile(rf"{re.escape(str(self.prefix))}-\d+-id")  # each row's override id
        return [int(value) for key, value in self.data.items()
                if field.fullmatch(key) and isinstance(value, str) and value.isdigit()]

    def clean(self) -> None:
        super().clean()
        algorithm = self.instance.algorithm  # the policy as its form just set it
        kept = [f for f in self.forms if f.cleaned_data and not f.cleaned_data.get("DELETE")]
        self._refuse_hidden_matches(kept)
        unfit = self._unfit_hidden()
        if algorithm in LEARNED_ALGORITHMS and (kept or unfit):
            more = (f" ({len(unfit)} not shown here: delete them in the overrides list)"
                    if unfit else "")
            raise ValidationError(
                f"{REGISTRY[algorithm].label.capitalize()} learns one limit per process from "
                f"all the requests the policy matches, so it takes no overrides: delete them "
                f"(tick Delete?){more}, or choose another algorithm.")
        if unfit:
            shown = "; ".join(f"{match!r}: {message}" for match, message in unfit[:3])
            rest = f"; and {len(unfit) - 3} more" if len(unfit) > 3 else ""
            raise ValidationError(
                f"Overrides not shown here do not fit the policy as changed: {shown}{rest}. "
                "Change or delete them in the overrides list, or undo the change.")

    def _hidden(self) -> Any:
        """The policy's overrides the page does not show."""
        shown = [f.instance.pk for f in self.initial_forms]
        return Override.objects.filter(policy=self.instance).exclude(pk__in=shown)

    def _refuse_hidden_matches(self, kept: list[Any]) -> None:
        """A row whose match another override has, one the page does not show (the
        formset compares the rows shown only; the database would refuse with a 500)."""
        if self.instance.pk is None or not self.hidden or not kept:
            return
        rows = {f.instance.match: f for f in kept}
        for match in self._hidden().filter(match__in=rows).values_list("match", flat=True):
            rows[match].add_error("match", f"This policy already has an override for "
                                  f"{match!r}, not shown here: change that one in the "
                                  "overrides list.")

    def _unfit_hidden(self) -> list[tuple[str, str]]:
        """The overrides the page does not show that the policy as edited refuses (they
        fit the stored policy: they need a look only when it changes)."""
        policy = self.instance
        if policy.pk is None or not self.hidden:
            return []
        stored = Policy.objects.filter(pk=policy.pk).first()
        if stored is None or all(getattr(stored, f.attname) == getattr(policy, f.attname)
                                 for f in Policy._meta.concrete_fields):
            return []
        unfit = []
        for override in self._hidden().order_by("match").iterator():
            override.policy = policy
            try:
                override.full_clean(exclude=["policy"], validate_unique=False,
                                    validate_constraints=False)
            except ValidationError as exc:
                unfit.append((override.match, " ".join(exc.messages)))
        return unfit


class OverrideInline(admin.TabularInline):  # type: ignore[type-arg]
    """A policy's overrides, edited on its page: narrow enough for a laptop's admin, with
    the navigation open (no burst column where the algorithm has none), and a link to
    all of them in the overrides' own list."""

    model = Override
    formset = OverrideFormSet
    template = "admin/ratelimits/override/tabular.html"
    extra = 0
    fields = ("match", "exempt", "limit", "burst", "expires", "note")

    def get_fields(self, request: Any, obj: Any = None) -> Any:
        if obj is not None and obj.algorithm not in BURST_ALGORITHMS:
            return tuple(f for f in self.fields if f != "burst")
        return self.fields

    def formfield_for_dbfield(self, db_field: Any, request: Any, **kwargs: Any) -> Any:
        if db_field.name in _INLINE_WIDGETS:
            kwargs["widget"] = _INLINE_WIDGETS[db_field.name]()
        if db_field.name == "expires":  # one input, not the admin's split date and time
            kwargs["form_class"] = forms.DateTimeField
        return super().formfield_for_dbfield(db_field, request, **kwargs)


def exempts_everyone(override: Override) -> int | None:
    """The IP version (4 or 6) of whose every client an exempt override of a /0 network
    takes out of its policy, or None: such a row switches the policy off for a whole
    address family, yet reads like a small exception in the list."""
    if not override.exempt or "/" not in override.match:
        return None
    try:
        match = parse_match(override.policy.key, override.match)
    except ValueError:
        return None
    if match.kind != "network" or match.value.prefixlen:
        return None
    return int(match.value.version)


def warn_exempt_everyone(model_admin: Any, request: Any, override: Override) -> None:
    """Warn, on the page that saved it, about an override that `exempts_everyone`."""
    version = exempts_everyone(override)
    if version is not None:
        model_admin.message_user(request, (
            f"The override {override.match!r} exempts every IPv{version} client from the "
            f"policy {override.policy.name!r}: it no longer limits anyone who reaches it "
            f"over IPv{version}. To stop limiting, switch the policy off or to shadow; to "
            "exempt some clients, name their network (e.g. ip:10.0.0.0/8)."),
            messages.WARNING)


class _Expiry(admin.SimpleListFilter):
    title = "expiry"
    parameter_name = "expiry"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "in force"), ("expired", "expired"), ("never", "never expires")]

    def queryset(self, request: Any, queryset: Any) -> Any:
        now = timezone.now()
        if self.value() == "live":
            return queryset.exclude(expires__lte=now)
        if self.value() == "expired":
            return queryset.filter(expires__lte=now)
        if self.value() == "never":
            return queryset.filter(expires__isnull=True)
        return queryset


@admin.register(Override)
class OverrideAdmin(StoreBanner, admin.ModelAdmin):  # type: ignore[type-arg]
    """Every override, across policies: who gets what, until when, and why."""

    list_display = ("match", "policy", "gives", "expiry", "note")
    list_filter = ("policy", "exempt", _Expiry)
    search_fields = ("match", "note", "policy__name")
    list_select_related = ("policy",)
    fields = ("policy", "match", "exempt", "limit", "burst", "expires", "note")

    def save_model(self, request: Any, obj: Override, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        warn_exempt_everyone(self, request, obj)

    @admin.display(description="gives")
    def gives(self, obj: Override) -> str:
        """"exempt", or the rate this client gets: "500 per minute, burst 50"."""
        if obj.exempt:
            return "exempt"
        shown = Policy(algorithm=obj.policy.algorithm, limit=obj.limit or 0,
                       period=obj.policy.period,
                       burst=obj.burst if obj.burst is not None else obj.policy.burst)
        return shown.human_rate()

    @admin.display(description="expires", ordering="expires")
    def expiry(self, obj: Override) -> str:
        if obj.expires is None:
            return "never"
        when = timezone.localtime(obj.expires).strftime("%Y-%m-%d %H:%M")
        return f"{when} (expired)" if obj.expires <= timezone.now() else when
