"""`ratelimits.compat.drf` beside the rest of the app: declared policies in the admin, one
store call with the middleware, rates read from the settings when DRF reads them, and a
subclass's own `get_cache_key()`."""

from __future__ import annotations

import pytest
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimits.compat.drf import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle
from ratelimits.models import Policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


class Anon(AnonRateThrottle):
    scope = "t-anon"


class Users(UserRateThrottle):
    scope = "t-user"


class TimedAnon(Anon):
    """DRF's tests fake time by replacing `timer`: the engine decides at its time."""

    def timer(self):
        return 1000.0


class ByApiKey(UserRateThrottle):
    """A user's subclass: clients are API keys; a request without one is not throttled."""

    scope = "t-key"

    def get_cache_key(self, request, view):
        key = request.headers.get("X-Api-Key")
        return None if key is None else f"key:{key}"


class Both(APIView):
    throttle_classes = [Anon, Users]

    def get(self, request):
        return Response({"ok": True})


class Timed(APIView):
    throttle_classes = [TimedAnon]

    def get(self, request):
        return Response({"ok": True})


class Keyed(APIView):
    throttle_classes = [ByApiKey]

    def get(self, request):
        return Response({"ok": True})


class Uploads(APIView):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "t-uploads"

    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("both/", Both.as_view()),
    path("timed/", Timed.as_view()),
    path("keyed/", Keyed.as_view()),
    path("uploads/", Uploads.as_view()),
]

RATES = {"t-anon": "2/min", "t-user": "5/min", "t-key": "1/hour", "t-uploads": "2/day"}


@pytest.fixture(autouse=True)
def _rows_written_again():
    """Each test's database is new: declared rows are written again in it."""
    from ratelimits.pipeline.declared import registry

    registry.forget_written()
    yield
    registry.forget_written()


@pytest.fixture
def rates(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": RATES}


def statuses(client, url, n, **headers):
    return [client.get(url, headers=headers).status_code for _ in range(n)]


def test_the_first_refusal_is_drfs_429_with_its_retry_after(client, rates):
    assert statuses(client, "/timed/", 2) == [200, 200]
    refused = client.get("/timed/")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"
    assert refused.json() == {"detail": "Request was throttled. Expected available in 60 "
                                        "seconds."}


def test_each_scope_is_a_declared_policy_in_the_admin(client, rates):
    client.get("/both/")
    anon = Policy.objects.get(name="drf:t-anon")
    assert anon.declared and anon.mode == "enforce"
    assert (anon.algorithm, anon.limit, anon.period) == ("sliding_log", 2, 60)
    assert anon.key == "code:drf:t-anon"
    assert Policy.objects.get(name="drf:t-user").limit == 5


def test_the_operator_owns_the_mode(client, rates, django_capture_on_commit_callbacks):
    assert statuses(client, "/both/", 3) == [200, 200, 429]
    policy = Policy.objects.get(name="drf:t-anon")
    policy.mode = "shadow"
    with django_capture_on_commit_callbacks(execute=True):
        policy.save()
    assert statuses(client, "/both/", 2) == [200, 200]  # logged as would-reject only


def test_anon_skips_users_and_user_counts_each_user(client, rates, django_user_model):
    client.force_login(django_user_model.objects.create_user("ann"))
    # the anon limit (2) does not count a user; the user limit (5) does
    assert statuses(client, "/both/", 6) == [200] * 5 + [429]
    client.force_login(django_user_model.objects.create_user("bob"))
    assert statuses(client, "/both/", 1) == [200]


def test_a_subclass_get_cache_key_is_the_client(client, rates):
    assert statuses(client, "/keyed/", 2, X_Api_Key="a") == [200, 429]
    assert statuses(client, "/keyed/", 1, X_Api_Key="b") == [200]
    assert statuses(client, "/keyed/", 3) == [200, 200, 200]  # None: not throttled


def test_the_rate_is_read_from_the_settings_when_drf_reads_it(client, rates, settings):
    assert statuses(client, "/uploads/", 3) == [200, 200, 429]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**RATES, "t-uploads": "3/day"}}
    assert statuses(client, "/uploads/", 2) == [200, 429]
    assert Policy.objects.get(name="drf:t-uploads").limit == 3


def test_one_store_call_decides_the_views_throttles_and_the_site_policy(
    client, rates, make_policy, private_redis, settings
):
    """Two compat throttles and an unscoped policy of the middleware: one FCALL."""
    import redis

    from tests.pipeline.test_round_trips import commands

    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES":
                               {**RATES, "t-anon": "100/min", "t-user": "100/min"}}
    make_policy(name="site", limit=1000, period=60)
    assert client.get("/both/").status_code == 200  # scripts loaded, limits declared
    direct = redis.Redis.from_url(private_redis.url)
    before = commands(direct)["fcall"]
    for _ in range(5):
        response = client.get("/both/")
        assert response.status_code == 200
        assert response.has_header("RateLimit")  # the middleware's headers, all policies
    assert commands(direct)["fcall"] - before == 5


