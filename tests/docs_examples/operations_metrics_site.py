"""Settings and URLs of the gunicorn site behind docs/operations/prometheus.md: the
multi-process tests' site (tests/support/workers_settings.py) with metrics on, the scrape
exempt, and `ratelimits.urls` included, as that page sets a project up."""

from django.urls import include, path

from tests.support.workers_settings import *  # noqa: F403
from tests.support.workers_settings import RATELIMITS, pid

RATELIMITS = {**RATELIMITS, "METRICS": True,
              "EXEMPT": "tests.docs_examples.operations_metrics_site.exempt"}
ROOT_URLCONF = "tests.docs_examples.operations_metrics_site"


def exempt(request):
    return request.path == "/ratelimits/metrics/"


urlpatterns = [
    path("hello/", pid),
    path("free/", pid),
    path("ratelimits/", include("ratelimits.urls")),
]
