# numaguard: `make demo` runs the whole loop on a simulated cluster, `make test` every test.
# Both set up what they need first: a virtualenv in .venv and, for the tests, the
# Debian packages of the real parts they use (prometheus and promtool,
# prometheus-alertmanager).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench lint docs proto system-deps clean

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
	    || ! command -v prometheus-alertmanager >/dev/null; then \
	  echo "installing Debian packages prometheus and prometheus-alertmanager (used by the tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager \
	    >/dev/null; \
	fi

demo: $(VENV)/.installed system-deps
	$(PY) -m simulator.loop_demo

test: $(VENV)/.installed system-deps
	$(PY) -m pytest
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed system-deps
	@command -v prometheus-node-exporter >/dev/null || { \
	  echo "installing Debian package prometheus-node-exporter (the scrape benchmark's peer)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus-node-exporter >/dev/null; }
	$(PY) bench/all.py

docs: $(VENV)/.installed
	$(PY) -m exporter.docs
	$(PY) -m alerts.rules
	$(PY) -m grafana.dashboards
	$(PY) -m deploy.generate

proto: $(VENV)/.installed
	$(PY) -m exporter.sources.podresources

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
