"""Settings of the demo site: SQLite, the admin, a small DRF API and ratelimits.

The engine runs in process unless REDIS_URL is set, in which case limits are shared
through Redis (django-redis) by every process that serves the site.
"""

import importlib.util
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

# It keys the rollout draw too (who is in a policy's share): with this one, 127.0.0.1 is
# out of shop-rollout at 25% and in at 50%, as the tour (docs/demo.md) says. Another key
# draws anew.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-never-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "ratelimits",
    "demo_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimits.middleware.RateLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
WSGI_APPLICATION = "demo_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DB", str(BASE_DIR / "db.sqlite3")),
    }
}

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

RATELIMITS = {
    "CACHE": "default",
    "HEADERS": "ietf",
    # Prometheus metrics at /ratelimits/metrics/ when the [prometheus] extra is installed.
    "METRICS": importlib.util.find_spec("prometheus_client") is not None,
}

REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["ratelimits.throttling.PolicyThrottle"],
}

# Enforced refusals are INFO records, which a logger without a handler never shows: give
# the "ratelimits" logger one. Its messages start with "ratelimits:" already.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"ratelimits": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}

# The in-process engine is per process by design here; silence the check that says so.
SILENCED_SYSTEM_CHECKS = [] if REDIS_URL else ["ratelimits.W001"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
