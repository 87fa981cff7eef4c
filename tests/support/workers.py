"""Real gunicorn workers on a private redis-server, for the multi-process tests.

`Site` migrates a file SQLite database, runs code in a process of the site (to save
policies as an operator would), starts `gunicorn -w N` and sends requests whose answer
names the worker's pid (tests/support/workers_settings.py).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


_WSGI = "django.core.wsgi:get_wsgi_application()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listened_on(port: int) -> bool:
    """Whether a socket listens on `port` (a bind with SO_REUSEADDR fails only then)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


class Site:
    """A site on `redis_url` whose settings are `settings` (the multi-process tests' own
    by default; `tests.servers.project.settings` is a project as the README sets one up).
    With `probe` None the server is ready when it accepts a connection, so the first
    request a test sends is the first the site serves."""

    def __init__(self, tmp: Path, redis_url: str, settings: str = "tests.support.workers_settings",
                 probe: str | None = "/free/") -> None:
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings,
            "WORKERS_DB": str(tmp / "site.sqlite3"),
            "WORKERS_REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
        }
        self.port = _free_port()
        self.probe = probe
        self.server: subprocess.Popen[bytes] | None = None
        self.run("from django.core.management import call_command\n"
                 "call_command('migrate', verbosity=0)")

    def run(self, code: str) -> None:
        """Run `code` in a process of the site (Django set up), as an operator's shell."""
        subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code],
                       cwd=ROOT, env=self.env, check=True, timeout=60)

    def policy(self, **fields: object) -> None:
        self.run("from ratelimits.models import Policy\n"
                 f"p = Policy(**{fields!r})\np.full_clean()\np.save()")

    def only_policy_on(self, path: str) -> Callable[[dict[str, Any] | None], None]:
        """A function that replaces every policy with one of the given fields on `path`
        (None: no policy), under a new name each time (a new adaptive limiter, starting
        from its floor), and returns once a one-process server applies it."""
        runs = itertools.count()

        def apply(fields: dict[str, Any] | None) -> None:
            code = "from ratelimits.models import Policy\nPolicy.objects.all().delete()\n"
            name = None
            if fields is not None:
                name = f"only-{next(runs)}"
                policy = {"name": name, "mode": "enforce", "key": "global",
                          "path": path, "period": 60, **fields}
                code += f"p = Policy(**{policy!r})\np.full_clean()\np.save()\n"
            self.run(code)
            # a process reads the policy version at most once a second, and a request that
            # learns a new one loads the policy for those after it: ask until an answer
            # names the policy in effect, so that a burst arriving meanwhile (which would
            # go on with the snapshot it has) is not what a test measures
            self.wait_for_policy(path, name)

        return apply

    def policy_in_effect(self, path: str) -> str | None:
        """The name of the policy whose `RateLimit-Policy` header an answer on `path`
        carries (None: no header, no policy enforced there)."""
        _, headers, _ = self.send("GET", path)
        field = headers.get("ratelimit-policy")
        return None if field is None else field.split(";", 1)[0].strip('"')

    def wait_for_policy(self, path: str, name: str | None, timeout: float = 10.0) -> None:
        """Return once an answer on `path` names the policy `name` (None: none)."""
        deadline = time.monotonic() + timeout
        while (seen := self.policy_in_effect(path)) != name:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path}: policy {seen!r} still in effect, not {name!r}")
            time.sleep(0.05)

    def start(self, workers: int, threads: int = 1, app: str = _WSGI, *extra: str) -> None:
        """`gunicorn -w workers`; with `threads` > 1, each worker serves that many
        requests at once (the gthread worker)."""
        if threads > 1:
            extra = ("-k", "gthread", "--threads", str(threads), *extra)
        self._serve([sys.executable, "-m", "gunicorn", app,
                     "-w", str(workers), "-b", f"127.0.0.1:{self.port}",
                     "--log-level", "warning", *extra])

    def start_asgi(self, app: str = "django.core.asgi:get_asgi_application",
                   *extra: str) -> None:
        """uvicorn serving the site's ASGI application (`--factory` for a function)."""
        factory = ["--factory"] if app.endswith("_application") else []
        self._serve([sys.executable, "-m", "uvicorn", *factory, app, "--host", "127.0.0.1",
                     "--port", str(self.port), "--log-level", "warning", *extra])

    def start_uwsgi(self, module: str, processes: int) -> None:
        """uWSGI with `--lazy-apps`: each worker imports the application after the fork."""
        uwsgi = str(Path(sys.executable).with_name("uwsgi"))
        self._serve([uwsgi, "--master", "--lazy-apps", "--http-socket",
                     f"127.0.0.1:{self.port}", "--module", module, "--processes",
                     str(processes), "--die-on-term", "--disable-logging",
                     "--need-app"])

    def _serve(self, command: list[str]) -> None:
        self.server = subprocess.Popen(
            command, cwd=ROOT, env=self.env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        # read as it comes: a server whose workers log (a warning per refusal) would
        # otherwise fill the pipe and block on it, mid-request
        stream, chunks = self.server.stderr, []
        self._stderr: list[bytes] = chunks
        self._draining = threading.Thread(target=lambda: chunks.extend(
            iter(lambda: stream.read1(65536), b"")), daemon=True)  # type: ignore[union-attr]
        self._draining.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.probe is None:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                else:
                    self.get(self.probe)
                if self.server.poll() is not None:  # what answered was not this server
                    raise RuntimeError("the server exited as it started: " + self.errors())
                return
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    why = "timeout" if self.server.poll() is None else self.errors()
                    raise RuntimeError(f"the server did not start: {why}") from None
                time.sleep(0.1)

    def send(self, method: str, path: str, form: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], str]:
        """(status, headers with lower-case names, body) of one request on a new
        connection; `form` is sent url-encoded, as a browser posts a form."""
        headers, body = {}, None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)  # a loaded machine
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            named = {k.lower(): v for k, v in response.getheaders()}
            return response.status, named, response.read().decode()
        except ConnectionError as exc:
            exc.add_note(self._state())
            raise
        finally:
            conn.close()

    def _state(self) -> str:
        """What the server is doing, for a request that lost its connection."""
        if self.server is None:
            return "no server was started"
        code = self.server.poll()
        if code is None:
            return f"the server (pid {self.server.pid}) is still running"
        return f"the server exited with {code}: {self.errors()[-2000:]}"

    def errors(self) -> str:
        """What the server wrote to stderr: so far while it runs, all of it once it has
        exited (`stop()`)."""
        if self.server is None:
            return ""
        if self.server.poll() is not None:
            self._draining.join(10)
        return b"".join(self._stderr).decode(errors="replace")

    def text(self, path: str) -> tuple[int, str]:
        """(status, body) of one request on a new connection."""
        status, _, body = self.send("GET", path)
        return status, body

    def get(self, path: str) -> tuple[int, int]:
        """(status, the answering worker's pid) of one request on a new connection."""
        status, pid, _ = self.fetch(path)
        return status, pid

    def fetch(self, path: str) -> tuple[int, int, dict[str, str]]:
        """`get()` with the response's headers (names in lower case)."""
        status, headers, body = self.send("GET", path)
        return status, int(body), headers

    def load(self, path: str, n: int, threads: int = 6) -> list[tuple[float, int, int]]:
        """`n` requests from `threads` clients at once: (time sent, status, pid) each."""
        def one(_: int) -> tuple[float, int, int]:
            sent = time.monotonic()
            return (sent, *self.get(path))

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(n)))

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        if self.server is not None:
            self._wait_port_released(self.server.pid)

    def _wait_port_released(self, group: int) -> None:
        """Return once no process listens on the site's port. A worker can outlive its
        server's main process for a moment, still holding the listening socket; a server
        started again on the port would then fail to bind while the old worker accepted,
        and reset, the next test's requests."""
        killed = False
        deadline = time.monotonic() + 10
        while _listened_on(self.port):
            if time.monotonic() > deadline:
                if killed:
                    raise RuntimeError(f"port {self.port} is still taken after the server "
                                       "and its process group were killed")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                killed, deadline = True, time.monotonic() + 10
            time.sleep(0.05)


#: The project a server test serves, as its deployment names it to the server (its
#: settings come from the site's DJANGO_SETTINGS_MODULE, which these modules keep).
PROJECT_WSGI = "tests.servers.project.wsgi"
PROJECT_ASGI = "tests.servers.project.asgi:application"

#: How a test starts a site under each server, by the name its parameter shows: several
#: processes, each serving several requests at once where the server can, so a burst has
#: more requests in flight than a limit of 3 admits and a race between them would show
#: (four sync workers: three would hold no more than such a limit does).
SERVERS: dict[str, Callable[[Site], None]] = {
    "gunicorn-sync": lambda site: site.start(4, 1, PROJECT_WSGI),
    "gunicorn-gthread": lambda site: site.start(2, 8, PROJECT_WSGI),
    # the tests connect from 127.0.0.1, which uvicorn trusts as a proxy by default: they
    # are clients, and what they write in X-Forwarded-For is theirs to make up
    "uvicorn": lambda site: site.start_asgi(PROJECT_ASGI, "--workers", "2",
                                            "--no-proxy-headers"),
    "uwsgi-lazy-apps": lambda site: site.start_uwsgi(f"{PROJECT_WSGI}:application", 2),
}
