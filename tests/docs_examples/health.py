# urls.py: a health check for the load balancer, beside the site's pages
from django.http import HttpResponse
from django.urls import path


def healthz(request):
    return HttpResponse("ok")


def home(request):
    return HttpResponse("home")


urlpatterns = [path("healthz", healthz), path("", home)]
