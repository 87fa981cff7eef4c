"""Settings and URLs of the gunicorn site behind docs/operations/prometheus.md: the
multi-process tests' site (tests/support/workers_settings.py) with metrics on, the scrape
exempt, and `ratelimits.urls` included, as that page sets a project up."""

import os
import time
from pathlib import Path

from django.urls import include, path

from tests.support.workers_settings import *  # noqa: F403
from tests.support.workers_settings import RATELIMITS, pid

RATELIMITS = {**RATELIMITS, "METRICS": True,
              "EXEMPT": "tests.docs_examples.operations_metrics_site.exempt"}
ROOT_URLCONF = "tests.docs_examples.operations_metrics_site"


def exempt(request):
    return request.path == "/ratelimits/metrics/"


def hello(request):
    """The answering worker's pid. With `?meet=N`, the answer waits until N workers are
    inside this view at once, each leaving its pid in MEET_DIR (30 s at most: a worker
    still importing the site on a loaded machine joins late): N requests sent together
    are then answered by N different sync workers, whatever order the kernel hands the
    connections out in."""
    wanted = int(request.GET.get("meet", 0))
    if wanted:
        room = Path(os.environ["MEET_DIR"])
        (room / str(os.getpid())).touch()
        deadline = time.monotonic() + 30
        while len(list(room.iterdir())) < wanted and time.monotonic() < deadline:
            time.sleep(0.01)
    return pid(request)


urlpatterns = [
    path("hello/", hello),
    path("free/", pid),
    path("ratelimits/", include("ratelimits.urls")),
]
