"""DRF views as a site writes them: one on the default throttles, one scoped, one scoped
through its route's arguments, and a function view with throttles of its own."""

import os

from django.http import HttpResponse
from django.urls import path
from rest_framework.decorators import api_view, throttle_classes
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.compat.drf import ScopedRateThrottle, UserRateThrottle


class Ping(APIView):
    """DEFAULT_THROTTLE_CLASSES: anon 5/min and user 8/min."""

    def get(self, request):
        return Response("pong")


class Upload(APIView):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "uploads"

    def post(self, request):
        return Response({"stored": True})


class Report(APIView):
    """Scoped by its route (`as_view(throttle_scope=...)`)."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope: str | None = None

    def get(self, request):
        return Response("report")


@api_view(["GET"])
@throttle_classes([UserRateThrottle])
def whoami(request):
    return Response("anonymous")


def pid(request):
    """The answering worker's pid (no throttle, no limit)."""
    return HttpResponse(str(os.getpid()))


urlpatterns = [
    path("pid/", pid),
    path("api/ping/", Ping.as_view()),
    path("api/upload/", Upload.as_view()),
    path("api/report/", Report.as_view(throttle_scope="reports")),
    path("api/whoami/", whoami),
]
