"""App configuration: registers the system checks and the policy change receivers."""

from __future__ import annotations

from django.apps import AppConfig

from ratelimits import checks  # noqa: F401  (registers the system checks)


class RateLimitsConfig(AppConfig):
    """The ratelimits app: its checks on import, its signal receivers when ready."""

    name = "ratelimits"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The receivers import the models, which Django loads after this module.
        from ratelimits import receivers  # noqa: F401  (connects the signal receivers)
