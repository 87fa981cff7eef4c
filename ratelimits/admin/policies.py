"""The Policy admin: list, filters, search, the mode switches, and what each policy did.

The list shows every policy's last hour; a policy's page charts its last hour and day,
lists its top offenders and can reset one client; the dashboard shows every policy's
sparkline. What each page shows is built in `ratelimits.ops.dashboard`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape, format_html

from ratelimits.admin.overrides import OverrideInline, warn_exempt_everyone
from ratelimits.admin.store import publication_reported
from ratelimits.engine.registry import LEARNED_ALGORITHMS
from ratelimits.models import Mode, Policy, PolicyDashboard
from ratelimits.ops import dashboard, observe, routes
from ratelimits.ops.reset import reset_client
from ratelimits.pipeline.declared import CODE_FIELDS
from ratelimits.policy_checks import (
    LOCKOUT_HINT,
    admin_index,
    aimed_lockout_message,
    aims_lockout,
    lockout_message,
    locks_out_admin,
)
from ratelimits.receivers import schedule_policies_changed

#: Fields whose form must refuse 0 itself (the model's own check would then repeat it).
_AT_LEAST_ONE = frozenset({"limit", "period", "cost", "burst", "batch", "rollout"})
#: The percentages "Raise the rollout" steps through.
ROLLOUT_STEPS = (1, 5, 25, 50, 100)


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
                warn_exempt_everyone(self, request, override)

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
        reads = dashboard.Reads()
        totals = reads("the last hour", observe.last_hour, names) if names else {}
        # the template's banner (`cl.rl_notice`)
        changelist.rl_notice = (  # type: ignore[attr-defined]
            reads.notice() if names else dashboard.probe_store())
        totals = totals or {}
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
        with publication_reported(self, request):
            return super().change_view(request, object_id, form_url, extra)

    def add_view(self, request: Any, form_url: str = "", extra_context: Any = None) -> Any:
        extra = dict(extra_context or {})
        extra["store_notice"] = dashboard.probe_store()
        with publication_reported(self, request):
            return super().add_view(request, form_url, extra)

    def delete_view(self, request: Any, object_id: str, extra_context: Any = None) -> Any:
        with publication_reported(self, request):
            return super().delete_view(request, object_id, extra_context)

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
        policies = list(Policy.objects.all())
        reads = dashboard.Reads()
        rows = dashboard.dashboard_rows(policies, _change_url, reads)
        return TemplateResponse(
            request,
            "admin/ratelimits/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Rate-limit dashboard",
                "opts": self.model._meta,
                "rows": rows,
                "store_notice": reads.notice() if policies else dashboard.probe_store(),
            },
        )

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        extra = dict(extra_context or {})
        extra["dashboard_url"] = reverse("admin:ratelimits_policy_dashboard")
        with publication_reported(self, request):  # a bulk delete; the actions say their own
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
        names = ", ".join(p.name for p in changed)
        with publication_reported(self, request, f"Switched to {mode}: {names}.",
                                  f"Mode {mode} saved for {names}"):
            Policy.objects.filter(pk__in=[p.pk for p in changed]).update(
                mode=mode, updated=timezone.now()
            )
            schedule_policies_changed()
        for policy in changed:
            self.log_change(request, policy, f"Changed mode from {policy.mode} to {mode}.")
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
        shown = ", ".join(f"{p.name} ({next_rollout(p.rollout)}%)" for p in changed)
        with publication_reported(self, request, f"Rollout raised: {shown}.",
                                  f"Rollout saved: {shown}"):
            for policy in changed:
                old, policy.rollout = policy.rollout, next_rollout(policy.rollout)
                Policy.objects.filter(pk=policy.pk).update(rollout=policy.rollout,
                                                           updated=timezone.now())
                self.log_change(request, policy,
                                f"Changed rollout from {old}% to {policy.rollout}%.")
            schedule_policies_changed()  # update() sends no post_save: published once

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
