"""KEDA (its operator and its metrics adapter, built from the Go module by e2e/keda/build.sh) on
the local cluster, as processes on the host: the baseline kvscale is compared against.

The operator reconciles ScaledObjects into HPAs and serves the scalers' values over gRPC; the
adapter is an aggregated API server for ``external.metrics.k8s.io`` that asks the operator. Both
use the admin kubeconfig. They talk mutual TLS with a certificate the cluster's CA signs (what
KEDA's cert rotation would write into ``/certs``). The API server reaches the adapter as the
front proxy through the ``keda-metrics-apiserver`` Service, which has no selector: its one
EndpointSlice names the host's bridge address (``--enable-aggregator-routing`` resolves it), so
this needs the netns pod network (an endpoint may not be a loopback address).
"""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import process
from .cluster import Cluster
from .kube_api import ApiError, KubeApi, Obj
from .pki import issue_certificate
from .ports import free_port
from .wait import GiveUp, wait_for

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"


@dataclass(frozen=True)
class Keda:
    """KEDA's two running processes, in ``cluster``."""

    operator: process.Component
    adapter: process.Component
    cluster: Cluster

    def alive(self) -> bool:
        return process.alive(self.operator.pid) and process.alive(self.adapter.pid)

    def logs(self, lines: int = 40) -> str:
        return "\n".join(
            f"==> {c.log} <==\n{process.tail(c.log, lines)}" for c in (self.operator, self.adapter)
        )

    def stop(self) -> None:
        """Unregister the external metrics API, then stop both processes. An APIService whose
        server is gone leaves discovery incomplete, and the namespace controller then deletes no
        namespace (the cluster outlives this KEDA: later tests delete theirs)."""
        api = KubeApi(self.cluster.api_url, self.cluster.token, str(self.cluster.ca_path))
        try:
            api.delete(f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}")
        except ApiError as error:
            if error.status != 404:
                raise
        finally:
            api.close()
            for component in (self.adapter, self.operator):
                process.stop(component.pid, grace=10.0)


def _create(api: KubeApi, path: str, body: Obj) -> None:
    """Create ``body`` at ``path`` unless it exists (a second KEDA in the same cluster)."""
    try:
        api.post(path, body)
    except ApiError as error:
        if error.status != 409:
            raise


def _replace(api: KubeApi, collection: str, body: Obj) -> None:
    """Create ``body`` in ``collection``, deleting an object of its name first."""
    try:
        api.delete(f"{collection}/{body['metadata']['name']}")
    except ApiError as error:
        if error.status != 404:
            raise
    api.post(collection, body)


def _install_crds(api: KubeApi, crds: Path) -> None:
    for path in sorted(crds.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                _create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for path in sorted(crds.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]

        def established(name: str = name) -> bool:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = crd.get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 30, f"CRD {name} established")


def _certs(cluster: Cluster, directory: Path) -> Path:
    """``ca.crt``, ``tls.crt`` and ``tls.key`` as KEDA reads them from its ``--cert-dir``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = cluster.ca_path
    shutil.copy(ca, directory / "ca.crt")
    dns = ["localhost", f"keda-operator.{NAMESPACE}.svc", f"{ADAPTER_SERVICE}.{NAMESPACE}.svc"]
    ips = sorted({"127.0.0.1", cluster.host_ip})
    ca_files = (ca, ca.with_name("ca.key"))
    issue_certificate(ca_files, directory / "tls.crt", directory / "tls.key", "keda", [], ips, dns)
    return directory


def _register(api: KubeApi, host: str, port: int, ca: Path) -> None:
    """The adapter's Service (no selector), its EndpointSlice (the host) and the APIService."""
    base = f"/api/v1/namespaces/{NAMESPACE}"
    service_port = {"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}
    _create(
        api,
        f"{base}/services",
        {"metadata": {"name": ADAPTER_SERVICE}, "spec": {"ports": [service_port]}},
    )
    slice_ = {
        "metadata": {
            "name": ADAPTER_SERVICE,
            "labels": {
                "kubernetes.io/service-name": ADAPTER_SERVICE,
                "endpointslice.kubernetes.io/managed-by": "kvscale-cluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    _replace(api, f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", slice_)
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": API_SERVICE},
        "spec": {
            "service": {"namespace": NAMESPACE, "name": ADAPTER_SERVICE, "port": 443},
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "caBundle": base64.b64encode(ca.read_bytes()).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    _replace(api, "/apis/apiregistration.k8s.io/v1/apiservices", api_service)


def start_keda(cluster: Cluster, folder: Path, timeout: float = 120.0) -> Keda:
    """Install KEDA's CRDs, start its operator and adapter, register the external metrics API
    and wait until the API server answers it; stop what started on failure."""
    if cluster.state.network != "netns":
        raise RuntimeError("KEDA's adapter needs the netns pod network (a routable host address)")
    api = KubeApi(cluster.api_url, cluster.token, str(cluster.ca_path))
    work = cluster.directory / "keda"
    certs = _certs(cluster, work / "certs")
    _install_crds(api, folder / "crds")
    _create(api, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        "WATCH_NAMESPACE": "",
    }
    grpc_port, probe_port, adapter_port = free_port(), free_port(), free_port(cluster.host_ip)
    operator = process.start(
        "keda-operator",
        [
            str(folder / "keda-operator"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
            f"--cert-dir={certs}",
            f"--ca-dir={certs}",
            "--enable-cert-rotation=false",
            "--zap-log-level=info",
        ],
        cluster.logs_dir,
        env=env,
    )
    kubeconfig = str(cluster.kubeconfig)
    adapter = process.start(
        "keda-adapter",
        [
            str(folder / "keda-adapter"),
            f"--bind-address={cluster.host_ip}",
            f"--secure-port={adapter_port}",
            f"--port={free_port()}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--client-ca-file={certs / 'ca.crt'}",
            f"--metrics-service-address=127.0.0.1:{grpc_port}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
        ],
        cluster.logs_dir,
        env=env,
    )
    keda = Keda(operator, adapter, cluster)
    try:
        _register(api, cluster.host_ip, adapter_port, certs / "ca.crt")

        def answers() -> bool:
            if not keda.alive():
                raise GiveUp(f"KEDA exited during start-up:\n{keda.logs()}")
            return bool(api.get(EXTERNAL_METRICS).get("resources") is not None)

        wait_for(answers, timeout, f"{EXTERNAL_METRICS} through the aggregation layer", 1.0)
    except BaseException:
        keda.stop()
        raise
    finally:
        api.close()
    return keda
