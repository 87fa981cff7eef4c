"""How many processes a replay uses: only CPUs that are idle at this instant."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ratelimits.ops.replay import idle_cpus


def test_a_busy_machine_gets_no_split():
    cpus = len(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)
    ]
    try:
        deadline = time.monotonic() + 10
        seen = []
        while time.monotonic() < deadline:  # until the spinners are scheduled
            seen.append(idle_cpus())
            if seen[-1] == 1:
                break
            time.sleep(0.05)
        assert seen[-1] == 1, seen
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_one_allowed_cpu_is_one_process():
    code = (
        "import os; os.sched_setaffinity(0, {0}); "
        "from ratelimits.ops.replay import idle_cpus; print(idle_cpus())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
