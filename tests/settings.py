"""Django settings for the test suite."""

import os

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS for the browser test's live server
    "rest_framework",
    "rest_framework.authtoken",  # the token view the login tests post to
    "ratelimits",
]
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# The engine runs on this cache's Redis connection (tests/support/fixtures.py chooses the server).
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "tests-cache",
    },
    "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimits.middleware.RateLimitMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
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
            ]
        },
    }
]
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["ratelimits.throttling.PolicyThrottle"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
# A connection given a whole second: `make test` runs two files at once on two cores, and a
# cluster client's connect has taken more than the default 0.1 s under that load (its
# request then fell to on_error). The tests of a slow or dead server set their own
# timeouts; a paused server still accepts connections, so the reply's timeout (kept at its
# default) is what they meet.
RATELIMITS = {"KEY_PREFIX": "tests-rl:", "CONNECT_TIMEOUT": 1.0}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"ratelimits": {"level": "DEBUG", "propagate": True}},
}

# Test users sign in with a fast hash: the login recipes post passwords in a loop.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
