"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes.

Flags are the minimum a real cluster needs: RBAC, token authentication for clients, a
service-account issuer (TokenRequest works), ``--endpoint-reconciler-type=none`` because the
API server's address is not publishable as a Service endpoint, and leader election off.

The API server keeps an audit log (``audit/audit.log`` in the cluster's directory) of the list
and watch requests for the kinds kvscale's operator watches, so a test can see which label
selectors reach the server; listing Deployments also records the response (what a client was
given). Nothing else is audited, and the log rotates at 20 MB, one backup.
"""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from . import process
from .pki import FRONT_PROXY_CN, Pki
from .ports import free_port
from .wait import GiveUp, wait_for

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    verbs: [list]
    resources:
      - group: apps
        resources: [deployments]
  - level: Metadata
    verbs: [list, watch]
    resources:
      - group: apps
        resources: [deployments]
      - group: ""
        resources: [services, pods]
      - group: policy
        resources: [poddisruptionbudgets]
  - level: None
"""

ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "root-ca-certificate-publisher-controller",
    "disruption-controller",
    "horizontal-pod-autoscaler-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
)


@dataclass(frozen=True)
class Endpoints:
    """Addresses the control plane listens on."""

    etcd_url: str
    api_url: str
    controller_manager_port: int
    scheduler_port: int
    service_cidr: str


def _get(url: str, token: str | None = None, ca: Path | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _wait_healthy(
    component: process.Component,
    url: str,
    timeout: float,
    token: str | None = None,
    ca: Path | None = None,
) -> None:
    """Wait until ``url`` answers 200; give up at once if ``component`` exits."""

    def healthy() -> bool:
        if not process.alive(component.pid):
            log = process.tail(component.log)
            raise GiveUp(f"{component.name} exited during start-up; its log ends:\n{log}")
        return _get(url, token, ca)

    wait_for(healthy, timeout, f"{component.name} {urlsplit(url).path}")


def allocate(api_host: str, service_cidr: str) -> Endpoints:
    return Endpoints(
        service_cidr=service_cidr,
        etcd_url=f"http://127.0.0.1:{free_port()}",
        api_url=f"https://{api_host}:{free_port(api_host)}",
        controller_manager_port=free_port(),
        scheduler_port=free_port(),
    )


def start_etcd(bin_dir: Path, data: Path, logs: Path, ep: Endpoints) -> process.Component:
    peer = f"http://127.0.0.1:{free_port()}"
    argv = [
        str(bin_dir / "etcd"),
        f"--data-dir={data}",
        f"--listen-client-urls={ep.etcd_url}",
        f"--advertise-client-urls={ep.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
        "--quota-backend-bytes=2147483648",
    ]
    etcd = process.start("etcd", argv, logs)
    _wait_healthy(etcd, f"{ep.etcd_url}/health", 30)
    return etcd


def audit_log(work: Path) -> Path:
    """The API server's audit log of a cluster started in ``work`` (JSON, one event a line)."""
    return work / "audit" / "audit.log"


def start_apiserver(
    bin_dir: Path, pki: Pki, work: Path, logs: Path, ep: Endpoints, advertise: str
) -> process.Component:
    host, port = ep.api_url.removeprefix("https://").rsplit(":", 1)
    policy = audit_log(work).parent / "policy.yaml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY)
    argv = [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={ep.etcd_url}",
        f"--bind-address={host}",
        f"--secure-port={port}",
        f"--advertise-address={advertise}",
        "--endpoint-reconciler-type=none",
        "--authorization-mode=RBAC",
        f"--token-auth-file={pki.token_file}",
        f"--client-ca-file={pki.ca_cert}",
        f"--requestheader-client-ca-file={pki.ca_cert}",
        # the aggregation layer (KEDA's external metrics API): the API server proxies to an
        # APIService's Service as the front proxy, straight to its endpoint (the host's address)
        f"--requestheader-allowed-names={FRONT_PROXY_CN}",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--proxy-client-cert-file={pki.proxy_client_cert}",
        f"--proxy-client-key-file={pki.proxy_client_key}",
        "--enable-aggregator-routing=true",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--api-audiences={ISSUER}",
        f"--service-cluster-ip-range={ep.service_cidr}",
        f"--cert-dir={work / 'apiserver-certs'}",
        "--allow-privileged=true",
        # kubectl logs: the process kubelet serves them on the node's InternalIP
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        f"--kubelet-client-certificate={pki.kubelet_client_cert}",
        f"--kubelet-client-key={pki.kubelet_client_key}",
        "--profiling=false",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log(work)}",
        "--audit-log-format=json",
        "--audit-log-maxsize=20",
        "--audit-log-maxbackup=1",
        "--v=1",
    ]
    apiserver = process.start("kube-apiserver", argv, logs)
    _wait_healthy(apiserver, f"{ep.api_url}/readyz", 60, pki.admin_token, pki.ca_cert)
    return apiserver


def start_controllers(
    bin_dir: Path, pki: Pki, kubeconfig: Path, work: Path, logs: Path, ep: Endpoints
) -> tuple[process.Component, process.Component]:
    """Start the controller manager and the scheduler; ``wait_controllers`` waits for them."""
    common = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--v=1",
    ]
    kcm = process.start(
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            *common,
            f"--secure-port={ep.controller_manager_port}",
            f"--cert-dir={work / 'kcm-certs'}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-cluster-ip-range={ep.service_cidr}",
            "--use-service-account-credentials=false",
        ],
        logs,
    )
    scheduler = process.start(
        "kube-scheduler",
        [
            str(bin_dir / "kube-scheduler"),
            *common,
            f"--secure-port={ep.scheduler_port}",
            f"--cert-dir={work / 'scheduler-certs'}",
        ],
        logs,
    )
    return kcm, scheduler


def wait_controllers(kcm: process.Component, scheduler: process.Component, ep: Endpoints) -> None:
    """Wait until the controller manager and the scheduler answer /healthz."""
    for component, port in ((kcm, ep.controller_manager_port), (scheduler, ep.scheduler_port)):
        _wait_healthy(component, f"https://127.0.0.1:{port}/healthz", 60)
