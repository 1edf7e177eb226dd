"""The Node objects, their status and their Leases, as the process kubelet publishes them."""

from __future__ import annotations

import datetime
import platform
from typing import Any

from .config import NodeConfig

Obj = dict[str, Any]
KUBELET_VERSION = "v1.37.2-kvscale"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(node: NodeConfig) -> Obj:
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kvscale.io/process-kubelet": "true",
    }
    if node.gpus:
        labels["nvidia.com/gpu.product"] = node.gpu_product
        labels["nvidia.com/gpu.count"] = str(node.gpus)
    labels.update(node.labels)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}}


def node_status(node: NodeConfig, host_ip: str, started: str, port: int) -> Obj:
    capacity = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": str(node.pods),
        "ephemeral-storage": "100Gi",
        "nvidia.com/gpu": str(node.gpus),
    }
    beat = now_iso()

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": beat,
            "lastTransitionTime": started,
        }

    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("Ready", "True", "KubeletReady", "kvscale process kubelet is posting ready"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "enough memory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": host_ip},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "machineID": node.name,
            "systemUUID": node.name,
            "bootID": started,
            "kernelVersion": platform.release(),
            "osImage": "kvscale process kubelet",
            "containerRuntimeVersion": "kvscale-process://1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def lease_object(node: NodeConfig, uid: str) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node.name,
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}
            ],
        },
        "spec": {
            "holderIdentity": node.name,
            "leaseDurationSeconds": 40,
            "renewTime": now_micro(),
        },
    }
