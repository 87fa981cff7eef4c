"""Settings of the Celery worker that tests/test_celery.py starts: the multi-process
tests' settings (a file SQLite database, the engine on the test's private redis-server),
with Redis as Celery's broker and result backend."""

import os

from tests.support.workers_settings import *  # noqa: F403

# database 1 of the limiter's server (which is on database 0)
CELERY_BROKER_URL = os.environ["WORKERS_REDIS_URL"].rsplit("/", 1)[0] + "/1"
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
# Celery 5.3 warns when this is left unset; the broker is up before the worker starts
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
