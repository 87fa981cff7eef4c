"""Where a site's clients log in: Django's own `LoginView` (a failure answers 200, a
success 302), DRF's `obtain_auth_token` (400, 200), and an API view throttled by
`ratelimits.compat.drf.AnonRateThrottle`."""

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.compat.drf import AnonRateThrottle


class Ping(APIView):
    throttle_classes = [AnonRateThrottle]

    def get(self, request):
        return Response("pong")


urlpatterns = [
    path("admin/", admin.site.urls),  # the login template links to it
    path("accounts/login/", LoginView.as_view(template_name="admin/login.html")),
    path("api/token/", obtain_auth_token),
    path("api/ping/", Ping.as_view()),
]
