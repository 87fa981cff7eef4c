"""A few views to watch ratelimits at work: plain, async, and a small DRF API."""

import asyncio

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from rest_framework.response import Response
from rest_framework.views import APIView


def index(request):
    return render(request, "demo/index.html")


def hello(request):
    return HttpResponse("Hello! Reload me a few times: after 5 a minute you get a 429.\n",
                        content_type="text/plain")


def search(request):
    query = request.GET.get("q", "")
    return JsonResponse({"query": query, "results": [f"{query} {i}" for i in range(3)]})


async def slow(request):
    """An async view: the middleware runs in the async stack without a thread hop."""
    await asyncio.sleep(0.05)
    return JsonResponse({"ok": True, "async": True})


class ItemList(APIView):
    """A DRF view whose `throttle_scope` selects the policies with scope "items"."""

    throttle_scope = "items"

    def get(self, request):
        return Response({"items": [{"id": i, "name": f"item {i}"} for i in range(1, 4)]})
