"""The Policy admin: list, filters, search, the mode switches, and what each policy did.

The list shows every policy's last hour; a policy's page charts its last hour and day,
lists its top offenders and can reset one client; the dashboard shows every policy's
sparkline. What each page shows is built in `ratelimits.ops.dashboard`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.forms.models import BaseInlineFormSet
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape, format_html

from ratelimits.checks import (
    LOCKOUT_HINT,
    admin_index,
    aimed_lockout_message,
    aims_lockout,
    lockout_message,
    locks_out_admin,
)
from ratelimits.engine.registry import BURST_ALGORITHMS, LEARNED_ALGORITHMS, REGISTRY
from ratelimits.matching.overrides import parse_match
from ratelimits.models import Mode, Override, Policy, PolicyDashboard
from ratelimits.ops import dashboard, observe, routes
from ratelimits.ops.reset import reset_client
from ratelimits.pipeline.declared import CODE_FIELDS
from ratelimits.receivers import schedule_policies_changed

#: Fields whose form must refuse 0 itself (the model's own check would then repeat it).
_AT_LEAST_ONE = frozenset({"limit", "period", "cost", "burst", "batch", "rollout"})
#: The percentages "Raise the rollout" steps through.
ROLLOUT_STEPS = (1, 5, 25, 50, 100)
#: The overrides a policy's page shows (by match); all of them are in their own list.
INLINE_OVERRIDES = 20


def next_rollout(current: int) -> int:
    """The next step above `current` (100 stays 100)."""
    return next((step for step in ROLLOUT_STEPS if step > current), 100)


def _shown(value: Any) -> str:
    text = "(empty)" if value in (None, "") else str(value)
    return repr(text[:60]) if isinstance(value, str) and value else text


if TYPE_CHECKING:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin[Policy]
else:
    _ModelAdmin = admin.ModelAdmin


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


@admin.register(Policy)
class PolicyAdmin(_ModelAdmin):
    # five columns: readable beside the admin's navigation and filters on a laptop
    list_display = ("name", "enforced", "rate", "matches", "last_hour")
    list_filter = ("mode", "algorithm", "on_error")
    search_fields = ("name", "description", "key", "path", "scope")
    ordering = ("-priority", "name")
    readonly_fields = ("created", "updated")
    actions = ("switch_to_shadow", "switch_to_enforce", "raise_rollout", "turn_off")
    inlines = (OverrideInline,)
    fieldsets = (
        (None, {"fields": ("name", "description", "mode", "rollout", "priority")}),
        ("Rate", {"fields": ("algorithm", "limit", "floor", "period", "calendar", "burst",
                             "cost", "cost_function", "max_wait", "warmup")}),
        ("What is charged", {"fields": ("charge_on", "reset_on", "lockout")}),
        ("Counting", {"fields": ("counting", "batch")}),
        ("Which requests", {"fields": ("key", "path", "methods", "scope")}),
        ("When the store is unreachable", {"fields": ("on_error",)}),
        ("History", {"fields": ("created", "updated"), "classes": ("collapse",)}),
    )

    def get_inlines(self, request: Any, obj: Policy | None) -> Any:
        # an adaptive policy takes no overrides: no inline, unless some are left from
        # before its algorithm changed (shown, to be deleted: see OverrideFormSet)
        if obj is not None and obj.algorithm in LEARNED_ALGORITHMS and not obj.overrides.exists():
            return ()
        return self.inlines

    def get_fieldsets(self, request: Any, obj: Policy | None = None) -> Any:
        if obj is None or not obj.declared:
            return self.fieldsets
        found = _declared_routes(request).get(obj.scope)
        where = ""
        if found:
            paths, _, dotted = routes.describe(found)
            # a fieldset's description is shown as HTML: a route may hold "<int:pk>"
            where = escape(f" It is declared on {dotted}, at {paths}.")
        note = ("Declared in code", {"fields": (), "description": (
            f"Declared in code with @ratelimit: the code sets its rate, key, methods and "
            f"views, so those are shown here read-only (change them in the code).{where} "
            "Mode, rollout, priority, what happens when the store is unreachable and the "
            "overrides are yours.")})
        return (note, *self.fieldsets)

    def get_readonly_fields(self, request: Any, obj: Policy | None = None) -> Any:
        if obj is None or not obj.declared:
            return self.readonly_fields
        return (*self.readonly_fields, "name", *CODE_FIELDS, "counting", "batch")

    def save_model(self, request: Any, obj: Policy, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        _warn_lockout(self, request, [obj])
        if aims_lockout(obj):
            self.message_user(request, aimed_lockout_message(obj), messages.WARNING)

    def save_formset(self, request: Any, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        for row in formset.forms:
            override = row.instance
            if override.pk is not None and not row.cleaned_data.get("DELETE"):
                _warn_exempt_everyone(self, request, override)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        # a declared row comes back at the next start: switch it off instead
        if obj is not None and obj.declared:
            return False
        return super().has_delete_permission(request, obj)

    def formfield_for_dbfield(self, db_field: Any, request: Any, **kwargs: Any) -> Any:
        # a positive integer field's form allows 0; these need 1, and say so once
        if db_field.name in _AT_LEAST_ONE:
            kwargs["min_value"] = 1
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    # -- the last hour in the list (one round trip for the whole page) -----------------

    def get_changelist_instance(self, request: Any) -> Any:
        changelist = super().get_changelist_instance(request)
        shown = list(changelist.result_list)  # evaluates the page's queryset once
        names = [p.name for p in shown]
        totals = dashboard.read_figures("the last hour", observe.last_hour, names) or {}
        # one walk of the URLconf for the page, when a declared policy is on it
        found = _declared_routes(request) if any(p.declared for p in shown) else {}
        for policy in shown:
            policy._hour = totals.get(policy.name)
            policy._routes = found.get(policy.scope, [])
        return changelist

    @admin.display(description="last hour")
    def last_hour(self, obj: Policy) -> str:
        """Admitted, then rejected or would-be rejected and the refused share: two short
        lines, each figure's full form in its title."""
        return dashboard.hour_cell(obj, getattr(obj, "_hour", None))

    # -- a policy's page: charts, offenders, reset one client --------------------------

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<path:object_id>/reset-client/",
                self.admin_site.admin_view(self.reset_client_view),
                name="ratelimits_policy_reset_client",
            ),
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="ratelimits_policy_dashboard",
            ),
        ]
        return own + super().get_urls()

    def change_view(
        self, request: Any, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        extra = dict(extra_context or {})
        policy = self.get_object(request, object_id)
        if policy is not None:
            extra.update(dashboard.policy_page(policy).context())
            extra["can_reset"] = self.has_change_permission(request, policy)
        return super().change_view(request, object_id, form_url, extra)

    def reset_client_view(self, request: Any, object_id: str) -> Any:
        """Forget one client's state under this policy (POST with `identity`)."""
        # get_object() answers None for a malformed id ("abc") as for a missing one.
        policy = self.get_object(request, unquote(object_id))
        if policy is None:
            raise Http404(f"No policy with id {object_id!r}.")
        if request.method != "POST" or not self.has_change_permission(request, policy):
            raise PermissionDenied
        typed = (request.POST.get("identity") or "").strip()
        back = _change_url(policy)
        try:
            identity = reset_client(policy, typed)
        except ValueError as exc:
            self.message_user(request, f"Cannot reset {typed!r}: {exc}." if typed else
                              f"Nothing reset: {exc}.", messages.ERROR)
            return HttpResponseRedirect(back)
        self.log_change(request, policy, f"Reset client {identity!r}.")
        self.message_user(request, f"Reset {identity!r} under {policy.name}: its next "
                          "request starts from a full allowance.", messages.SUCCESS)
        return HttpResponseRedirect(back)

    def dashboard_view(self, request: Any) -> Any:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "admin/ratelimits/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Rate-limit dashboard",
                "opts": self.model._meta,
                "rows": dashboard.dashboard_rows(list(Policy.objects.all()), _change_url),
            },
        )

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        extra = dict(extra_context or {})
        extra["dashboard_url"] = reverse("admin:ratelimits_policy_dashboard")
        return super().changelist_view(request, extra)

    def construct_change_message(
        self, request: Any, form: Any, formsets: Any, add: bool = False
    ) -> Any:
        """Record what changed, old and new value, so the history answers "who set 10?"."""
        if add or not form.changed_data:
            return super().construct_change_message(request, form, formsets, add)
        parts = []
        for name in form.changed_data:
            old = form.initial.get(name)
            new = form.cleaned_data.get(name)
            label = form.fields[name].label or name
            parts.append(f"{label} from {_shown(old)} to {_shown(new)}")
        return "Changed " + "; ".join(parts) + "."

    @admin.display(description="mode", ordering="mode")
    def enforced(self, obj: Policy) -> str:
        """The mode, and for an enforced policy rolled out to some clients their share."""
        mode = obj.get_mode_display()
        if obj.rollout < 100 and obj.mode != Mode.OFF:
            return f"{mode}, {obj.rollout}% of clients"
        return mode

    @admin.display(description="rate", ordering="algorithm")
    def rate(self, obj: Policy) -> str:
        """The algorithm and the rate: "token bucket: 100 per minute, burst 20"."""
        return f"{obj.get_algorithm_display()}: {obj.human_rate()}"

    @admin.display(description="counts, on requests", ordering="key")
    def matches(self, obj: Policy) -> str:
        """Key, methods, path and DRF scope: "ip, on POST /api/login/ (scope uploads)";
        for a limit declared in code, the views it is declared on."""
        if obj.declared:
            return _declared_on(obj, getattr(obj, "_routes", None))
        text = f"{obj.key}, on {obj.methods or 'any'} {obj.path or '*'}"
        return f"{text} (scope {obj.scope})" if obj.scope else text

    def _switch(self, request: Any, queryset: Any, mode: str) -> None:
        changed = list(queryset.exclude(mode=mode))
        if not changed:
            self.message_user(request, f"Every selected policy is already {mode}.")
            return
        # update() sends no post_save, so the change is published here, once.
        Policy.objects.filter(pk__in=[p.pk for p in changed]).update(
            mode=mode, updated=timezone.now()
        )
        schedule_policies_changed()
        for policy in changed:
            self.log_change(request, policy, f"Changed mode from {policy.mode} to {mode}.")
        names = ", ".join(p.name for p in changed)
        self.message_user(request, f"Switched to {mode}: {names}.", messages.SUCCESS)
        for policy in changed:
            policy.mode = mode
        _warn_lockout(self, request, changed)

    @admin.action(description="Switch to shadow (log only)", permissions=["change"])
    def switch_to_shadow(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.SHADOW)

    @admin.action(description="Switch to enforce", permissions=["change"])
    def switch_to_enforce(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.ENFORCE)

    @admin.action(description="Raise the rollout a step (1, 5, 25, 50, 100%%)",
                  permissions=["change"])
    def raise_rollout(self, request: Any, queryset: Any) -> None:
        changed = [p for p in queryset if p.rollout < 100]
        if not changed:
            self.message_user(request, "Every selected policy is already rolled out to "
                              "every client.")
            return
        for policy in changed:
            old, policy.rollout = policy.rollout, next_rollout(policy.rollout)
            Policy.objects.filter(pk=policy.pk).update(rollout=policy.rollout,
                                                       updated=timezone.now())
            self.log_change(request, policy,
                            f"Changed rollout from {old}% to {policy.rollout}%.")
        schedule_policies_changed()  # update() sends no post_save: published once
        shown = ", ".join(f"{p.name} ({p.rollout}%)" for p in changed)
        self.message_user(request, f"Rollout raised: {shown}.", messages.SUCCESS)

    @admin.action(description="Turn off", permissions=["change"])
    def turn_off(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.OFF)


