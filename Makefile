# The two commands a fresh machine needs (see README):
#   make demo   install, migrate, seed the demo and serve the console on :8000 (embedded SQLite)
#   make test   install and run the whole test suite on PostgreSQL
SHELL := /bin/bash
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=

.PHONY: install demo test chaos bench bench-e2e lint

$(BIN)/python:
	$(PY) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock

demo: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py run_demo 127.0.0.1:$(PORT)

test: install
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 2 $(PYTEST_ARGS)

chaos: install  # only the fault-injection suites: real processes killed, frozen, starved, poisoned
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 2 tests/chaos tests/ledger $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

bench: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/transitions.py

bench-e2e: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/e2e.py
