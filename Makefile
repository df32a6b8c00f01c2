# dprelease: developer and CI entry points (GNU make). `make help` lists the targets.
#
# Everything runs from a virtual environment in $(VENV), built on first use by the stamp target
# below (scripts/install_venv.sh: uv with pip's configuration, else pip). constraints.txt is
# always passed: it pins torch to the local CPU wheel (pip find-links /opt/wheels); any other
# torch requirement would pull GBs of CUDA packages.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
BIN = $(VENV)/bin
STAMP = $(VENV)/.installed
# What `make run` needs: the package and its runtime dependencies, without the dev extras.
RUN_STAMP = $(VENV)/.installed-run

# Packages that mypy checks.
TYPED_PACKAGES = service worker dpcore dprelease_cli dprelease_client
# Extra arguments for pytest, e.g. `make test PYTEST_ARGS='-m "not slow"'`. Tiers (markers): `unit`
# and `integration` come from the folder (tests/conftest.py); `slow` marks property-based, fuzz,
# schemathesis, crash and concurrency tests and any test over ~10 s.
PYTEST_ARGS ?=
# pytest-xdist workers for `test` and `test-integration`: one per core, at most 4 (each worker's
# session has its own scratch database, S3 server, bucket and Celery queues; tests/conftest.py).
# PYTEST_WORKERS=0 runs in one process. Work stealing: an idle worker takes queued tests from a
# busy one, so one slow file at the end does not leave the other cores idle.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --maxprocesses 4 --dist worksteal)
# With one worker per core, each test process (and the servers it starts) keeps to one
# OpenMP/BLAS thread: nested thread pools on busy cores spin instead of working
# (docs/results/ci_time.md).
PYTEST_ENV = $(if $(filter 0,$(PYTEST_WORKERS)),,OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
# 1: pytest's exit status 5 ("no tests collected") counts as success (used by .ci/run).
ALLOW_NO_TESTS ?= 0
# The installer (uv) writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set Python writes
# none either: every test process, and every server, worker or CLI a test starts, would compile
# torch, scipy and the rest from source again (~6 s of CPU each on 2 cores). Written on first
# import, it is read by every later process (docs/results/ci_time.md).
unexport PYTHONDONTWRITEBYTECODE

# Where the integration tests find Postgres and Redis (scripts/ensure_services.sh starts them
# and creates the database named at the end of the URL).
DPRELEASE_TEST_DATABASE_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/dprelease_test
DPRELEASE_TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
export DPRELEASE_TEST_DATABASE_URL DPRELEASE_TEST_REDIS_URL

.PHONY: help install run imports lint typecheck services test test-fast test-integration openapi \
	bench format clean

help: ## List the targets
	@echo "usage: make TARGET   (VENV=$(VENV))"
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-17s %s\n", $$1, $$2 }' \
		$(MAKEFILE_LIST)

$(STAMP): pyproject.toml constraints.txt scripts/install_venv.sh
	bash scripts/install_venv.sh $(VENV) $(PYTHON) '.[dev]'
	touch $@ $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml constraints.txt scripts/install_venv.sh
	bash scripts/install_venv.sh $(VENV) $(PYTHON) .
	touch $@

install: $(STAMP) ## Create the venv (VENV=.venv) and install the package with its dev extras

run: $(RUN_STAMP) ## Run the API (embedded mode unless configured; PORT=8000, DPRELEASE_HOME=./var)
	DPRELEASE_HOME=$${DPRELEASE_HOME:-./var} DPRELEASE_PORT=$${PORT:-8000} \
		$(BIN)/dprelease-server

imports: $(STAMP) ## import-linter: the dependency contracts of pyproject.toml ([tool.importlinter])
	$(BIN)/lint-imports

lint: $(STAMP) imports ## ruff format --check, ruff check and the import contracts
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP) ## mypy over the packages
	$(BIN)/mypy $(TYPED_PACKAGES)

services: ## Start Postgres and Redis if needed (DPRELEASE_SKIP_SERVICES=1 skips)
	bash scripts/ensure_services.sh

# mypy runs beside pytest (one core, about 40 s without a cache, which would otherwise leave the
# other core idle before pytest starts); its report is printed after pytest's, and either
# failing fails the target.
test: $(STAMP) services lint ## services, lint, imports, typecheck (beside pytest), every test
	log=$$(mktemp); $(BIN)/mypy $(TYPED_PACKAGES) >"$$log" 2>&1 & typing=$$!; \
	rc=0; $(PYTEST_ENV) $(BIN)/pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ] && [ "$(ALLOW_NO_TESTS)" = 1 ]; then \
		echo "pytest collected no tests (ALLOW_NO_TESTS=1: not a failure)"; rc=0; \
	fi; \
	typed=0; wait $$typing || typed=$$?; echo "== mypy"; cat "$$log"; rm -f "$$log"; \
	if [ $$typed -ne 0 ]; then echo "mypy failed (exit $$typed)"; [ $$rc -ne 0 ] || rc=$$typed; fi; \
	exit $$rc

test-fast: $(STAMP) ## The unit tier without the slow tests (no services; about 3 min on 2 cores)
	$(BIN)/pytest -q tests/unit -m "unit and not slow" $(PYTEST_ARGS)

test-integration: $(STAMP) services ## The integration tier, slow tests included (needs services)
	$(PYTEST_ENV) $(BIN)/pytest -q tests/integration -m integration $(PYTEST_PARALLEL) $(PYTEST_ARGS)

openapi: $(STAMP) ## Write openapi/openapi.json
	$(PY) -m service.openapi_export openapi/openapi.json

# Extra arguments for the benchmark suite, e.g. `make bench BENCH_ARGS='--quick'` or
# `BENCH_ARGS='--only mixing noise'` (bench/suite.py --help).
BENCH_ARGS ?=

bench: $(STAMP) services ## Benchmark suite: mixing, noise, calibration, API latency (docs/results/bench.*)
	$(PY) bench/suite.py $(BENCH_ARGS)

format: $(STAMP) ## ruff format and ruff check --fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## Remove the venv, var/ and caches
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis \
		build dist
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d \
		-prune -exec rm -rf {} +
