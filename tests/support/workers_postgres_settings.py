"""Settings of a site whose only store is PostgreSQL (tests/engine/test_postgres_workers.py):
its Django database and its limits on the server of `WORKERS_POSTGRES_URL`, no Redis URL
and no Redis cache anywhere."""

import os
import urllib.parse

from django.http import HttpResponse
from django.urls import path

from tests.settings import *  # noqa: F403
from tests.settings import RATELIMITS

_url = urllib.parse.urlsplit(os.environ["WORKERS_POSTGRES_URL"])
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql",
                         "NAME": _url.path.lstrip("/"), "HOST": _url.hostname,
                         "PORT": _url.port or 5432, "USER": _url.username}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# The limits in the site's own database, through the engine's own connections. The
# statement timeout is generous: 300 racing requests on a loaded two-core machine wait
# their turn for one client's lock, and a timeout would decide them by on_error instead.
RATELIMITS = {**RATELIMITS, "DATABASE": "default", "SOCKET_TIMEOUT": 10.0,
              "CONNECT_TIMEOUT": 5.0}
ROOT_URLCONF = "tests.support.workers_postgres_settings"
LOGGING = {"version": 1, "disable_existing_loggers": False}


def pid(request):
    return HttpResponse(str(os.getpid()))


def rejected(request, rejection):
    return HttpResponse(str(os.getpid()), status=rejection.status)


RATELIMITS["REJECT_VIEW"] = "tests.support.workers_postgres_settings.rejected"

urlpatterns = [path("hello/", pid), path("free/", pid)]