def _declared_routes(request: Any) -> dict[str, list[routes.Route]]:
    return routes.declared_routes(getattr(request, "urlconf", None))


def _declared_on(policy: Policy, found: list[routes.Route] | None) -> str:
    """"ip, on POST /login/ (view login)": a declared policy's key, methods and the
    views its @ratelimit is on (their dotted names as the title); without a URL that
    reaches one (a DRF compat throttle's, a view not routed), the declaration's name."""
    head = f"{policy.key}, on {policy.methods or 'any'}"
    if not found:
        return f'{head} views declaring "{policy.name}" in code'
    paths, names, dotted = routes.describe(found)
    word = "view" if "," not in names else "views"
    return format_html('{} {} <span title="@ratelimit on {}">({} {})</span>', head, paths,
                       dotted, word, names)


def _change_url(policy: Policy) -> str:
    return reverse("admin:ratelimits_policy_change", args=[policy.pk])


def _warn_lockout(model_admin: Any, request: Any, policies: list[Policy]) -> None:
    """Warn, as check ratelimits.W004 does, about saved policies that limit the admin's
    own pages: the operator who just enforced one may be the client it refuses next."""
    url = admin_index()
    if url is None:
        return
    for policy in policies:
        if locks_out_admin(policy, url):
            model_admin.message_user(request, f"{lockout_message(policy, url)} {LOCKOUT_HINT}",
                                     messages.WARNING)


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


