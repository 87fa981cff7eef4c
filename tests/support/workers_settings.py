"""Settings of the gunicorn workers that the multi-process tests start (tests/support/workers.py).

The test suite's settings, with a file SQLite database the workers and the test share,
the engine on the test's private redis-server, and views that say which worker answered.
"""

import json
import os
import threading

from django.http import HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from tests.settings import *  # noqa: F403
from tests.settings import RATELIMITS

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["WORKERS_DB"]}}
# Each worker imports these settings after gunicorn forks it: its connections carry its
# pid as their name, so a test can tell which worker sent what (`Monitor.names`).
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                      "LOCATION": os.environ["WORKERS_REDIS_URL"],
                      "OPTIONS": {"CONNECTION_POOL_KWARGS": {
                          "client_name": f"worker-{os.getpid()}"}}}}
# A test sets more in WORKERS_RATELIMITS (JSON), e.g. its breaker's cool-down.
RATELIMITS = {**RATELIMITS, "REJECT_VIEW": "tests.support.workers_settings.rejected",
              **json.loads(os.environ.get("WORKERS_RATELIMITS", "{}"))}
ROOT_URLCONF = "tests.support.workers_settings"
LOGGING = {"version": 1, "disable_existing_loggers": False}


def pid(request):
    return HttpResponse(str(os.getpid()))


def rejected(request, rejection):
    return HttpResponse(str(os.getpid()), status=rejection.status)


# Under uvicorn (tests/test_asgi.py): the threads the asyncio engine decided on,
# and the event loop's own, so the test can see that no decision left the loop.
decided_on: list[int] = []


def _watch_the_asyncio_engine() -> None:
    from ratelimits.engine.aio import AsyncRedisEngine

    evaluate = AsyncRedisEngine.evaluate

    async def watched(self, limits, now=None):
        decided_on.append(threading.get_ident())
        return await evaluate(self, limits, now)

    AsyncRedisEngine.evaluate = watched


_watch_the_asyncio_engine()


async def threads(request):
    return JsonResponse({"loop": threading.get_ident(), "decided_on": decided_on})


def otp(request):
    """A one-time code checked in 30 ms: 204 when right, 404 when wrong; each check
    counted in the store (`otp-checks`), so a test sees how many ran, in any worker."""
    import time

    from django_redis import get_redis_connection

    time.sleep(0.03)
    get_redis_connection().incr("otp-checks")
    return HttpResponse(status=204 if request.GET.get("code") == "246810" else 404)


def _count_password_checks(sender, **kwargs):
    from django_redis import get_redis_connection

    get_redis_connection().incr("password-checks")


class _FormPage(TemplateResponse):
    """The login page, without a template (this site has none)."""

    @property
    def rendered_content(self) -> str:
        return "the login form"


@csrf_exempt
def login(request):
    """Django's LoginView (a failed login is a 200), each password check counted in the
    store (`password-checks`), posted to without a CSRF token (a script's guesses).
    Imported at the first request: these settings are read before the apps are ready."""
    from django.contrib.auth.signals import user_login_failed
    from django.contrib.auth.views import LoginView

    user_login_failed.connect(_count_password_checks, dispatch_uid="password-checks")
    request._dont_enforce_csrf_checks = True
    return LoginView.as_view(response_class=_FormPage)(request)


from bench.closed_loop import abusy, busy  # noqa: E402

urlpatterns = [path("hello/", pid), path("free/", pid), path("async/", threads),
               path("threads/", threads), path("busy/", busy), path("abusy/", abusy),
               path("otp/", otp), path("accounts/login/", login)]
