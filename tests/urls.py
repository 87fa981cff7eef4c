"""Views the request-path tests drive: plain Django (sync, async, streaming) and DRF."""

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import include, path
from django.views import View
from rest_framework.authtoken.views import ObtainAuthToken, obtain_auth_token
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.throttling import PolicyThrottle


def hello(request):
    return HttpResponse("hello")


def boom(request):
    raise RuntimeError("the view failed")


def stream(request):
    return StreamingHttpResponse(iter([b"a", b"b", b"c"]))


async def async_hello(request):
    return HttpResponse("hello async")


class Page(View):
    """A class-based view with a GET handler: Django's View answers OPTIONS itself."""

    def get(self, request):
        return HttpResponse("page")


class Items(APIView):
    throttle_scope = "items"

    def get(self, request):
        return Response({"items": [1, 2, 3]})


class Private(APIView):
    """A scoped view DRF answers 403 for, before its throttles run, when anonymous."""

    throttle_scope = "items"
    permission_classes = [IsAuthenticated]

    def get(self, request):
        return Response({"secret": True})


class ThrottledToken(ObtainAuthToken):
    """DRF's token view sets no throttles: limited by the policies, as a site would."""

    throttle_classes = [PolicyThrottle]


class Plain(APIView):
    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("hello/", hello),
    path("login/", hello),
    path("boom/", boom),
    path("stream/", stream),
    path("async/", async_hello),
    path("page/", Page.as_view()),
    path("api/items/", Items.as_view()),
    path("api/plain/", Plain.as_view()),
    path("api/private/", Private.as_view()),
    path("ratelimits/", include("ratelimits.urls")),
    # Django's own login (a failure answers 200, a success 302) and DRF's token view
    # (400, 200): what charge_on and reset_on are tested against
    path("accounts/login/", LoginView.as_view(template_name="admin/login.html")),
    path("api/token/", obtain_auth_token),
    path("api/token-throttled/", ThrottledToken.as_view()),
]
