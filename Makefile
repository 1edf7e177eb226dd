# kvscale — every entry point a person or CI needs. `make test` and `make demo` set up everything
# themselves on a fresh machine: a venv in .venv, system packages, and the control-plane binaries.
# `make test-fresh` proves it: a clean clone in a fresh Debian 12 container (e2e/fresh-machine.sh).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest
K8S_BIN = $(shell e2e/k8sbin/build.sh)
HELM = $(shell e2e/helm/build.sh)
REAL_NODE_IMAGES = $(shell e2e/real-node/build-images.sh)
KEDA = $(shell e2e/keda/build.sh)
# the local cluster (kvscale_cluster) and the demo (kvscale_demo) are not installed: they run from
# the source tree (pytest's `pythonpath` and `python -m bench` find them themselves)
E2E_PATH := PYTHONPATH=$(CURDIR)/e2e

.PHONY: profile prereqs venv system-deps k8s helm keda vllm lint typecheck imports crds chart test test-unit \
	test-engine test-engine-installs test-controlplane test-e2e test-fresh demo bench cluster-up cluster-down image clean \
	real-node test-real test-real-engine cluster-up-real

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

# What the tiers need (Python >= 3.11, Go >= e2e/k8sbin/go.mod's, root, and the system packages
# system-deps installs; FRESH=1 adds Docker's engine and debootstrap for test-fresh): all missing
# pieces printed at once, before anything is installed or built
prereqs:
	@PY=$(PY) FRESH=$(FRESH) e2e/check-prereqs.sh

# Debian packages: prometheus (promtool for the unit tier, Prometheus for the cluster), iproute2;
# with FRESH=1 also docker.io and debootstrap; with REAL=1 the real node's containerd, runc, CNI
# plugins, docker.io and a static C toolchain (docs/real-node.md)
system-deps:
	e2e/install-system-deps.sh $(if $(filter 1,$(FRESH)),--fresh-check) $(if $(filter 1,$(REAL)),--real-node)

k8s:
	e2e/k8sbin/build.sh

# helm from its Go module into ~/.cache/kvscale/helm/<version>/ (once), for the chart's tests
helm:
	e2e/helm/build.sh

# KEDA's operator and metrics adapter (+ CRDs) from its Go module into ~/.cache/kvscale/keda/<version>/
# (once; 22 min on a busy 2-core machine: ~3,700 packages), for e2e/tests/test_keda.py and `python -m bench cluster_vs_keda`
keda:
	e2e/keda/build.sh

# vLLM's CPU build in its own venv under ~/.cache/kvscale/vllm/<version>/ (once; ~6 GB), for the
# vLLM tests (e2e/tests/test_vllm.py, test_bench_vllm.py) and `make bench`; prints the venv folder
vllm:
	e2e/vllm/install.sh

lint: venv
	$(BIN)/ruff check operator engine-image e2e tests bench charts
	$(BIN)/ruff format --check operator engine-image e2e tests bench charts

typecheck: venv
	$(BIN)/mypy operator/kvscale engine-image/kvscale_engine engine-image/kvscale_router e2e/kvscale_cluster e2e/kvscale_demo \
		charts/generate.py

imports: venv
	$(BIN)/lint-imports

crds: venv
	$(BIN)/kvscale crd > crds/llmendpoints.kvscale.io.yaml

# charts/kvscale/ from manifests/ (after `make crds` or any change there; a unit test checks it)
chart: venv
	$(BIN)/python charts/generate.py

# the unit tier checks the alert and recording rules with promtool (system-deps)
test-unit: venv system-deps
	$(PYTEST) tests/unit

test-engine: venv system-deps  # system-deps: the C compiler for the CPU decode kernel
	$(PYTEST) tests/engine

# the engine tier's tests that need each thing its install brings (the C compiler, transformers,
# the server and the openai client): the fresh-machine check runs these, after `make test` ran
# the whole tier on the same commit
test-engine-installs: venv system-deps
	$(PYTEST) tests/engine/test_cpu_ops.py tests/engine/test_cpu_decode.py \
		tests/engine/test_cpu_gemm.py tests/engine/test_server_openai.py

