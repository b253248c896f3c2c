# glm-operator developer entry points. `make help` lists them.
# Everything installs itself: a Python venv in .venv, the Go-built control plane and
# llama-server cached under ~/.cache/glm-operator/<component>-<version>/.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,lint]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with the package and its test and lint dependencies

# Debian packages the tests need: prometheus (the real server e2e/prometheus.py starts),
# redis-server (the rate-limit store e2e/redis.py starts), iproute2 and openssl (the network
# namespace and the serving certificate of the custom metrics API, e2e/custom_metrics.py);
# mmdebstrap, buildah, podman, runc and catatonit (the image builds and pods of e2e/images.py:
# a Debian rootfs, buildah builds on it, podman runs them with runc; catatonit is the init of
# podman's local pause image), python3-pip (Debian's python3 resolves the glm-operator image's
# wheels: the image runs that same Python); qemu-user-static and arch-test (the arm64 builds
# of the images run arm64 code emulated: e2e/images_foreign.py).
SYSTEM_PACKAGES := prometheus redis-server iproute2 openssl mmdebstrap buildah podman runc \
  catatonit python3-pip qemu-user-static arch-test

.PHONY: deps
deps: venv ## Install system packages the tests need (Debian; skipped when present)
	@bash scripts/install-system-deps.sh $(SYSTEM_PACKAGES)

.PHONY: toolchain
toolchain: venv ## Build and cache the control plane, helm, the real CRDs, llama-server and MinIO
	$(PY) -m e2e.toolchain build

.PHONY: images
images: deps toolchain ## Build the llama.cpp CPU, endpoint picker and glm-operator images (podman storage under ~/.cache/glm-operator)
	$(PY) -m e2e.images build

.PHONY: images-multiarch
images-multiarch: deps toolchain ## The same, and the glm-operator and endpoint picker images for linux/arm64 too (emulated: e2e/images_foreign.py)
	$(PY) -m e2e.images build --arch arm64

# A release of the images, their SBOMs and the chart, as .github/workflows/release.yml makes
# one on a tag (scripts/release.py; docs/install.md, "Releasing"). Here: the images make images
# builds, for this machine's platform only (the workflow builds amd64 and arm64, and the CUDA
# and CANN images), pushed from their podman storage. PLAIN_HTTP=1 for a local test registry.
REGISTRY ?=
VERSION ?=
PLAIN_HTTP ?=
RELEASE_OUT ?= dist

.PHONY: release release-args
release-args:
	@test -n "$(REGISTRY)" -a -n "$(VERSION)" || { echo "usage: make release" \
	  "REGISTRY=registry.example.com/glm VERSION=<pyproject version> [PLAIN_HTTP=1]" >&2; exit 2; }

release: release-args deps ## Push images, SBOMs and the chart: make release REGISTRY=host/path VERSION=x.y.z
	$(PY) scripts/release.py check --version '$(VERSION)'
	$(PY) scripts/release.py local --registry '$(REGISTRY)' --version '$(VERSION)' \
	  --out '$(RELEASE_OUT)' $(if $(PLAIN_HTTP),--plain-http)

.PHONY: cluster-up
cluster-up: toolchain ## Start the local control plane with fake GPU/NPU nodes (kubeconfig: .e2e/kubeconfig)
	$(PY) -m e2e.cluster up

.PHONY: cluster-down
cluster-down: venv ## Stop the local control plane and remove its state
	$(PY) -m e2e.cluster down

.PHONY: cluster-status
cluster-status: venv ## Show whether the local control plane is up
	$(PY) -m e2e.cluster status

.PHONY: demo
demo: deps toolchain ## Bring up the local cluster and show the operator doing its job
	$(PY) -m e2e.demo

.PHONY: test
# The control plane first; the rest of the toolchain builds in the background while the tests
# that need none of it run (e2e/late_builds.py orders the tests and waits for each build).
test: deps ## Run every test: unit, then e2e on the local control plane (CI runs this)
	$(PY) -m e2e.toolchain build --first
	$(PY) -m e2e.toolchain build --rest --background .e2e/toolchain-background.log
	$(PY) -m e2e.images build-foreign --arch arm64 --background .e2e/images-arm64-background.log
	$(PY) -m pytest $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## Run the unit tests only (no cluster, no llama-server)
	$(PY) -m pytest tests $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: deps toolchain ## Run the e2e tests only
	$(PY) -m pytest e2e $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff and mypy --strict on the package
	$(VENV)/bin/ruff check operator tests e2e bench
	$(VENV)/bin/mypy

.PHONY: crds
crds: venv ## Regenerate crds/, the chart's CRDs and docs/api.md from the API types
	$(VENV)/bin/glm-operator crds

.PHONY: bench
bench: toolchain ## Run the benchmarks under bench/ (figures go to docs/performance.md)
	$(PY) -m pip install --quiet -e '.[bench]'  # vllm-router, the gateway bench's reference
	$(PY) -m pytest bench -m bench -s $(PYTEST_ARGS)

.PHONY: clean
clean: ## Remove the venv and local state (the toolchain cache stays)
	-$(PY) -m e2e.cluster down
	rm -rf $(VENV) .e2e .pytest_cache .mypy_cache .ruff_cache
