"""A real Kubernetes cluster on one machine, for kvscale's tests and demo.

The control plane is the upstream kube-apiserver, kube-controller-manager, kube-scheduler and etcd
built from Go modules (``e2e/k8sbin``); a process kubelet runs each pod's container as a local
process in its own network namespace; Debian's Prometheus discovers pods through the API.
"""
