"""kvscale against KEDA + the HPA on the same local cluster: a short version of
`python -m bench cluster_vs_keda` (e2e/kvscale_demo/versus.py), KEDA started once for the module.

What must hold whatever the machine's speed: the external metrics API answers through the
aggregation layer; kvscale fails no request it accepted, scale-in included (a busy machine may
make the engines refuse some of the burst at admission: 429s, counted); KEDA's run scales up
under the burst and back down after, and its scale-in failures are counted and reported (they
may be 0: the engine drains on SIGTERM), never hidden.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kvscale_cluster.binaries import keda_dir
from kvscale_cluster.fixtures import Cluster, kubectl
from kvscale_cluster.keda import EXTERNAL_METRICS, Keda, start_keda
from kvscale_cluster.kube_api import KubeApi
from kvscale_demo import versus
from kvscale_demo.figures import measure

# the burst is 12x the steady rate: one replica is declared to carry 150 tokens/s (kvscale) and
# the queue grows past KEDA's per-replica target on one CPU replica
PHASES = (versus.Phase("steady", 0.5, 10), versus.Phase("burst", 6.0, 45))
QUIET = versus.Phase("quiet", 0.5, 10)
SETTLE_S = 120


@pytest.fixture(scope="module")
def keda(cluster: Cluster) -> Iterator[Keda]:
    started = start_keda(cluster, keda_dir())
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def kube_api(cluster: Cluster) -> Iterator[KubeApi]:
    api = KubeApi(cluster.api_url, cluster.token, str(cluster.ca_path))
    try:
        yield api
    finally:
        api.close()


def _report(name: str, figures: dict[str, Any]) -> None:
    sys.stderr.write(f"\n{name}: {json.dumps(figures)}\n")


def test_external_metrics_answer_through_aggregation(cluster: Cluster, keda: Keda) -> None:
    done = kubectl(cluster, "get", "--raw", EXTERNAL_METRICS)
    assert json.loads(done.stdout)["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    path = "jsonpath={.status.conditions[?(@.type=='Available')].status}"
    available = kubectl(cluster, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", path)
    assert available.stdout == "True"


def test_kvscale_fails_no_request_while_scaling(
    cluster: Cluster, operator: Any, kube_api: KubeApi, namespace: str
) -> None:
    url = versus.deploy_kvscale(kube_api, namespace, versus.endpoint_spec())
    run = versus.replay(kube_api, namespace, url, "kvscale", (*PHASES, QUIET), SETTLE_S)
    figures = measure(run)
    _report("kvscale", figures)
    assert figures["max_replicas"] >= 2, figures
    assert figures["scale_in_windows"] >= 1, figures
    # every request kvscale accepted completed, through the scale-up and the drains; a busy
    # machine may make the engines refuse some of the burst at admission (429 + Retry-After,
    # back-pressure the clients retry), which is counted and printed, not an error
    assert figures["failed"] == figures["refused"], figures
    assert figures["failed_in_scale_in"] <= figures["refused"], figures


def test_keda_scales_up_and_down_and_its_scale_in_is_counted(
    cluster: Cluster, keda: Keda, kube_api: KubeApi, namespace: str
) -> None:
    url = versus.deploy_plain(kube_api, namespace, versus.endpoint_spec())
    # the queue KEDA scales on only grows where the burst exceeds what one replica serves: the
    # phases are scaled to this machine (the burst is 1.5x one replica's measured capacity)
    capacity = versus.calibrate(url).requests_per_s
    phases = versus.scaled((*PHASES, QUIET), capacity)
    tuning = versus.KedaTuning(threshold=2)
    versus.add_scaled_object(kube_api, cluster, namespace, tuning)
    run = versus.replay(kube_api, namespace, url, "keda", phases, SETTLE_S)
    figures = measure(run)
    _report("keda", {"capacity_rps": round(capacity, 2), **figures})
    assert figures["max_replicas"] >= 2, figures
    assert figures["final_replicas"] == versus.MIN_REPLICAS, figures
    # counted, not asserted to be zero: every failure that ended in a scale-in window
    assert figures["scale_in_windows"] >= 1, figures
    assert 0 <= figures["failed_in_scale_in"] <= figures["failed"], figures
    assert keda.alive(), keda.logs()
