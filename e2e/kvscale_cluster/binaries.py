"""Where the control-plane binaries are: ``$KVSCALE_K8S_BIN``, else built (once) by build.sh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "k8sbin" / "build.sh"
NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class MissingBinaries(RuntimeError):
    """The control plane is neither cached nor buildable."""


def k8s_bin_dir() -> Path:
    """The folder holding etcd, kube-apiserver, kube-controller-manager and kube-scheduler."""
    configured = os.environ.get("KVSCALE_K8S_BIN")
    if configured:
        folder = Path(configured)
    else:
        if not BUILD_SCRIPT.exists():
            raise MissingBinaries(f"KVSCALE_K8S_BIN is unset and {BUILD_SCRIPT} does not exist")
        done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise MissingBinaries(f"{BUILD_SCRIPT} failed:\n{done.stderr[-4000:]}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    missing = [n for n in NAMES if not os.access(folder / n, os.X_OK)]
    if missing:
        raise MissingBinaries(f"{folder} lacks {', '.join(missing)}; run e2e/k8sbin/build.sh")
    return folder


HELM_BUILD_SCRIPT = BUILD_SCRIPT.parent.parent / "helm" / "build.sh"


def _built(variable: str, script: Path) -> Path:
    """``$variable``, else what ``script`` prints last (it builds once, then reuses its cache)."""
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    done = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise MissingBinaries(f"{script} failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def helm_binary() -> Path:
    """helm: ``$KVSCALE_HELM``, else built (once, then cached) by e2e/helm/build.sh."""
    path = _built("KVSCALE_HELM", HELM_BUILD_SCRIPT)
    if not os.access(path, os.X_OK):
        raise MissingBinaries(f"no helm at {path}; run e2e/helm/build.sh")
    return path


KEDA_BUILD_SCRIPT = BUILD_SCRIPT.parent.parent / "keda" / "build.sh"
KEDA_NAMES = ("keda-operator", "keda-adapter")


def keda_dir() -> Path:
    """KEDA's operator, metrics adapter and CRDs: ``$KVSCALE_KEDA``, else built (once, then
    cached) by e2e/keda/build.sh."""
    folder = _built("KVSCALE_KEDA", KEDA_BUILD_SCRIPT)
    missing = [n for n in KEDA_NAMES if not os.access(folder / n, os.X_OK)]
    if missing or not (folder / "crds").is_dir():
        raise MissingBinaries(f"{folder} lacks KEDA ({missing or 'crds'}); run e2e/keda/build.sh")
    return folder
