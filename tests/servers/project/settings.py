"""A project set up as the README's "Use it in your project" says, nothing more.

The real-server tests (tests/servers/) serve it with gunicorn, uvicorn and uWSGI as users
start them: `migrate` once as a deploy does, then the server, with no `check` and no
request made first. The database file and the Redis come from the environment.
"""

import os

SECRET_KEY = "servers-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "ratelimits",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimits.middleware.RateLimitMiddleware",  # after AuthenticationMiddleware
    "django.contrib.messages.middleware.MessageMiddleware",
]

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["WORKERS_REDIS_URL"],
    },
}

REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["ratelimits.throttling.PolicyThrottle"],
}

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["WORKERS_DB"]}}
ROOT_URLCONF = "tests.servers.project.urls"
WSGI_APPLICATION = "tests.servers.project.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
