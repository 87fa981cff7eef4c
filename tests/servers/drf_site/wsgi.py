"""The DRF site behind a slow policy table: each read of the policy rows takes
`SLOW_POLICY_READS` seconds (from the environment; 0 by default), as on a busy database.

Workers that start together read the table at their first request, find no row, and
write theirs: a slow read makes all of them read before any of them writes, so the race
between their writes happens at every start instead of once in a while.
"""

import os
import time

from django.core.wsgi import get_wsgi_application
from django.db.backends.signals import connection_created

DELAY = float(os.environ.get("SLOW_POLICY_READS", "0"))


def _slow_policy_reads(execute, sql, params, many, context):
    text = sql.upper()
    if text.lstrip().startswith("SELECT") and '"RATELIMITS_POLICY"' in text and (
        "COUNT(" not in text
    ):
        time.sleep(DELAY)
    return execute(sql, params, many, context)


def _install(sender, connection, **kwargs):
    connection.execute_wrappers.append(_slow_policy_reads)


if DELAY:
    connection_created.connect(_install)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.servers.drf_site.settings")
application = get_wsgi_application()