def _warn_exempt_everyone(model_admin: Any, request: Any, override: Override) -> None:
    version = exempts_everyone(override)
    if version is not None:
        model_admin.message_user(request, (
            f"The override {override.match!r} exempts every IPv{version} client from the "
            f"policy {override.policy.name!r}: it no longer limits anyone who reaches it "
            f"over IPv{version}. To stop limiting, switch the policy off or to shadow; to "
            "exempt some clients, name their network (e.g. ip:10.0.0.0/8)."),
            messages.WARNING)


@admin.register(PolicyDashboard)
class PolicyDashboardAdmin(_ModelAdmin):
    """An entry on the admin index that opens the dashboard."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        user = request.user
        return bool(user.has_perm("ratelimits.view_policy") or user.has_perm(
            "ratelimits.change_policy"
        ))

    def has_module_permission(self, request: Any) -> bool:
        return self.has_view_permission(request)

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        return HttpResponseRedirect(reverse("admin:ratelimits_policy_dashboard"))


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
class OverrideAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every override, across policies: who gets what, until when, and why."""

    list_display = ("match", "policy", "gives", "expiry", "note")
    list_filter = ("policy", "exempt", _Expiry)
    search_fields = ("match", "note", "policy__name")
    list_select_related = ("policy",)
    fields = ("policy", "match", "exempt", "limit", "burst", "expires", "note")

    def save_model(self, request: Any, obj: Override, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        _warn_exempt_everyone(self, request, obj)

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
