"""Control-plane tier: the operator against a real kube-apiserver, etcd and controllers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from kvscale.kube import Kube

pytest_plugins = ["kvscale_cluster.fixtures"]

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "llmendpoints.kvscale.io.yaml"


@pytest.fixture(scope="session")
def kube(cluster: Any) -> Kube:
    return Kube(cluster.api_client())


def kubectl(cluster: Any, *args: str, stdin: str | None = None) -> str:
    """Runs kubectl (from the venv) against the test cluster; fails the test on error."""
    cmd = [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    done = subprocess.run([*cmd, *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def crd(cluster: Any) -> None:
    """The committed CRD, installed with server-side apply and Established."""
    kubectl(cluster, "apply", "--server-side", "-f", str(CRD_PATH))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/llmendpoints.kvscale.io",
    )


@pytest.fixture
def operator(cluster: Any, crd: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    """The kvscale operator, running in this process as `kvscale operator` would."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    args = ["run", "--standalone", "--all-namespaces", "-m", "kvscale.handlers", "--verbose"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.output
