"""The project of tests/servers/project with a login to protect: Django's `LoginView`, DRF's
token view and an API throttled by `ratelimits.compat.drf` (see urls.py)."""

from tests.servers.project.settings import *  # noqa: F403
from tests.servers.project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "rest_framework.authtoken"]
ROOT_URLCONF = "tests.servers.login_site.urls"
REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"anon": "5/min"}}
# the tests post passwords in a loop: a fast hash, as test settings usually have
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
