"""The PostgreSQL engine's connections and schema (`postgres`): each thread's autocommit
session, opened again in a forked child, the tables and functions installed on first use,
and every call bounded in time and made behind the circuit breaker.

The engine talks through connections of its own, in autocommit: a charge is never part of
a view's transaction, so the view's rollback cannot undo it and a long view cannot hold a
client's lock. The schema (`sql/postgres.sql`) gets the constants the Lua scripts get,
written in by `install_sql`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.constants import (
    CONCURRENCY_RETRY_US,
    EPS,
    FLOOR_EPS,
    OFFENDERS_CAP,
    OFFENDERS_TTL,
    STATS_TTL,
    TOKEN_EPS,
    US,
)
from ratelimits.engine.errors import CircuitOpen, EngineError, EngineUnavailable
from ratelimits.engine.keynames import to_us
from ratelimits.engine.layout import LEASE_RESET
from ratelimits.engine.lease import LEASE_SECONDS

__all__ = ["LOCK_SPACE", "Sessions", "install_sql", "tables"]

#: The class id of the engine's advisory locks (two-int form, so they never meet a
#: site's own single-bigint advisory locks): "RLIM".
LOCK_SPACE = 0x524C494D

_SQL_CONSTANTS = {
    "__EPS__": EPS,
    "__TOKEN_EPS__": TOKEN_EPS,
    "__FLOOR_EPS__": FLOOR_EPS,
    "__CONCURRENCY_RETRY_US__": CONCURRENCY_RETRY_US,
    "__STATS_TTL__": STATS_TTL,
    "__OFFENDERS_TTL__": OFFENDERS_TTL,
    "__OFFENDERS_CAP__": OFFENDERS_CAP,
    "__LOCK_SPACE__": LOCK_SPACE,
    "__US__": US,
    "__LEASE_US__": to_us(LEASE_SECONDS),
    "__LEASE_RESET__": LEASE_RESET,
}
#: The function installed last (`install_sql`): a database without it gets them all.
NEWEST_FUNCTION = "ratelimits_lease_v1"


def install_sql() -> str:
    """The tables and functions the engine installs, with the shared constants written
    in (as the Lua scripts get them), so SQL and Python never disagree on one."""
    text = files("ratelimits.engine").joinpath("sql/postgres.sql").read_text("utf-8")
    for name, value in _SQL_CONSTANTS.items():
        literal = repr(value) if isinstance(value, float) else str(int(value))
        text = text.replace(name, f"({literal}::float8)" if isinstance(value, float)
                            else literal)
    return text


def tables() -> tuple[str, ...]:
    """The tables the engine creates, as `install_sql()` names them."""
    return tuple(re.findall(r"CREATE (?:UNLOGGED )?TABLE IF NOT EXISTS (\w+)", install_sql()))


_bounded: Any = None


def _bounded_connection() -> Any:
    """psycopg's `Connection`, whose waits for the server end after its `call_timeout`
    (seconds; None: no end): a server that accepts a statement and never answers (its
    processes paused, a proxy holding the call) is given up as the Redis engine gives up
    after its socket timeout. psycopg raises its `OperationalError` then, and the
    connection is dropped: what it was doing is unknown."""
    global _bounded
    if _bounded is None:
        import psycopg

        class Bounded(psycopg.Connection[Any]):
            call_timeout: float | None = None

            def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
                if len(args) < 2 and kwargs.get("timeout") is None:
                    kwargs["timeout"] = self.call_timeout
                return super().wait(gen, *args, **kwargs)

        _bounded = Bounded
    return _bounded


class _Connections(threading.local):
    """Each thread's connection, and the process that opened it."""

    conn: Any = None
    pid = 0


