"""App configuration: registers the system checks and the policy change receivers."""

from django.apps import AppConfig


class RateLimitsConfig(AppConfig):
    name = "ratelimits"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ratelimits import checks, receivers  # noqa: F401  (registration side effects)
