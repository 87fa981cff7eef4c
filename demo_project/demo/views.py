"""A few views to watch ratelimits at work: plain, async, and a small DRF API."""

import asyncio
import math
import threading
import time

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits import Limited, limit, runtime
from ratelimits.decorators import ratelimit

QUOTES = [
    "Measure twice, cut once.",
    "Premature optimization is the root of all evil.",
    "Make it work, make it right, make it fast.",
]


def index(request):
    return render(request, "demo/index.html")


def hello(request):
    return HttpResponse("Hello! Reload me a few times: after 5 a minute you get a 429.\n",
                        content_type="text/plain")


def search(request):
    """Watched by policy "search-shadow" alone (3 per 10 s per IP, in shadow)."""
    query = request.GET.get("q", "")
    return JsonResponse({"query": query, "results": [f"{query} {i}" for i in range(3)]})


PRODUCTS = ["kettle", "teapot", "mug", "tea towel"]


def shop(request):
    """Watched by policy "shop-rollout" alone (10 a minute per IP, enforced for a share
    of the addresses), so its step of the tour never meets another step's policy."""
    return JsonResponse({"products": [{"id": i, "name": name}
                                      for i, name in enumerate(PRODUCTS, start=1)]})


@ratelimit(name="quote", rate="3/10s", key="ip", algorithm="sliding_log")
def quote(request):
    """A limit declared in code: the admin lists it as policy "quote", declared in code."""
    return HttpResponse(QUOTES[len(request.GET.get("n", "")) % len(QUOTES)] + "\n",
                        content_type="text/plain")


#: A partner's weather API that takes at most two calls a second from this whole site,
#: however many workers serve it: a limit on the outbound call, not on the page.
#: Declared in code, so the admin lists it as policy "weather-partner".
weather_partner = limit("weather-partner", rate="2/s", timeout=1)

FORECASTS = ["sunny", "showers", "overcast", "windy"]


def _ask_partner(city: str) -> str:
    """Stands in for the partner's HTTP API."""
    return FORECASTS[sum(map(ord, city)) % len(FORECASTS)]


def forecast(request):
    """Each request calls the partner once, waiting (up to 1 s) for a turn of policy
    "weather-partner"; with no turn in time, it answers 503 and when to try again."""
    city = request.GET.get("city", "Amsterdam")[:40]
    asked = runtime.clock().monotonic()
    try:
        with weather_partner:
            answer = _ask_partner(city)
    except Limited as refused:
        return JsonResponse({"city": city, "error": "the weather partner is busy",
                             "retry_after": refused.retry_after}, status=503,
                            headers={"Retry-After": str(math.ceil(refused.retry_after))})
    waited = round(runtime.clock().monotonic() - asked, 1)
    return JsonResponse({"city": city, "forecast": answer, "waited": waited})


def report(request):
    """An expensive page: policy "report-paced" warms a cold client up and lets a
    request wait up to 2 s for its turn."""
    return HttpResponse("Report ready.\n", content_type="text/plain")


async def slow(request):
    """An async view: the middleware runs in the async stack without a thread hop."""
    await asyncio.sleep(0.05)
    return JsonResponse({"ok": True, "async": True})


_busy = [0]  # requests in /busy/ now
_busy_lock = threading.Lock()


def busy(request):
    """A service that slows down as it fills up: 20 ms per request in flight. Its
    adaptive policy learns how many it may take at once, and answers the rest 503."""
    with _busy_lock:
        _busy[0] += 1
        n = _busy[0]
    try:
        time.sleep(0.02 * n)
        return JsonResponse({"in_flight": n})
    finally:
        with _busy_lock:
            _busy[0] -= 1


class ItemList(APIView):
    """A DRF view whose `throttle_scope` selects the policies with scope "items"."""

    throttle_scope = "items"

    def get(self, request):
        return Response({"items": [{"id": i, "name": f"item {i}"} for i in range(1, 4)]})
