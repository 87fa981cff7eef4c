"""The tasks of tests/test_celery.py. Each run that gets its turn calls "the partner": it
appends the Redis server's time, its policy, its argument and how many times it was
retried to a list (`partner-calls`) the test reads."""

from __future__ import annotations

import json

from celery import shared_task
from django_redis import get_redis_connection

from ratelimits.celery import limited_task

#: The server's clock, not the worker's: one clock for every process the test compares.
_RECORD = """
local now = redis.call('TIME')
return redis.call('RPUSH', KEYS[1], now[1] .. '.' .. string.format('%06d', now[2]) .. ' '
                  .. ARGV[1])
"""


def call_partner(task, policy: str, argument: object) -> None:
    seen = json.dumps({"policy": policy, "argument": argument,
                       "retries": task.request.retries})
    get_redis_connection().eval(_RECORD, 1, "partner-calls", seen)


@shared_task(bind=True)
@limited_task("partner-api", rate="5/s", burst=1, timeout=2)
def paced(self, n):
    call_partner(self, "partner-api", n)


@shared_task(bind=True, max_retries=2)
@limited_task("partner-per-tenant", rate="1/10s", key=lambda tenant, n: tenant, timeout=1)
def per_tenant(self, tenant, n):
    call_partner(self, "partner-per-tenant", [tenant, n])


@shared_task(bind=True)
@limited_task("partner-watched", rate="1/m", mode="shadow", timeout=30)
def watched(self, n):
    call_partner(self, "partner-watched", n)


@shared_task(bind=True)
def unlimited(self):
    call_partner(self, "none", None)
