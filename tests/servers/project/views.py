"""Views as a site writes them, with limits declared in code."""

from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.decorators import ratelimit


@ratelimit(name="quote", rate="3/m")
def quote(request):
    return HttpResponse("a quote")


@csrf_exempt
@ratelimit(name="login", rate="5/m", key="post:username", methods="POST")
def login(request):
    return HttpResponse(f"hello {request.POST.get('username', '')}")


def free(request):
    return HttpResponse("free")


class Upload(APIView):
    """A DRF view whose `throttle_scope` an operator's policy names."""

    throttle_scope = "uploads"

    def post(self, request):
        return Response({"stored": True})
