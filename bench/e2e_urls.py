"""The URLs of the end-to-end benchmarks: the demo's, and /async-hello/, an async twin of
/hello/ for the ASGI section (bench/asgi.py)."""

from django.http import HttpResponse
from django.urls import include, path


async def async_hello(request):
    return HttpResponse("Hello!\n", content_type="text/plain")


urlpatterns = [path("async-hello/", async_hello), path("", include("demo_project.urls"))]
