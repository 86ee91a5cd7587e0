# Every target sets itself up: a fresh machine needs only python3 (>= 3.11).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup simulate test lint typecheck bench clean

$(BIN)/gpuscaler: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/gpuscaler

## The main job on the embedded default: the simulator on the bundled real trace.
simulate: setup
	$(BIN)/gpuscaler simulate --report report

## The tests, with lint and type checks first.
test: setup lint typecheck
	$(BIN)/pytest -q

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
