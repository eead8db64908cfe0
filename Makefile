# Set-up, tests and demo. `make setup` is idempotent: it only reinstalls when
# pyproject.toml changed since the last install.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint format demo bench soak clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: setup lint
	$(BIN)/python -m pytest

demo: setup
	$(BIN)/python -m examples.demo

bench: setup
	$(BIN)/python -m bench.run

soak: setup
	$(BIN)/python -m pytest -m soak -p no:cacheprovider

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