def test_a_refused_request_charges_the_site_policy_nothing(client, rates, make_policy):
    from ratelimits.ops import observe

    make_policy(name="site", limit=100, period=60)
    assert statuses(client, "/both/", 4) == [200, 200, 429, 429]
    site = observe.last_hour(["site"])["site"]
    assert site.admitted == 2 and site.spared == 2


def test_the_site_policy_refusing_is_drfs_429_too(client, rates, make_policy):
    client.get("/both/")  # declares the view's limits: the middleware leaves it to them
    make_policy(name="site", limit=1, period=60)
    assert statuses(client, "/both/", 2) == [200, 429]


def test_one_scope_has_one_rate(rf, caplog):
    """DIFFERENCE: two classes giving one scope two rates share one policy, whose rate is
    the one last used (a warning says so); DRF shares the history and checks each rate."""
    from rest_framework.request import Request

    from ratelimits.pipeline.declared import registry

    class Three(UserRateThrottle):
        scope, rate = "t-shared", "3/min"

    class Six(UserRateThrottle):
        scope, rate = "t-shared", "6/min"

    for throttle in (Three(), Six()):
        assert throttle.allow_request(Request(rf.get("/")), view={}) is True
    assert registry.declared["drf:t-shared"].code["limit"] == 6
    assert "drf:t-shared's rate is now 6 per 60s (it was 3 per 60s)" in caplog.text


def test_the_classes_load_when_drf_settings_name_them_in_a_fresh_process(tmp_path):
    """As a site's settings name them: DRF imports DEFAULT_THROTTLE_CLASSES while it
    builds APIView, so the module must not import DRF's views (a cycle: every request
    answered 500)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "drf_compat_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "REST_FRAMEWORK = {'DEFAULT_THROTTLE_CLASSES': [\n"
        "    'ratelimits.compat.drf.AnonRateThrottle',\n"
        "    'ratelimits.compat.drf.UserRateThrottle'],\n"
        "    'DEFAULT_THROTTLE_RATES': {'anon': '5/min', 'user': '10/min'}}\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "drf_compat_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    code = ("import django; django.setup()\n"
            "from rest_framework.views import APIView\n"
            "print([c.__name__ for c in APIView.throttle_classes])\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['AnonRateThrottle', 'UserRateThrottle']"


# -- the client's address ------------------------------------------------------------------


def rotating(client, n, header=lambda i: f"198.51.100.{i}", **extra):
    """`n` anonymous requests, each naming another client in X-Forwarded-For."""
    return [client.get("/both/", HTTP_X_FORWARDED_FOR=header(i), **extra).status_code
            for i in range(n)]


def test_a_forwarding_header_from_an_untrusted_peer_names_no_client(client, rates):
    """The client is the address the `ip` key reads: a peer that is not one of
    TRUSTED_PROXIES is itself the client, whatever X-Forwarded-For says (DRF's default,
    NUM_PROXIES=None, would count each request as a new client)."""
    assert rotating(client, 20) == [200, 200] + [429] * 18


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted(client, rates, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "TRUSTED_PROXIES": ["127.0.0.0/8"]}
    assert rotating(client, 20) == [200] * 20  # each one a client of the proxy
    # the proxy appends the peer it saw: what the client wrote before it is its own
    assert rotating(client, 5, lambda i: f"192.0.2.{i}, 203.0.113.7") == [200, 200] + [429] * 3


def test_ipv6_clients_are_counted_per_prefix_as_the_ip_key_counts_them(client, rates):
    codes = [client.get("/both/", REMOTE_ADDR=f"2001:db8:0:1::{i:x}").status_code
             for i in range(1, 6)]
    assert codes == [200, 200, 429, 429, 429]


def test_drfs_own_client_address_is_opted_into(client, rates, settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "DRF_CLIENT_IP": "num_proxies"}
    assert rotating(client, 20) == [200] * 20  # NUM_PROXIES=None: X-Forwarded-For, whole
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert rotating(client, 5, lambda i: f"192.0.2.{i}, 203.0.113.8") == [200, 200] + [429] * 3


def test_an_outage_503_carries_no_headers_of_a_policy_decided_in_process(
        client, rates, make_policy, settings, django_capture_on_commit_callbacks):
    """The throttle's refusal, as the middleware's: the headers are the refusing
    policies' (none has a count to show for a store it could not reach)."""
    make_policy(name="per-node", limit=50, period=60, counting="per_process")
    admitted = client.get("/both/")
    assert admitted.status_code == 200 and admitted.has_header("RateLimit")
    policy = Policy.objects.get(name="drf:t-anon")
    policy.on_error = "deny"
    with django_capture_on_commit_callbacks(execute=True):
        policy.save()
    settings.RATELIMITS = {**settings.RATELIMITS, "REDIS_URL": "redis://127.0.0.1:9/0"}
    refused = client.get("/both/")
    assert refused.status_code == 503
    assert not {"RateLimit", "RateLimit-Policy"} & set(refused.headers), dict(refused.headers)
