"""``run_operator`` runs a Kopf operator against the local cluster (here a tiny one of our own)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from kvscale_cluster.fixtures import Cluster, run_operator, wait_for

HANDLERS = Path(__file__).with_name("kopf_echo.py")


def test_run_operator_handles_objects(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    args = ["run", "--standalone", "--namespace", namespace, str(HANDLERS)]
    with run_operator(cluster, args) as runner:
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "probe", "labels": {"kvscale.io/echo": "yes"}}}
        )
        wait_for(
            lambda: (
                (
                    core.read_namespaced_config_map("probe", namespace).metadata.annotations or {}
                ).get("kvscale.io/echoed")
                == "probe"
            ),
            30,
            "the operator's annotation on the ConfigMap",
        )
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
    assert "Echoed configmap probe" in runner.output
