"""bench.machine's process-tree figures count a child wherever in its parent it was started."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from bench.machine import tree_cpu_seconds, tree_pids

BURN = "import time, sys\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
    "print('done', flush=True)\nsys.stdin.read()\n"  # fmt: skip


def test_a_child_started_from_a_thread_is_in_the_tree() -> None:
    """Linux lists a child under the thread that forked it, not under the process; a server that
    starts its engine's process from a worker thread still has its CPU counted."""
    started: list[subprocess.Popen[str]] = []
    ready, done = threading.Event(), threading.Event()

    def start() -> None:  # the thread lives on, as an executor's worker does
        started.append(
            subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        )  # fmt: skip
        ready.set()
        done.wait()

    worker = threading.Thread(target=start)
    worker.start()
    ready.wait()
    child = started[0]
    try:
        before = tree_cpu_seconds(os.getpid())
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert child.pid in tree_pids(os.getpid())
        assert tree_cpu_seconds(os.getpid()) - before >= 0.2  # the child's burn, at least most
    finally:
        child.kill()
        child.wait()
        done.set()
        worker.join()
