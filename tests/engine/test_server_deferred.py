"""A deferrable class on a real engine server: its requests run below every interactive class,
an interactive arrival preempts them, the preemptions are counted by the victim's class, and the
preempted requests' greedy outputs are the same as when they ran alone."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_fixtures import MODEL, LiveServer, live_server

from kvscale_cluster.wait import wait_for

# the batch class's priority number is the higher one, yet it is deferrable: it ranks below chat
CLASSES = json.dumps([
    {"name": "chat", "priority": 0},
    {"name": "batch", "priority": 100, "deadlineSeconds": 3600, "maxQueueWaitSeconds": 3600},
])  # fmt: skip
LABELS = 'engine="0",model_name="tiny-llama"'


@pytest.fixture(scope="module")
def server(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # two sequences at once: two deferred requests fill the batch
    args = ("--traffic-classes", CLASSES, "--max-num-seqs", "2", "--max-concurrency", "8")
    with live_server(llama_dir, tmp_path_factory.mktemp("deferred"), *args) as live:
        yield live


def complete(server: LiveServer, cls: str, prompt: str, max_tokens: int) -> str:
    api = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=300,
                        default_headers={"x-kvscale-class": cls})  # fmt: skip
    stream = api.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                    temperature=0, stream=True,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    return "".join(chunk.choices[0].text for chunk in stream)


def preemptions(server: LiveServer, cls: str) -> float:
    deferrable = "true" if cls == "batch" else "false"
    labels = f'deferrable="{deferrable}",{LABELS},traffic_class="{cls}"'
    return server.metrics()[f"kvscale_engine_preemptions_total{{{labels}}}"]


def test_an_interactive_arrival_preempts_deferred_work_and_outputs_stay_greedy(
    server: LiveServer,
) -> None:
    prompts = ["A long report about paged attention", "A long summary of batch scheduling"]
    alone = [complete(server, "batch", p, 480) for p in prompts]
    assert preemptions(server, "batch") == 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        batch = [pool.submit(complete, server, "batch", p, 480) for p in prompts]
        running = f"vllm:num_requests_running{{{LABELS}}}"
        wait_for(lambda: server.metrics()[running] == 2, 60, "both deferred requests to run")
        answer = complete(server, "chat", "Quick question", 4)
        assert not all(f.done() for f in batch)  # chat did not wait for the deferred work
        assert [f.result(timeout=300) for f in batch] == alone
    assert answer
    assert preemptions(server, "batch") >= 1 and preemptions(server, "chat") == 0
