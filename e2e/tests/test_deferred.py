"""Deferrable work on the local cluster: a batch burst fills the valley instead of buying replicas,
unless its deadline requires them (issue 21's cluster target).

The operator runs in this process against the cluster, with real engine pods and the router;
clients use the plain OpenAI API through the endpoint's Service, the batch requests with the
class header. The decision is arithmetic, not this machine's speed: a batch request costs exactly
`PROMPT + MAX_TOKENS` tokens as the router counts them (the prompt is token ids), and the law
sizes with the spec's `replicaCapacityTokensPerSecond` (`CAPACITY`) until it learns; the quiet
chat before the burst carries well under that, so nothing it learns lowers the estimate. The
router's spare budget (the operator's tokenBudgets: CAPACITY x the 2 s TTFT target) holds one
batch request at a time, so the burst stays queued for more than a capacity interval even on a
machine several times faster than the one it was sized on (a request there took 0.3 s), and the
first decision that sees it sizes with the prior. The burst is `BURST` tokens: due within the
600 s bucket of the generous deadline it asks BURST / 600 = 18 tokens/s, which spare capacity
carries; due within the 60 s bucket of the tight one it asks up to BURST / 60 = 180 tokens/s,
which with the chat's demand and headroom is more than one replica carries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from test_autoscale import apply, endpoint, serving, status

from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, wait_for
from kvscale_cluster.wait import GiveUp
from kvscale_demo.load import Load, p99

MODEL = "tiny"
CLASS_HEADER = "x-kvscale-class"
PROMPT = 8  # token ids: counted exactly by the router
MAX_TOKENS = 64
REQUESTS = 150
BURST = REQUESTS * (PROMPT + MAX_TOKENS)  # 10800 tokens
CAPACITY = 60  # tokens/s per replica, the spec's prior; a budget of 120 tokens at the SLO
CHAT_RATE = 0.25  # requests/s of ~50 tokens (the engine's count): ~15 tokens/s
CHAT_TOKENS = 8
GENEROUS_S = 600  # BURST / 600 = 18 tokens/s: 1.2 x (15 + 18) < CAPACITY
# due within the 60 s bucket: what is left of BURST / 60 = 180 tokens/s, with the chat's 15 and
# the headroom, > CAPACITY;
# the router releases a request regardless once its deadline nears (here after about 27 s)
TIGHT_S = 45
# the tight burst is three times as long: a quiet fast machine drained 150 requests, one budget at a
# time, within one capacity interval (15 requests/s), before the law saw a backlog
TIGHT_REQUESTS = 3 * REQUESTS
INTERVAL = 10


def deferrable(deadline_s: int) -> dict[str, Any]:
    classes = [
        {"name": "chat", "priority": 10},
        {"name": "batch", "deadlineSeconds": deadline_s},
    ]
    scaling = {"replicaCapacityTokensPerSecond": CAPACITY, "maxReplicas": 2}
    body: dict[str, Any] = endpoint("", trafficClasses=classes, scaling=scaling)
    return body


@dataclass(frozen=True)
class Done:
    started: float
    ended: float
    error: str | None


def one_batch_request(url: str, n: int, deadline_s: int) -> Done:
    client = openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=deadline_s + 60,
        default_headers={CLASS_HEADER: "batch"},
    )  # fmt: skip
    started, error = time.monotonic(), None
    try:
        done = client.completions.create(
            model=MODEL,
            prompt=[(n * 7 + i) % 200 + 10 for i in range(PROMPT)],
            max_tokens=MAX_TOKENS,
            extra_body={"ignore_eos": True},
        )
        if done.usage is None or done.usage.completion_tokens != MAX_TOKENS:
            error = f"incomplete answer: {done.usage}"
    except openai.APIError as err:
        error = f"{type(err).__name__}: {err}"
    return Done(started, time.monotonic(), error)


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as executor:
        yield executor


def burst(
    pool: concurrent.futures.ThreadPoolExecutor, url: str, deadline_s: int, requests: int = REQUESTS
) -> list[concurrent.futures.Future[Done]]:
    """The batch requests at once (past the pool's REQUESTS threads, each sent as one ends), each
    with a client timeout past its deadline."""
    return [pool.submit(one_batch_request, url, n, deadline_s) for n in range(requests)]


def batch_status(api: Kube, namespace: str) -> dict[str, Any]:
    classes = status(api, namespace).get("trafficClasses") or []
    return next((c for c in classes if c["name"] == "batch"), {})


def capacity_ticks(api: Kube, namespace: str, seen: set[str]) -> int:
    """Records this capacity decision's time; returns how many distinct ones were seen."""
    updated = (status(api, namespace).get("capacity") or {}).get("updatedAt")
    if updated:
        seen.add(updated)
    return len(seen)


@contextlib.contextmanager
def quiet_chat(
    cluster: Cluster, api: Kube, namespace: str, deadline_s: int
) -> Iterator[tuple[str, Load]]:
    """The endpoint with a batch class of `deadline_s`, serving the quiet chat on one replica
    once the law has measured its demand; yields the Service URL and the chat's load."""
    apply(cluster, namespace, deferrable(deadline_s))
    url = serving(api, namespace, ready=1)
    with Load(url, MODEL, max_tokens=CHAT_TOKENS) as chat:
        chat.set_rate(CHAT_RATE)
        wait_for(
            lambda: (status(api, namespace).get("capacity") or {}).get("demandTokensPerSecond"),
            timeout=120,
            what="a first demand measurement",
        )
        yield url, chat


def test_a_far_deadline_burst_fills_the_valley_without_a_replica(
    cluster: Cluster,
    operator: Any,
    api: Kube,
    namespace: str,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    with quiet_chat(cluster, api, namespace, GENEROUS_S) as (url, chat):
        started = time.monotonic()
        futures = burst(pool, url, GENEROUS_S)
        ticks: set[str] = set()

        def absorbed() -> bool:
            st = status(api, namespace)
            engine = api.get("apps/v1", "Deployment", namespace, "chat-engine") or {}
            if st.get("desiredReplicas") != 1 or engine.get("spec", {}).get("replicas") != 1:
                raise GiveUp(f"scaled up for the burst: {st.get('decisions')}")
            # served, and the law decided at least twice more with the backlog in its window
            return all(f.done() for f in futures) and capacity_ticks(api, namespace, ticks) >= 3

        wait_for(absorbed, timeout=GENEROUS_S, what="the burst served on the one replica")
        served = [f.result() for f in futures]
        ttfts = [r.ttft_s for r in chat.since(started) if r.ttft_s is not None]
    assert not [d.error for d in served if d.error], [d.error for d in served if d.error][:3]
    assert max(d.ended - d.started for d in served) < GENEROUS_S
    assert len(ttfts) >= 5 and p99(ttfts) <= 2.0, f"chat p99 TTFT {p99(ttfts):.2f} s"
    assert not chat.failures(), chat.failures()[:3]
    ups = [d for d in status(api, namespace).get("decisions") or [] if d["toReplicas"] > 1]
    assert not ups, ups
    # the routers counted the burst as met deadlines, served into spare capacity
    batch = wait_for(
        lambda: (b := batch_status(api, namespace)).get("deadlineMet", 0) >= 1 and b,
        timeout=4 * INTERVAL,
        what="status.trafficClasses to count met deadlines",
    )
    assert batch["deadlineMissed"] < 1 and batch["valleyTokens"] > 0, batch


def test_the_same_burst_with_a_tight_deadline_adds_a_replica(
    cluster: Cluster,
    operator: Any,
    api: Kube,
    namespace: str,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    with quiet_chat(cluster, api, namespace, TIGHT_S) as (url, _):
        assert status(api, namespace)["desiredReplicas"] == 1
        futures = burst(pool, url, TIGHT_S, TIGHT_REQUESTS)

        def scaled_up() -> dict[str, Any] | None:
            st = status(api, namespace)
            return st if int(st.get("desiredReplicas", 1)) >= 2 else None

        st = wait_for(scaled_up, timeout=4 * INTERVAL, what="a replica for the deadlines")
        up = next(d for d in st["decisions"] if d["toReplicas"] > d["fromReplicas"])
        assert up["reason"] == "DeadlinesRequire", st["decisions"]
        assert "deferred work due at" in up["message"], up
        wait_for(
            lambda: engine_replicas(api, namespace) >= 2,
            timeout=2 * INTERVAL,
            what="the engine Deployment at 2 replicas",
        )
        concurrent.futures.wait(futures, timeout=TIGHT_S + 60)


def engine_replicas(api: Kube, namespace: str) -> int:
    engine = api.get("apps/v1", "Deployment", namespace, "chat-engine") or {}
    return int(engine.get("spec", {}).get("replicas") or 0)
