# Every target sets itself up: `make simulate` needs only python3 (>= 3.11); the full
# `make test` also needs Go (it builds the test control plane and helm, once per machine)
# and Debian's `prometheus` (without them those tests skip; under CI=true they fail).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
## Extra pytest arguments, e.g. CI's coverage: make test PYTEST_ARGS=--cov
PYTEST_ARGS ?=

.PHONY: setup simulate test test-fast test-keda controlplane helm lint typecheck bench lock clean

$(BIN)/gpuscaler: pyproject.toml
	@echo "setting up $(VENV) (once: about 1 GB of packages, a few minutes) ..." >&2
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/gpuscaler

## The main job on the embedded default: the simulator on the bundled real trace.
simulate: setup
	$(BIN)/gpuscaler simulate --report report

## The tests, with lint and type checks first. The real control plane (kube-apiserver &
## co., built from Go once per machine, see tests/controlplane/build.sh) comes first.
test: setup lint typecheck controlplane helm
	$(BIN)/pytest -q $(PYTEST_ARGS)

## The quick loop: deselects the tests marked `controlplane` (they need the real control
## plane) and `slow` (they start programs or replay hours).
test-fast: setup lint typecheck
	$(BIN)/pytest -q -m "not controlplane and not slow" $(PYTEST_ARGS)

## gpuscaler's floor through the real KEDA operator and metrics adapter, end to end
## (tests/e2e_keda; docs/keda.md). Not in `make test`: KEDA takes over an hour to build
## (tests/keda/build.sh, cached in ~/.cache/gpuscaler/keda, a no-op once built); the
## test itself takes about a minute.
test-keda: setup controlplane
	tests/keda/build.sh >/dev/null
	GPUSCALER_KEDA_E2E=1 $(BIN)/pytest -q tests/e2e_keda $(PYTEST_ARGS)

## Build the test control plane into ~/.cache/gpuscaler/controlplane (a no-op once built;
## about 23.5 min cold on 2 cores, module downloads included; one progress line per
## binary on stderr). Without Go, the tests that need it skip (fail under CI).
controlplane:
	@if command -v go >/dev/null || [ -n "$$CI" ]; then tests/controlplane/build.sh >/dev/null; \
	else echo "go not found: the control-plane tests will skip" >&2; fi

## Build helm for the chart tests into ~/.cache/gpuscaler/helm (a no-op once built; about
## 3 min cold on 2 cores), as the control plane: tests/helm/build.sh.
helm:
	@if command -v go >/dev/null || [ -n "$$CI" ]; then tests/helm/build.sh >/dev/null; \
	else echo "go not found: the Helm chart tests will skip" >&2; fi

## The image's pinned dependencies (requirements.lock, with hashes) from pyproject.toml.
lock: setup
	$(BIN)/pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
	  --custom-compile-command "make lock" -o requirements.lock

lint: setup
	$(BIN)/ruff check gpuscaler tests bench
	$(BIN)/ruff format --check gpuscaler tests bench
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python bench/forecast.py

clean:
	rm -rf $(VENV) report .pytest_cache .mypy_cache .ruff_cache
