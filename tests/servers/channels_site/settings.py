"""The project of tests/servers/project with Django Channels serving WebSockets beside its
views, set up as the WebSockets recipe (docs/recipes/websockets.md) says."""

import os

from tests.servers.project.settings import *  # noqa: F403
from tests.servers.project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "channels"]
ASGI_APPLICATION = "tests.servers.channels_site.asgi.application"
# A client behind the test's own proxy (the header a test sends) is counted by the
# address that proxy names, as an HTTP request is.
RATELIMITS = {"TRUSTED_PROXIES": ["127.0.0.1"], "KEY_PREFIX": "channels-rl:",
              "CONNECT_TIMEOUT": 1.0, "SOCKET_TIMEOUT": 1.0}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["WORKERS_REDIS_URL"],
    },
}
