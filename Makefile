# ampbench: `make run` runs the experiment, `make test` checks everything. `make help` lists all.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help run test lint format compile bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# The venv is (re)built on first use and whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

run: $(STAMP) ## Run the experiment through the KFP local runner; options via ARGS="--data PATH --epochs 1"
	$(BIN)/ampbench run $(ARGS)

test: lint ## Lint, start the services the tests need, run pytest
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## ruff check and ruff format --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

compile: $(STAMP) ## Compile the pipeline to ampbench-pipeline.yaml (ARGS="-o FILE --image IMAGE")
	$(BIN)/ampbench compile $(ARGS)

bench: $(STAMP) ## Run the CPU benchmarks in benchmarks/ (minutes; prints figures)
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean: ## Remove run outputs and caches (keeps .venv)
	rm -rf runs/ mlflow.db mlruns/ .pytest_cache .ruff_cache ampbench-pipeline.yaml
