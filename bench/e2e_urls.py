"""The URLs of the end-to-end benchmarks: the demo's; /async-hello/, an async twin of
/hello/ for the ASGI section (bench/asgi.py); and /dr-hello/, /hello/ under
django-ratelimit's `@ratelimit`, from django-ratelimit itself or, in the `drcompat`
scenario (bench/e2e_settings.py), from `ratelimits.compat.django_ratelimit`."""

import os
from importlib import import_module

from django.http import HttpResponse
from django.urls import include, path

DECORATORS = ("ratelimits.compat.django_ratelimit.decorators"
              if os.environ.get("BENCH_E2E_SCENARIO") == "drcompat"
              else "django_ratelimit.decorators")
#: far above what the run sends: every request admitted, and counted
DR_RATE = "1000000/m"


async def async_hello(request):
    return HttpResponse("Hello!\n", content_type="text/plain")


@import_module(DECORATORS).ratelimit(key="ip", rate=DR_RATE, block=True)
def dr_hello(request):
    return HttpResponse("Hello!\n", content_type="text/plain")


urlpatterns = [path("async-hello/", async_hello), path("dr-hello/", dr_hello),
               path("", include("demo_project.urls"))]
