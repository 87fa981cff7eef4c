"""A RATELIMITS mistake stops the app at start-up, and never lets a request pass unlimited.

Servers (gunicorn, uWSGI, uvicorn, daphne) never run the system checks: they import the
settings and build the WSGI or ASGI handler, which builds the middleware. So the
middleware refuses to be built on a bad setting, as a server would meet it, in a
subprocess; `manage.py check` still reports the same mistake as ratelimits.E001 (the
app's ready() stays quiet so that the checks can run); and the request path raises
instead of admitting when it meets a bad setting later (the DRF throttle alone, or
settings changed at run time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parents[1]
MIDDLEWARE = "ratelimits.middleware.RateLimitMiddleware"

WSGI = "from django.core.wsgi import get_wsgi_application; get_wsgi_application(); print('up')"
ASGI = "from django.core.asgi import get_asgi_application; get_asgi_application(); print('up')"


def run_with_settings(
    tmp_path: Path, ratelimits: str, *command: str
) -> subprocess.CompletedProcess[str]:
    """Run `command` in a fresh Python whose settings are the tests' with `ratelimits`."""
    (tmp_path / "startup_settings.py").write_text(
        f"from tests.settings import *  # noqa: F403\n\nRATELIMITS = {ratelimits}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "startup_settings",
    }
    return subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


MISTAKES = [
    ('{"KEY_PREFX": "rl:"}', "unknown RATELIMITS key(s): KEY_PREFX"),
    ('{"REDIS_URL": "redis://localhost:63x9/0"}', "a port is a number from 1 to 65535"),
    ('{"SOCKET_TIMEOUT": "fast"}', "RATELIMITS['SOCKET_TIMEOUT'] must be a number of seconds"),
    ('{"CACHE": "redis"}', "RATELIMITS['CACHE'] is 'redis', which is not an alias in CACHES"),
    ('{"REJECT_VIEW": "tests.nowhere.view"}', "RATELIMITS['REJECT_VIEW'] = 'tests.nowhere.view'"),
    ('{"TIER": "tests.nowhere.plan"}', "RATELIMITS['TIER'] = 'tests.nowhere.plan'"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("ratelimits", "says"), MISTAKES)
def test_a_wsgi_server_stops_at_start_up_on_a_ratelimits_mistake(tmp_path, ratelimits, says):
    run = run_with_settings(tmp_path, ratelimits, "-c", WSGI)
    assert run.returncode != 0 and "up" not in run.stdout
    assert "django.core.exceptions.ImproperlyConfigured" in run.stderr and says in run.stderr


@pytest.mark.slow
def test_an_asgi_server_stops_at_start_up_too(tmp_path):
    run = run_with_settings(tmp_path, '{"ENABLE": False}', "-c", ASGI)
    assert run.returncode != 0 and "up" not in run.stdout
    assert "unknown RATELIMITS key(s): ENABLE;" in run.stderr


@pytest.mark.slow
def test_a_good_setting_starts(tmp_path):
    """The control: the same start-up with valid settings comes up."""
    for code in (WSGI, ASGI):
        run = run_with_settings(tmp_path, '{"KEY_PREFIX": "rl:", "REDIS_URL": None}', "-c", code)
        assert (run.returncode, run.stdout.strip()) == (0, "up"), run.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("ratelimits", "says"), MISTAKES[:3])
def test_manage_py_check_reports_the_mistake_as_e001(tmp_path, ratelimits, says):
    run = run_with_settings(tmp_path, ratelimits, "-m", "django", "check")
    assert run.returncode == 1
    assert "ratelimits.E001" in run.stderr and says in run.stderr
    assert "Traceback" not in run.stderr  # a report, not a crash while loading the app


DECLARING_URLS = """
from django.http import HttpResponse
from django.urls import path

from ratelimits.compat.django_ratelimit.decorators import ratelimit as dr_ratelimit
from ratelimits.decorators import ratelimit


@ratelimit(name="quote", rate="3/m", key="ip", algorithm="gcra", max_wait=1)
def quote(request):
    return HttpResponse("ok")


@dr_ratelimit(key="post:username", rate="5/m")
def login(request):
    return HttpResponse("ok")


urlpatterns = [path("quote/", quote), path("login/", login)]
"""


@pytest.mark.slow
@pytest.mark.parametrize(("ratelimits", "says"), [
    *MISTAKES[:3], ('{"MAX_DELAY": "long"}', "RATELIMITS['MAX_DELAY'] must be"),
])
def test_manage_py_check_reports_the_mistake_when_the_urlconf_declares_limits(
    tmp_path, ratelimits, says
):
    """The checks import the URLconf, and with it the views' `@ratelimit` declarations,
    which validate their policies against RATELIMITS' MAX_DELAY and IPV6_PREFIX: a
    mistake in RATELIMITS is still reported as E001, not raised from the import."""
    (tmp_path / "declaring_urls.py").write_text(DECLARING_URLS)
    run = run_with_settings(tmp_path, f"{ratelimits}\nROOT_URLCONF = 'declaring_urls'",
                            "-m", "django", "check")
    assert run.returncode == 1, run.stderr
    assert "ratelimits.E001" in run.stderr and says in run.stderr
    assert "Traceback" not in run.stderr


# -- the request path never admits on a bad setting ----------------------------------------


@pytest.fixture
def one_per_hour(make_policy):
    """Limits of one: a second request that passes has passed unlimited."""
    make_policy(name="one", limit=1, path="/hello/")
    make_policy(name="one-api", limit=1, scope="items")


def test_a_typo_stops_the_middleware_before_any_request_passes(client, settings, one_per_hour):
    settings.RATELIMITS = {**settings.RATELIMITS, "KEY_PREFX": "rl:"}
    for _ in range(2):
        with pytest.raises(ImproperlyConfigured, match="KEY_PREFX"):
            client.get("/hello/")


def test_the_drf_throttle_alone_refuses_to_admit_on_a_typo(client, settings, one_per_hour):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE]
    settings.RATELIMITS = {**settings.RATELIMITS, "HEADER": "ietf"}
    for _ in range(2):
        with pytest.raises(ImproperlyConfigured, match="unknown RATELIMITS key"):
            client.get("/api/items/")


def test_the_drf_throttle_alone_refuses_a_cache_alias_that_does_not_exist(
    client, settings, one_per_hour
):
    """Not a per-process count in disguise: a missing alias used to mean the local engine."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE]
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "nope"}
    with pytest.raises(ImproperlyConfigured, match="'nope', which is not an alias in CACHES"):
        client.get("/api/items/")


def test_a_setting_broken_after_start_up_raises_instead_of_admitting(
    client, settings, one_per_hour
):
    assert client.get("/hello/").status_code == 200  # the middleware is built and working
    settings.RATELIMITS = {**settings.RATELIMITS, "MAX_DELAY": -1}
    for _ in range(2):
        with pytest.raises(ImproperlyConfigured, match="MAX_DELAY"):
            client.get("/hello/")
