"""Both engines are safe to share between threads: one key, many threads, exact limits."""

from __future__ import annotations

import sys
import threading

import pytest

from ratelimits.engine import Limit
from tests.engine.conftest import T0

THREADS = 8
TRIES = 60  # per thread: 480 attempts against a limit of 100


@pytest.fixture
def fast_switching():
    """Switch threads as often as the interpreter allows, so races get their chance."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("algorithm", ["sliding_log", "fixed_window"])
def test_threads_sharing_one_key_admit_exactly_the_limit(engine, algorithm, fast_switching):
    limit = Limit("shared", algorithm, 100, 3600, name="threads")
    admitted = [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(i: int) -> None:
        start.wait()
        for _ in range(TRIES):
            if engine.evaluate([limit], now=T0).allowed:
                admitted[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 100
    assert engine.counters("threads", int(T0 // 60)) == {"a": 100, "r": THREADS * TRIES - 100}
