"""The app's URLconf: `path("ratelimits/", include("ratelimits.urls"))` in your own."""

from django.urls import path

from ratelimits.pipeline.metrics import metrics_view

app_name = "ratelimits"

urlpatterns = [
    path("metrics/", metrics_view, name="metrics"),
]
