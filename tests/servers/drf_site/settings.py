"""The project of tests/servers/project throttled as a DRF site is once migrated by
docs/migrating/drf.md: DRF's throttle classes replaced by `ratelimits.compat.drf`'s, the
rates unchanged (see urls.py for the views)."""

from tests.servers.project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.servers.drf_site.urls"
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["ratelimits.compat.drf.AnonRateThrottle",
                                 "ratelimits.compat.drf.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "5/min", "user": "8/min", "uploads": "3/min",
                               "reports": "2/hour"},
}
