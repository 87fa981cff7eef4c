"""The PostgreSQL engine behind PgBouncer in transaction mode, as many Django sites reach
their database: each statement may run on another server connection, so nothing may
rely on the session (a statement prepared on the server, a setting made for it).

Debian's `pgbouncer` (`make test` installs it) runs in front of the machine's PostgreSQL
with a pool smaller than the engine's threads, so that calls change server connections.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ratelimits.engine import Limit
from ratelimits.engine.postgres import PostgresEngine
from tests.engine.conftest import T0
from tests.engine.test_postgres_workers import LIMIT, race_at_one_instant
from tests.redis_server import free_port

pytestmark = pytest.mark.slow

PGBOUNCER = os.environ.get("PGBOUNCER", "/usr/sbin/pgbouncer")
#: Server connections in the pool: fewer than the threads below, so they are shared.
POOL = 3
THREADS = 8


def _config(directory: Path, port: int, server: str) -> Path:
    info = psycopg.conninfo.conninfo_to_dict(server)
    ini = directory / "pgbouncer.ini"
    ini.write_text(f"""\
[databases]
* = host={info.get("host", "127.0.0.1")} port={info.get("port", 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = transaction
default_pool_size = {POOL}
max_client_conn = 200
logfile = {directory / "pgbouncer.log"}
""")
    (directory / "users.txt").write_text(f'"{info.get("user", "postgres")}" ""\n')
    return ini


@pytest.fixture(scope="module")
def pgbouncer(postgres_server: str) -> Iterator[str]:
    """A pgbouncer of this module's own in transaction mode in front of the run's
    database; the URL that reaches the database through it. Fails (never skips) when
    pgbouncer is not installed."""
    if not Path(PGBOUNCER).exists():
        pytest.fail(f"{PGBOUNCER} is missing: apt-get install pgbouncer (make test does), "
                    "or set PGBOUNCER to its path")
    directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    directory.chmod(0o777)  # pgbouncer refuses to run as root: it runs as `postgres`
    port = free_port()
    ini = _config(directory, port, postgres_server)
    for path in directory.iterdir():
        path.chmod(0o666)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    errors = (directory / "stderr").open("w")
    proc = subprocess.Popen([PGBOUNCER, *user, str(ini)], stdout=subprocess.DEVNULL,
                            stderr=errors)
    url = f"postgresql://{postgres_server.split('://', 1)[1].split('@', 1)[0]}@127.0.0.1:" \
          f"{port}/{postgres_server.rsplit('/', 1)[1]}"
    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                said = "".join(path.read_text()[-2000:] for path in
                               (directory / "stderr", directory / "pgbouncer.log")
                               if path.exists())
                raise RuntimeError(f"pgbouncer did not start: {said}") from None
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        errors.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_calls_from_many_threads_never_meet_a_missing_statement(pgbouncer, postgres_url):
    """Thousands of calls over a pool of three server connections: every one decided,
    none refused for a statement that another server connection prepared (psycopg
    prepares a statement it ran five times, unless told not to)."""
    engine = PostgresEngine(pgbouncer, timeout=10)
    failures: Counter[str] = Counter()
    admitted: list[int] = []

    def calls(thread: int) -> None:
        mine = 0
        for n in range(150):
            try:
                mine += engine.evaluate([Limit(f"t{thread}", "sliding_window", 100, 3600,
                                               name="pooled")], now=T0 + n / 1000).allowed
            except Exception as exc:  # counted: the assertion says what went wrong
                failures[f"{type(exc).__name__}: {exc}"[:160]] += 1
        admitted.append(mine)

    threads = [threading.Thread(target=calls, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.close()
    assert not failures, failures.most_common(3)
    assert admitted == [100] * THREADS  # each thread's client: exactly its limit


@pytest.mark.parametrize("algorithm", ["fixed_window", "gcra"])
def test_racing_processes_through_the_pool_admit_exactly_the_limit(pgbouncer, postgres_url,
                                                                  algorithm):
    assert race_at_one_instant(pgbouncer, algorithm) == LIMIT


def test_the_sites_own_queries_keep_their_settings(pgbouncer, postgres_url):
    """The limiter sets nothing on a session: a server connection it used goes back to
    the pool as it came, so the site's queries through the same pool are not cut at the
    limiter's timeout nor moved to another isolation level."""
    with psycopg.connect(postgres_url) as direct:
        defaults = direct.execute("SELECT current_setting('statement_timeout'), "
                                  "current_setting('default_transaction_isolation'), "
                                  "current_setting('lock_timeout')").fetchone()
    engine = PostgresEngine(pgbouncer, timeout=5)  # a busy machine's calls, all answered
    threads = [threading.Thread(target=lambda t=t: [
        engine.evaluate([Limit(f"s{t}", "fixed_window", 10, 60, name="settings")], now=T0)
        for _ in range(20)]) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.close()
    seen = set()
    with psycopg.connect(pgbouncer, autocommit=True, prepare_threshold=None) as site:
        for _ in range(30):  # statements land on every server connection of the pool
            seen.add(site.execute("SELECT current_setting('statement_timeout'), "
                                  "current_setting('default_transaction_isolation'), "
                                  "current_setting('lock_timeout')").fetchone())
    assert seen == {defaults}
