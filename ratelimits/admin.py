"""The Policy admin: list, filters, search and the mode switches."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.utils import timezone

from ratelimits.models import Mode, Policy
from ratelimits.receivers import schedule_policies_changed


def _shown(value: Any) -> str:
    text = "(empty)" if value in (None, "") else str(value)
    return repr(text[:60]) if isinstance(value, str) and value else text


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "mode",
        "algorithm",
        "rate",
        "key",
        "path",
        "methods_display",
        "scope",
        "priority",
    )
    list_filter = ("mode", "algorithm", "on_error")
    search_fields = ("name", "description", "key", "path", "scope")
    ordering = ("-priority", "name")
    readonly_fields = ("created", "updated")
    actions = ("switch_to_shadow", "switch_to_enforce", "turn_off")
    fieldsets = (
        (None, {"fields": ("name", "description", "mode", "priority")}),
        ("Rate", {"fields": ("algorithm", "limit", "period", "burst", "cost")}),
        ("Which requests", {"fields": ("key", "path", "methods", "scope")}),
        ("When the store is unreachable", {"fields": ("on_error",)}),
        ("History", {"fields": ("created", "updated"), "classes": ("collapse",)}),
    )

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

    @admin.display(description="rate")
    def rate(self, obj: Policy) -> str:
        return obj.human_rate()

    @admin.display(description="methods", ordering="methods")
    def methods_display(self, obj: Policy) -> str:
        return obj.methods or "all"

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

    @admin.action(description="Switch to shadow (log only)", permissions=["change"])
    def switch_to_shadow(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.SHADOW)

    @admin.action(description="Switch to enforce", permissions=["change"])
    def switch_to_enforce(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.ENFORCE)

    @admin.action(description="Turn off", permissions=["change"])
    def turn_off(self, request: Any, queryset: Any) -> None:
        self._switch(request, queryset, Mode.OFF)
