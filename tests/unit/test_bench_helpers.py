"""Bench helpers: process-tree figures count a child wherever in its parent it was started;
peer_client groups requests by how they were paced and reads the server's mean TTFT. `bench`
runs from the source tree, so each check runs as `python -c` there, as `python -m bench` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TREE = """
import os, subprocess, sys, threading
from bench.machine import tree_cpu_seconds, tree_pids

BURN = ("import time, sys\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass\\n"
        "print('done', flush=True)\\nsys.stdin.read()\\n")
started, ready, done = [], threading.Event(), threading.Event()

def start():  # the thread lives on, as an executor's worker does
    started.append(subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True))
    ready.set()
    done.wait()

worker = threading.Thread(target=start)
worker.start()
ready.wait()
child = started[0]
try:
    before = tree_cpu_seconds(os.getpid())
    assert child.stdout.readline().strip() == "done"
    assert child.pid in tree_pids(os.getpid()), tree_pids(os.getpid())
    assert tree_cpu_seconds(os.getpid()) - before >= 0.2  # the child's burn, most of it at least
finally:
    child.kill()
    child.wait()
    done.set()
    worker.join()
print("ok")
"""

PACING = """
from bench.peer_client import pacing

sent = [(10.0, 0.4), (10.015, 0.41), (10.5, 0.1), (11.0, 0.12)]
rows = pacing(sent, slots=2)
assert rows["requests_sent_with_every_slot"] == 2, rows
assert rows["ttft_p50_ms_sent_with_every_slot"] == 405.0, rows
assert rows["ttft_p50_ms_sent_with_fewer"] == 110.0, rows
assert rows["sent_together_p50"] == 1.5, rows
assert pacing(sent[2:], slots=2)["ttft_p50_ms_sent_with_every_slot"] is None
print("ok")
"""

SERVER_TTFT = """
from bench.peer_client import server_ttft_mean_ms
from kvscale.tools.promtext import parse_prometheus_text

def scrape(total_s, count):
    return parse_prometheus_text(
        "# TYPE vllm:time_to_first_token_seconds histogram\\n"
        f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {count}\\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}\\n'
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total_s}\\n')

assert server_ttft_mean_ms(scrape(1.5, 3), scrape(5.5, 8)) == 800.0
assert server_ttft_mean_ms(scrape(1.5, 3), scrape(1.5, 3)) is None  # none served between
assert server_ttft_mean_ms({}, scrape(1.5, 3)) is None  # no such histogram
print("ok")
"""


def _run(code: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "e2e")}  # the harness, as bench finds it
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_child_started_from_a_thread_is_in_the_tree() -> None:
    """Linux lists a child under the thread that forked it, not under the process; a server that
    starts its engine's process from a worker thread still has its CPU counted."""
    _run(TREE)


def test_pacing_groups_requests_sent_together() -> None:
    """peer_client's pacing rows: two requests sent within 20 ms share a slot-full prefill, a
    third sent alone does not; their TTFT p50s are reported apart."""
    _run(PACING)


def test_server_ttft_is_the_histograms_mean_between_scrapes() -> None:
    """peer_client's server-side view: (sum after - sum before) / (count after - count before)."""
    _run(SERVER_TTFT)
