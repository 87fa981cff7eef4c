"""The rows of limits declared in code: written by whichever process comes first, and
read back by the others, never an error and never a second row (the real-server race is
in tests/servers/test_drf_declared_servers.py); found at `migrate` for the DRF compat
throttles of the routed views."""

from __future__ import annotations

import logging

import pytest
from django.test import override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.compat.drf import ScopedRateThrottle, UserRateThrottle, declare_routed
from ratelimits.models import Policy
from ratelimits.pipeline.declared import registry

pytestmark = pytest.mark.django_db

CODE = {"algorithm": "fixed_window", "limit": 3, "period": 60, "burst": None, "cost": 1,
        "max_wait": 0, "warmup": 0, "key": "ip", "methods": ""}


def test_a_row_another_process_wrote_meanwhile_is_read_back_not_an_error(
    forget_declarations, caplog
):
    registry.declare("raced", "enforce", **CODE)
    theirs = registry.declared["raced"].policy()
    theirs.save()  # another worker inserted it after this one read the table
    caplog.set_level(logging.ERROR, "ratelimits")
    got = registry.write([])  # this one read no row
    assert [(r.pk, r.name, r.declared) for r in got] == [(theirs.pk, "raced", True)]
    assert Policy.objects.filter(name="raced").count() == 1
    assert "could not write" not in caplog.text


def test_a_missing_row_is_inserted_and_returned_with_its_id(forget_declarations):
    registry.declare("fresh", "shadow", **CODE)
    got = registry.write([])
    assert len(got) == 1 and got[0].pk is not None and got[0].mode == "shadow"
    assert got[0].created is not None and got[0].updated is not None


class _Scoped(APIView):
    throttle_classes = [ScopedRateThrottle, UserRateThrottle]
    throttle_scope = "exports"

    def get(self, request):
        return Response("ok")


class _ByRoute(APIView):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope: str | None = None


class _Unscoped(APIView):
    throttle_classes = [ScopedRateThrottle]  # no throttle_scope: DRF throttles nothing


urlpatterns = [
    path("exports/", _Scoped.as_view()),
    path("reports/", _ByRoute.as_view(throttle_scope="reports")),
    path("free/", _Unscoped.as_view()),
]


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {
    "exports": "4/min", "reports": "2/hour", "user": "9/min"}})
def test_the_routed_views_compat_throttles_are_declared_without_a_request(
    forget_declarations
):
    assert declare_routed(__name__) == ["drf:exports", "drf:user", "drf:reports"]
    code = {n: (d.code["limit"], d.code["period"]) for n, d in registry.declared.items()
            if n.startswith("drf:")}
    assert code == {"drf:exports": (4, 60), "drf:user": (9, 60), "drf:reports": (2, 3600)}
