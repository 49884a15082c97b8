# torchdeck — the two commands: `make up` and `make test`.
# Both install what is missing first: a .venv with the project, and (for tests) the system
# services the integration and browser tests run for real (Redis, PostgreSQL, Chromium).

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

VENV   ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: up test lint format install system-deps bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[worker,test]' 2>&1 \
	  | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
	@touch $(STAMP)

install: $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

up: install
	@bash scripts/up.sh

# The suite on pytest-xdist workers: `auto` is one per CPU this machine lends us, plus one (the tests mostly wait
# on servers, browsers and worker processes), at most 4 (tests/conftest.py). `make test PYTEST_WORKERS=0`: one process.
PYTEST_WORKERS ?= auto

test: install system-deps lint
	$(PY) -m pytest -n $(PYTEST_WORKERS)

# ruff (pyproject.toml's [tool.ruff]): the lint rules, and the code as the formatter writes it. `make format` applies both.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: install
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
