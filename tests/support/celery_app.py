"""The Celery application of tests/test_celery.py, set up as Celery's guide to Django
sets up a project's: settings under the `CELERY_` prefix, tasks found by autodiscovery
once Django is set up (`celery -A tests.support.celery_app worker`)."""

from celery import Celery

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.support"], related_name="celery_tasks")
