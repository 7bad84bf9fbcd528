# ampbench: `make run` runs the experiment, `make test` checks everything. `make help` lists all.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Deployment checks (checkov, kubernetes-validate, hadolint, kubectl) live in their own venv:
# checkov's pins would downgrade boto3 and packaging in .venv.
TOOLS_VENV ?= .venv-tools
TOOLS_STAMP := $(TOOLS_VENV)/.installed
IMAGE ?= $(shell $(PYTHON) -c "import re; print('ghcr.io/ampbench/ampbench:' + re.search(r'^version = \"(.+)\"', open('pyproject.toml').read(), re.M).group(1))")
ARGS ?=
PYTEST_ARGS ?=
# Two workers: much of the suite waits on subprocesses and services (KFP tasks, Ceph, MLflow),
# so even on 2 cores a second worker shortens it; a file's tests stay on one worker.
PYTEST_WORKERS ?= 2
# make gpu-bundle: the target machine's Python and the bundle's folder (`:=`, so that only the
# command line sets them: an OUT in the environment is some other tool's).
PY := 3.12
OUT := dist/gpu-bundle

.DEFAULT_GOAL := help
.PHONY: help run test fuzz mutation lint docs typecheck format compile bench gpu-bundle gpu-check image image-check services clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# The venvs are (re)built on first use and whenever their requirements change.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

$(TOOLS_STAMP): requirements-tools.txt
	@test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --quiet -r requirements-tools.txt
	@touch $(TOOLS_STAMP)

run: $(STAMP) ## Run the experiment through the KFP local runner; options via ARGS="--data PATH --epochs 1"
	$(BIN)/ampbench run $(ARGS)
	@echo "ampbench is $(BIN)/ampbench: run it so, or put it on your PATH with 'source $(BIN)/activate'"

test: lint services ## Lint, install what the tests start (Ceph RGW, Chromium), run pytest
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

fuzz: $(STAMP) ## Fuzz the prepare step far longer than `make test` does (new cases each run)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) tests/test_prepare_fuzz.py --hypothesis-profile=fuzz --hypothesis-show-statistics $(PYTEST_ARGS)

mutation: $(STAMP) ## Mutation-test the modules that decide a user's answer (mutmut; ~30 min; not in `make test`)
	scripts/mutation.sh

lint: ## ruff, the import layers (import-linter), the docs site (strict), the offline Dockerfile and manifest checks
	@# The two venvs are independent: built side by side, a fresh checkout's setup is ~25 s shorter.
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(TOOLS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	BIN=$(abspath $(BIN)) scripts/lint-imports.sh
	@# Not --quiet: it silences the warnings that --strict fails on (a broken link, a page out of the nav).
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict 2>&1 | grep -v '^INFO' || true; test "$${PIPESTATUS[0]}" = 0
	TOOLS_VENV=$(TOOLS_VENV) scripts/validate-deploy.sh

docs: $(STAMP) ## Build the documentation site (docs/, mkdocs-material) into build/site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

typecheck: $(STAMP) ## mypy over the library, the steps and the DAG (not in `make test`: ~20 s)
	$(BIN)/mypy

services: ## Install Ceph's RADOS Gateway (S3 tests) and Chromium (browser test), if missing (root)
	@scripts/install-test-services.sh

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

compile: $(STAMP) ## Compile the pipeline to ampbench-pipeline.yaml (ARGS="-o FILE --image IMAGE")
	$(BIN)/ampbench compile $(ARGS)

bench: $(STAMP) ## Run the CPU benchmarks in benchmarks/ (minutes; prints figures)
	$(BIN)/python benchmarks/run_all.py $(ARGS)

gpu-bundle: $(STAMP) ## Wheels a bare GPU machine lacks, for Python PY (3.12), into OUT (<40 MiB)
	$(BIN)/python scripts/gpu-bundle.py --python-version $(PY) --out $(OUT) $(ARGS)

gpu-check: ## On a GPU machine: tests, precision tables, a pipeline run (ARGS="--bundle DIR")
	PYTHON=$(PYTHON) benchmarks/gpu_check.sh $(ARGS)

image: ## Build the component image with docker buildx (IMAGE=name:tag; needs a Docker daemon)
	docker buildx build -f docker/Dockerfile -t $(IMAGE) --load .

image-check: ## Build the image with buildah on a stand-in base and run the steps in it (root; minutes)
	PYTHON=$(PYTHON) scripts/image-check.sh $(ARGS)

clean: ## Remove run outputs and caches (keeps the venvs)
	rm -rf runs/ mlflow.db mlruns/ .pytest_cache .ruff_cache .mypy_cache ampbench-pipeline.yaml gpu-check/ dist/gpu-bundle/