class Sessions:
    """Each thread's autocommit connection to the server at `conninfo`, for each process
    (a forked child opens its own). `timeout` (seconds): twice it bounds the wait for any
    answer; `connect_timeout` bounds each new connection; `breaker` makes calls fail fast
    after a few failures."""

    def __init__(self, conninfo: str, *, timeout: float, connect_timeout: float,
                 breaker: CircuitBreaker | None) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.breaker = breaker
        self._local = _Connections()
        self._installed = False
        self._lock = threading.Lock()
        #: Connections a forked child inherited: kept, never closed or collected there,
        #: since closing one would end its parent's session on the shared socket.
        self._inherited: list[Any] = []
        #: Every connection process `_opened_by` opened (each thread's), for `close()`.
        self._opened: list[Any] = []
        self._opened_by = os.getpid()

    def connection(self) -> Any:
        """This thread's connection, opened (and the schema installed) on first use."""
        local = self._local
        conn = local.conn
        if conn is not None and local.pid == os.getpid() and not conn.closed:
            return conn
        local.conn = None
        conn = self.open()
        local.conn, local.pid = conn, os.getpid()
        with self._lock:
            self._forked()
            self._opened.append(conn)
        if not self._installed:
            self._install(conn)
        return conn

    def open(self) -> Any:
        """A new autocommit connection, bounded as the engine's calls are."""
        # libpq's connect_timeout is whole seconds, and it takes less than 2 as 2. A host
        # gone or cut off mid-call is found by TCP within a few seconds (keepalives, and
        # data unacknowledged past the timeout), not by the OS's minutes-long defaults.
        # Never a statement prepared on the server (psycopg prepares one run five times),
        # as Django's backend by default: behind PgBouncer in transaction mode the next
        # call may meet another server connection, where it does not exist.
        conn = _bounded_connection().connect(self.conninfo, autocommit=True,
                               prepare_threshold=None,
                               connect_timeout=max(2, math.ceil(self.connect_timeout)),
                               keepalives=1, keepalives_idle=1, keepalives_interval=1,
                               keepalives_count=3,
                               tcp_user_timeout=max(1000, round(self.timeout * 2000)))
        # Nothing is set in the session: behind PgBouncer in transaction mode, a setting
        # would stay on a server connection the site's own queries use next. Each call
        # bounds its own waits for locks (`SOCKET_TIMEOUT`, in its transaction), and a
        # call given no answer within twice that is given up here.
        conn.call_timeout = 2 * self.timeout
        return conn

    def _install(self, conn: Any) -> None:
        """Create the tables and functions unless this version's are there, under a lock
        so that processes starting together do not race on the catalogue."""
        import psycopg

        with self._lock:
            if self._installed:
                return
            found = conn.execute("SELECT to_regproc(%s) IS NOT NULL",
                                 (NEWEST_FUNCTION,)).fetchone()[0]
            if not found:
                bound, conn.call_timeout = conn.call_timeout, None  # a long statement
                try:
                    with conn.transaction():
                        conn.execute("SET LOCAL statement_timeout = 0")
                        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_SPACE,))
                        conn.execute(install_sql(), prepare=False)
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise EngineError(
                        "the PostgreSQL engine could not create its tables and functions "
                        f"({exc}): grant the limiter's role CREATE on the first schema of "
                        "its search_path, or give it a schema of its own (options="
                        "-csearch_path=<schema>)") from exc
                finally:
                    conn.call_timeout = bound
            self._installed = True

    def call(self, sql: str, params: Sequence[Any]) -> Any:
        """Run one statement and return its first row, behind the circuit breaker, with
        psycopg's errors said as the engine's."""
        import psycopg

        breaker = self.breaker
        if breaker is not None and not breaker.allow():
            raise CircuitOpen("the PostgreSQL store failed repeatedly: calls fail fast "
                              "for the breaker's cool-down")
        try:
            row = self.connection().execute(sql, params).fetchone()
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled) as exc:
            self._drop()
            if breaker is not None:
                breaker.failure()
            raise EngineUnavailable(f"PostgreSQL did not answer: {exc}") from exc
        except psycopg.Error as exc:
            self._drop()
            raise EngineError(f"PostgreSQL refused the call: {exc}") from exc
        if breaker is not None and not breaker.clear:
            breaker.success()
        return row

    def _drop(self) -> None:
        """Forget this thread's connection after a failure (the next call opens one)."""
        conn = self._local.conn
        self._local.conn = None
        if conn is not None and self._local.pid == os.getpid():
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                conn.close()

    def _forked(self) -> None:
        """In a forked child (the lock held): the connections opened so far are the
        parent's, kept aside and never closed here."""
        if self._opened_by != os.getpid():
            self._inherited.extend(self._opened)
            self._opened, self._opened_by = [], os.getpid()

    def close(self) -> None:
        """Close every connection this process opened."""
        with self._lock:
            self._forked()
            opened, self._opened = self._opened, []
        for conn in opened:
            with contextlib.suppress(Exception):
                conn.close()
        self._local.conn = None