# the chart's tests run helm (make helm)
test-controlplane: prereqs venv system-deps k8s helm
	KVSCALE_K8S_BIN=$(K8S_BIN) KVSCALE_HELM=$(HELM) $(PYTEST) tests/controlplane

# e2e/tests/test_vllm.py runs real vLLM replicas from the venv `make vllm` builds (once, ~6 GB)
# e2e/tests/test_keda.py runs KEDA (make keda) against kvscale
test-e2e: prereqs venv system-deps k8s helm keda vllm
	KVSCALE_K8S_BIN=$(K8S_BIN) KVSCALE_HELM=$(HELM) KVSCALE_KEDA=$(KEDA) $(PYTEST) e2e/tests

# the real node (docs/real-node.md): the upstream kubelet (e2e/k8sbin/build.sh kubelet) and the
# pause, busybox and kvscale/operator images (e2e/real-node/build-images.sh), each built once and
# cached by content
real-node: k8s
	$(MAKE) system-deps REAL=1
	e2e/k8sbin/build.sh kubelet >/dev/null
	e2e/real-node/build-images.sh >/dev/null

test-real: prereqs venv real-node
	KVSCALE_K8S_BIN=$(K8S_BIN) KVSCALE_REAL_NODE_IMAGES=$(REAL_NODE_IMAGES) $(PYTEST) e2e/real

# kvscale's engine image as containers on the real node (e2e/real-engine/), the last tier: the
# image is 6.2 GB (PyPI's torch brings its CUDA libraries) and ~13 GB in containerd while it runs
test-real-engine: prereqs venv real-node image
	KVSCALE_K8S_BIN=$(K8S_BIN) KVSCALE_REAL_NODE_IMAGES=$(REAL_NODE_IMAGES) $(PYTEST) e2e/real-engine

test: prereqs lint typecheck imports test-unit test-engine test-controlplane test-e2e test-real \
	test-real-engine

# a clean clone of HEAD in a fresh Debian 12 container runs FRESH_TARGETS (default: prereqs lint
# typecheck imports test-unit test-engine-installs); CI runs it after `make test`
test-fresh:
	$(MAKE) prereqs system-deps FRESH=1
	e2e/fresh-machine.sh

demo: prereqs venv system-deps k8s
	KVSCALE_K8S_BIN=$(K8S_BIN) $(E2E_PATH) $(BIN)/python -m kvscale_demo

cluster-up: prereqs venv system-deps k8s
	KVSCALE_K8S_BIN=$(K8S_BIN) $(E2E_PATH) $(BIN)/python -m kvscale_cluster up

# the local cluster plus a third node, kvscale-real-1 (label kvscale.dev/node-kind=real), under the
# upstream kubelet with containerd, runc and CNI (docs/real-node.md)
cluster-up-real: prereqs venv system-deps real-node
	KVSCALE_REAL_NODE=1 KVSCALE_POD_NETWORK=netns KVSCALE_K8S_BIN=$(K8S_BIN) \
		KVSCALE_REAL_NODE_IMAGES=$(REAL_NODE_IMAGES) $(E2E_PATH) $(BIN)/python -m kvscale_cluster up

cluster-down: venv
	$(E2E_PATH) $(BIN)/python -m kvscale_cluster down

bench: venv vllm  # engine_vs_vllm serves vLLM from its venv
	$(BIN)/python -m bench

# sweep the real engine on this machine into operator/kvscale/profiles/<name>.json
profile: venv
	$(BIN)/python -m bench profile

# every image of kvscale (engine, router, operator), named <REGISTRY>/<name>:<TAG> (TAG: the
# version), with OCI labels; set the same names in manifests/base/kustomization.yaml's `images:`
REGISTRY ?= kvscale
TAG ?=
image:
	REGISTRY=$(REGISTRY) TAG=$(TAG) engine-image/build-image.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
