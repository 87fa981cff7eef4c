"""`ratelimits.celery.limited_task`: one pace for a partner across every Celery worker
process, long waits retried with their countdown, the task's `max_retries` respected.

The slow tests start a real worker as its users do (`celery -A ... worker --concurrency 4
--pool prefork`) with Redis as its broker and the limiter's store on the same private
redis-server; the tasks (tests/support/celery_tasks.py) record each partner call with the
server's time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from django.core.exceptions import ImproperlyConfigured

from ratelimits import Limited
from ratelimits.celery import limited_task
from tests.redis_server import RedisProcess
from tests.support.workers import ROOT, Site

pytestmark = pytest.mark.usefixtures("forget_declarations")


# -- in this process: the task's own retry, as Celery runs it eagerly ----------------------

@pytest.fixture
def app() -> Celery:
    return Celery("tests-eager", set_as_current=False)


@pytest.mark.django_db
def test_a_task_out_of_retries_raises_limited_as_celery_raises_the_retried_exception(app):
    @app.task(bind=True, max_retries=0, name="eager.partner")  # a name of its own each
    @limited_task("eager-partner", rate="1/h", timeout=0)
    def send(self, n):
        return n

    assert send.apply(args=[1]).get() == 1
    refused = send.apply(args=[2])  # no turn for an hour, and no retry left
    assert refused.state == "FAILURE"
    assert isinstance(refused.result, Limited)
    assert refused.result.policy == "eager-partner"
    assert 3500 < refused.result.retry_after < 3601


@pytest.mark.django_db
def test_a_key_function_of_the_arguments_counts_each_tenant_apart(app):
    ran = []

    @app.task(bind=True, max_retries=0, name="eager.tenant")
    @limited_task("eager-tenant", rate="1/h", key=lambda tenant, **_: tenant, timeout=0)
    def send(self, tenant, note=""):
        ran.append(tenant)

    assert send.apply(args=["acme"]).state == "SUCCESS"
    assert send.apply(args=["globex"], kwargs={"note": "x"}).state == "SUCCESS"
    assert send.apply(args=["acme"]).state == "FAILURE"
    assert ran == ["acme", "globex"]


def test_a_task_it_cannot_retry_is_refused_saying_what_to_fix(app):
    @app.task(name="eager.unbound")  # not bound: it has no `self.retry`
    @limited_task("eager-unbound", rate="1/h")
    def send(n):
        return n

    with pytest.raises(ImproperlyConfigured, match="bind=True"):
        send(1)
    with pytest.raises(ImproperlyConfigured, match=r"below @app\.task"):
        limited_task("eager-order", rate="1/h")(send)
    with pytest.raises(ImproperlyConfigured, match="timeout must be a number"):
        limited_task("eager-bad", rate="1/h", timeout=-1)


# -- a real worker: four processes --------------------------------------------------------

class Worker:
    """`celery -A tests.support.celery_app worker --concurrency 4 --pool prefork` on a
    private redis-server (the broker and the results on database 1, the limiter and the
    partner's record on 0: tests/support/celery_settings.py), and a client that sends it
    tasks by name."""

    def __init__(self, tmp: Path) -> None:
        self.server = RedisProcess().start()
        site = Site(tmp, self.server.url, settings="tests.support.celery_settings")
        broker = f"redis://127.0.0.1:{self.server.port}/1"
        self.log = tmp / "worker.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("celery")), "-A",
                 "tests.support.celery_app", "worker", "--concurrency", "4", "--pool",
                 "prefork", "--loglevel", "info"],
                cwd=ROOT, env=site.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.client = Celery("tests-client", broker=broker, backend=broker,
                             set_as_current=False)
        self.store = redis.Redis(port=self.server.port)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while b" ready." not in self.log.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start:\n" + self.tail())
            time.sleep(0.1)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def now(self) -> float:
        """The Redis server's time, the partner's clock."""
        seconds, micros = self.store.time()
        return seconds + micros / 1e6

    def send(self, task: str, *args: object) -> AsyncResult:
        return self.client.send_task(f"tests.support.celery_tasks.{task}", args=args)

    def results(self, sent: list[AsyncResult], timeout: float = 90) -> list[object]:
        """Each task's result; fails, with the worker's log, on any failure."""
        try:
            return [result.get(timeout=timeout) for result in sent]
        except Exception as exc:
            exc.add_note("the worker's log:\n" + self.tail())
            raise

    def calls(self, policy: str) -> list[tuple[float, dict[str, object]]]:
        """The partner's record of `policy`'s calls: (server time, what the task said)."""
        seen = []
        for line in self.store.lrange("partner-calls", 0, -1):
            at, said = line.decode().split(" ", 1)
            fields = json.loads(said)
            if fields["policy"] == policy:
                seen.append((float(at), fields))
        return seen

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.client.close()
        self.server.stop()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    started = Worker(tmp_path_factory.mktemp("celery"))
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.slow
def test_forty_tasks_on_four_processes_keep_the_partners_pace(worker):
    # 5/s with a burst of 1: one call at once, then one every 0.2 s, across all processes
    sent_at = worker.now()
    sent = [worker.send("paced", n) for n in range(40)]
    worker.results(sent)  # none fails
    calls = worker.calls("partner-api")
    assert sorted(fields["argument"] for _, fields in calls) == list(range(40))
    # each wait (three turns ahead at most) was waited in place, within the 2 s timeout
    assert all(fields["retries"] == 0 for _, fields in calls)
    times = sorted(at for at, _ in calls)
    busiest = max(sum(1 for t in times[i:] if t - start < 1.0)
                  for i, start in enumerate(times))
    # the rate plus the burst, in every one-second window: turns 0.2 s apart put 5 in any
    # second, and a call that reaches the partner late (by under 0.2 s) makes it 6 at most
    assert busiest <= 5 + 1, busiest
    assert times[-1] - sent_at >= (40 - 1) / 5  # 7.8 s: paced, not let through at once


@pytest.mark.slow
def test_a_long_wait_is_retried_with_its_countdown_leaving_the_slot_free(worker):
    tenants = ["acme", "globex", "initech", "umbrella"]
    # a turn for each tenant, then a second task each, which meets a 10 s wait (past the
    # task's 1 s timeout): all four processes would be held by those waits
    first = [worker.send("per_tenant", tenant, 1) for tenant in tenants]
    second = [worker.send("per_tenant", tenant, 2) for tenant in tenants]
    worker.results([worker.send("unlimited")])
    # ...but they were retried instead: the task sent after them ran before any came back
    ran = worker.calls("partner-per-tenant")
    assert sorted(fields["argument"][0] for _, fields in ran) == sorted(tenants)

    worker.results(first + second)
    ran = worker.calls("partner-per-tenant")
    for tenant in tenants:
        runs = sorted((fields["retries"], at) for at, fields in ran
                      if fields["argument"][0] == tenant)
        # one retry each: its countdown was the wait, not shorter (a second retry)
        assert [retries for retries, _ in runs] == [0, 1], runs
        # the policy's 10 s between the turns, less what the first run took from its turn
        # to the partner
        assert runs[1][1] - runs[0][1] >= 9, runs


@pytest.mark.slow
def test_a_shadow_policy_lets_every_task_run_at_once(worker):
    # 1/m with a 30 s timeout: enforced, the second task would wait past it and be retried
    # a minute later; in shadow, every task runs without waiting
    sent = [worker.send("watched", n) for n in range(10)]
    worker.results(sent, timeout=25)
    calls = worker.calls("partner-watched")
    assert sorted(fields["argument"] for _, fields in calls) == list(range(10))
    assert all(fields["retries"] == 0 for _, fields in calls)
