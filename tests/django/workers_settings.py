"""Settings of the gunicorn workers that the multi-process tests start (tests/django/workers.py).

The test suite's settings, with a file SQLite database the workers and the test share,
the engine on the test's private redis-server, and views that say which worker answered.
"""

import os

from django.http import HttpResponse
from django.urls import path

from tests.settings import *  # noqa: F403
from tests.settings import RATELIMITS

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["WORKERS_DB"]}}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                      "LOCATION": os.environ["WORKERS_REDIS_URL"]}}
RATELIMITS = {**RATELIMITS, "REJECT_VIEW": "tests.django.workers_settings.rejected"}
ROOT_URLCONF = "tests.django.workers_settings"
LOGGING = {"version": 1, "disable_existing_loggers": False}


def pid(request):
    return HttpResponse(str(os.getpid()))


def rejected(request, rejection):
    return HttpResponse(str(os.getpid()), status=rejection.status)


urlpatterns = [path("hello/", pid), path("free/", pid)]
