# Two commands a newcomer needs:  `make run`  and  `make test`  (see README.md).
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test lint image typecheck unit cluster-bin test-cluster node-bin test-node registry-bin tools-bin bench stubs test-scale

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $@

install: $(VENV)/.installed

## Praesto on a local one-node cluster (upstream control plane, kubelet, containerd; root): a ModelCache
## and a Pod reading it at /models. Prints kubectl commands to try; Ctrl-C tears it all down.
run: install node-bin
	bash scripts/build_cluster.sh
	$(PY) -m tests.node.local_cluster

## ruff; the real `helm lint --strict` on the chart (scripts/helm_lint.py); actionlint on .github/workflows
lint: install tools-bin
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/helm_lint.py
	"$$(bash scripts/build_cluster.sh tests/actionlint)/actionlint"

typecheck: install
	$(PY) scripts/typecheck.py

unit: install
	$(VENV)/bin/pytest -n 2 --ignore=tests/cluster --ignore=tests/node $(PYTEST_ARGS)

## Build the upstream control plane (etcd, kube-apiserver, controller-manager, scheduler) into build/cluster,
## and the oldest kube-apiserver the chart claims (tests/cluster/compat-1.30)
cluster-bin:
	bash scripts/build_cluster.sh
	bash scripts/build_cluster.sh tests/cluster/compat-1.30

## The real control-plane tier alone (one control plane, tests in order, no xdist)
test-cluster: install cluster-bin
	$(VENV)/bin/pytest -p no:xdist tests/cluster $(PYTEST_ARGS)

## Build the node tier's upstream kubelet, containerd, its runc shim and ctr into build/cluster (tests/node/go.mod)
node-bin:
	bash scripts/build_cluster.sh tests/node

## Build the chart, alert and release checks' upstream CLIs (helm v4.3.2, promtool v0.316.0, kubectl v1.37.2, actionlint
## v1.7.12) into build/cluster (tests/tools, tests/actionlint)
tools-bin:
	bash scripts/build_cluster.sh tests/tools
	bash scripts/build_cluster.sh tests/actionlint

## Build the OCI tests' upstream registry (distribution v3.1.2) and client (oras v1.3.6) into build/cluster (tests/registry)
registry-bin:
	bash scripts/build_cluster.sh tests/registry

## The node tier alone: the control plane plus one real node (kubelet + containerd) running real Pods (root)
test-node: install cluster-bin node-bin
	$(VENV)/bin/pytest -p no:xdist tests/node $(PYTEST_ARGS)

## Lint, type-check, build the tiers' binaries (the suite's image test runs on the node's containerd), then the
## whole test suite, control-plane and node tiers included (what CI runs)
test: lint typecheck cluster-bin node-bin registry-bin tools-bin unit test-cluster test-node

## Build the Praesto image from the Dockerfile with docker, podman or buildah, whichever is there
## (IMAGE_BUILDER picks one), as <values.yaml image.repository>:<Chart.yaml appVersion> (scripts/release.sh)
image:
	bash scripts/release.sh image

## Regenerate the CSI gRPC stubs from csi/proto/csi.proto
stubs: install
	$(PY) scripts/gen_csi_stubs.py

bench: install
	$(PY) -m bench.all

## The scale tier alone (not part of `make test`: ~N/50 s per phase and ~15 min at 1,000 nodes): one cache over
## 100 and 1,000 GPU-shaped Nodes on the real control plane, the chart's Metacontroller settings (bench/scale_bench.py).
## Other shapes: SCALE_ARGS="--nodes 100 --caches 100 --rounds 1", or "--nodes 1000 --rounds 1 --pods 1000 --restart"
## (Pods admitted while the copies roll, then a rollout of the node DaemonSet)
test-scale: install cluster-bin
	$(PY) -m bench.scale_bench $(SCALE_ARGS)
