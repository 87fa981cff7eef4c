"""Settings and URLs of a DRF site with `PolicyThrottle` and no `RateLimitMiddleware`: the
multi-process tests' site (tests/support/workers_settings.py) otherwise. Nothing of ours
sees such a response end, so a slot the throttle holds is freed when Django says the
response is finished."""

import os

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from tests.support.workers_settings import *  # noqa: F403
from tests.support.workers_settings import MIDDLEWARE, pid

MIDDLEWARE = [m for m in MIDDLEWARE if m != "ratelimits.middleware.RateLimitMiddleware"]
ROOT_URLCONF = "tests.servers.drf_only_site"


class Items(APIView):
    throttle_scope = "items"

    def get(self, request):
        return Response(os.getpid())  # the answering worker, as `pid` says it


urlpatterns = [path("api/items/", Items.as_view()), path("free/", pid)]
