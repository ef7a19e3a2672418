# The two commands a fresh machine needs (see README):
#   make demo   install, migrate, seed the demo and serve the console on :8000 (embedded SQLite)
#   make test   install and run the whole test suite on PostgreSQL
# (make demo-reset brings the demo's standing cases back; make docs serves the docs site.)
SHELL := /bin/bash
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=
# Hashed locks (`make locks` regenerates them from pyproject.toml): runtime.lock is what the app
# runs on; dev.lock is the same pins plus the test and lint tools.
RUNTIME_LOCK := requirements/runtime.lock
DEV_LOCK := requirements/dev.lock
PIP_INSTALL := $(BIN)/pip install --quiet --disable-pip-version-check --require-hashes
PIP_TOOLS ?= pip-tools==7.6.2
LOCK_VENV ?= var/pip-tools

.PHONY: install install-dev demo demo-code prod-check test soak-tests chaos failover cluster-test pgbouncer-test partition-test bench-cluster bench bench-e2e bench-leases bench-approvals bench-console bench-agents bench-a2a bench-all lint locks docs demo-reset demo-soak

$(BIN)/python:
	$(PY) -m venv $(VENV)

# An install leaves a stamp in the venv named by a hash of what it installed from (pyproject.toml and the
# lock): while those are unchanged the next install is a no-op, not pip checking every pin again (seconds
# for each make target). A changed lock or pyproject names another stamp, and pip runs again; an install
# first removes every stamp (what it changes may no longer match the other lock). The dev lock holds the
# runtime pins (make locks), so its stamp stands for the runtime install too. After a pip install or
# uninstall by hand, `rm $(VENV)/.installed-*` makes the next make install again.
PYPROJECT ?= pyproject.toml
stamp_hash = $(shell cat $(PYPROJECT) $(1) | sha256sum | cut -c1-16)
RUNTIME_STAMP := $(VENV)/.installed-runtime-$(call stamp_hash,$(RUNTIME_LOCK))
DEV_STAMP := $(VENV)/.installed-dev-$(call stamp_hash,$(RUNTIME_LOCK) $(DEV_LOCK))

install: $(if $(wildcard $(DEV_STAMP)),$(DEV_STAMP),$(RUNTIME_STAMP))  # the runtime only: make demo, make bench
install-dev: $(DEV_STAMP)  # runtime + test + lint tools: make test, make lint, make chaos

$(RUNTIME_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(PIP_INSTALL) -r $(RUNTIME_LOCK)
	touch $@

$(DEV_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-*
	$(PIP_INSTALL) -r $(DEV_LOCK)
	touch $@

# The app is production-safe by default (DEBUG off, no start without SECRET_KEY, no sandbox): the demo
# asks for a development run with the sandbox on, explicitly. Its keys are public, for a laptop only.
DEMO_ENV ?= DEBUG=1 SANDBOX_ENABLED=1 SECRET_KEY=demo-only-insecure-key SANDBOX_TOKEN=demo-only-sandbox-token
# The six digits the demo's approvers and admins give now (from seed_demo's public DEMO_TOTP_SECRET),
# for a laptop without an authenticator app.
demo-code: install
	@$(DEMO_ENV) $(BIN)/python manage.py seed_demo --code

demo: install
	$(DEMO_ENV) $(BIN)/python manage.py migrate --noinput
	$(DEMO_ENV) $(BIN)/python manage.py seed_demo
	$(DEMO_ENV) $(BIN)/python manage.py run_demo 127.0.0.1:$(PORT)

# Bring every standing demo case back: the demo's embedded database (and its broker, beat schedule and
# audit anchors, which describe that database) is thrown away and seeded afresh. The demo's only: with
# DATABASE_URL set it refuses (history tables refuse deletes there, and the data may not be the demo's).
DEMO_VAR ?= var
demo-reset: install
	@if [ -n "$${DATABASE_URL:-}" ]; then \
		echo "make demo-reset resets the embedded demo database only: unset DATABASE_URL" >&2; exit 1; fi
	rm -rf $(DEMO_VAR)/demo.sqlite3 $(DEMO_VAR)/broker $(DEMO_VAR)/anchors $(DEMO_VAR)/celerybeat-schedule*
	VAR_DIR=$(DEMO_VAR) $(DEMO_ENV) $(BIN)/python manage.py migrate --noinput
	VAR_DIR=$(DEMO_VAR) $(DEMO_ENV) $(BIN)/python manage.py seed_demo
	@echo "Demo reset: make demo serves it again."

# The demo for MINUTES under a scripted click-through (scripts/demo_soak.py): make demo's steps in a var
# directory of its own (var/demo-soak, made afresh), on PORT; the operator, approver (TOTP), auditor and
# integrator over HTTP, /readyz every 30 s. Per-minute figures in bench/results/demo-soak-<time>.json,
# rewritten every minute; exits non-zero if the demo stopped serving or answered a 5xx.
MINUTES ?= 120
DEMO_SOAK_ARGS ?=
demo-soak: install
	$(BIN)/python scripts/demo_soak.py --minutes $(MINUTES) --port $(PORT) $(DEMO_SOAK_ARGS)

# pytest exits 5 when it collected no tests. make turns any failing recipe into exit 2, so .ci/run
# cannot see that 5: under CI (CI set, as .ci/run does) it is not a failure of the build.
test: install-dev
	scripts/ensure-chromium
	scripts/ensure-faketime
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 2 $(PYTEST_ARGS) || { status=$$?; [ "$$status" -eq 5 ] && [ -n "$${CI:-}" ]; }

# What the default run leaves out (pytest -m slow): the payment soak at full size and the whole
# benchmark entry point's reduced matrix. Each has a small twin in make test.
soak-tests: install-dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 2 -m slow $(PYTEST_ARGS)

# The chaos soak at full size (scripts/soak.py; a small one runs in make test), then the fault suites:
# real processes killed, frozen, starved, poisoned, the payment soak at full size among them (-m: the
# slow ones too). SOAK_ARGS=... changes the soak's size.
SOAK_ARGS ?= --tasks 10000 --kills 100
chaos: install-dev
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python scripts/soak.py $(SOAK_ARGS)
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 2 -m "slow or not slow" tests/chaos tests/runtime tests/ledger $(PYTEST_ARGS)

# A lossy failover at size: a throwaway primary and its streaming standby (initdb, pg_basebackup -R; the
# binaries from PG_BINDIR or /usr/lib/postgresql/*/bin), never the cluster TEST_DATABASE_URL names, which
# keeps only the payment system's records. Its small twin runs in make test; make chaos runs both.
failover: install-dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 0 -m "slow or not slow" tests/chaos/test_standby_failover.py $(PYTEST_ARGS)

# High availability on real servers (marker cluster, out of make test; under 15 minutes): a pg_auto_failover
# monitor, primary and synchronous secondary on loopback (tests/cluster/autofailover.py), the API and workers
# on a multi-host DATABASE_URL, the primary killed mid-run; a three-node RabbitMQ cluster with the region
# queue's leader killed mid-run (tests/cluster/rabbitmq.py); worker hosts cut off (the partition tests).
# Installs Debian's pg_auto_failover, PgBouncer and RabbitMQ, and iproute2 and iptables.
cluster-test: install-dev
	scripts/ensure-cluster-packages
	scripts/ensure-partition-packages
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 0 -m cluster tests/cluster $(PYTEST_ARGS)

# The worker tests behind a real PgBouncer in transaction mode (tests/cluster/pgbouncer.py, one per run on a
# spare port): DATABASE_URL through it with DATABASE_POOLER=transaction, the liveness locks direct
# (DATABASE_LIVENESS_URL). PGBOUNCER_TESTS names the directories; out of make test.
PGBOUNCER_TESTS ?= tests/runtime tests/tasks
pgbouncer-test: install-dev
	scripts/ensure-cluster-packages
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python -m tests.cluster.pgbouncer -- \
		$(BIN)/pytest -n 2 -p tests.cluster.behind_pgbouncer $(PGBOUNCER_TESTS) $(PYTEST_ARGS)

# Worker hosts cut off from the database (tests/cluster/test_partition.py): network namespaces on veth
# links, the cut an iptables rule, a private PostgreSQL; root only (the tests skip otherwise). Also in
# make cluster-test. The throughput against added round-trip time: tests/cluster/rtt_bench.py (root).
partition-test: install-dev
	scripts/ensure-partition-packages
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n 0 -m cluster tests/cluster/test_partition.py $(PYTEST_ARGS)

# What that failover costs (bench/cluster.py, the same scenario once at size): seconds without writes,
# tasks stranded and until all move again, tasks/s before, during and after; then DBOS on the same kind
# of failover (bench/peers/dbos_pay_invoice.py; its venv built from PyPI on first use; --peer none skips
# it). JSON in bench/results/.
CLUSTER_BENCH_ARGS ?= --tasks 200
bench-cluster: install-dev
	scripts/ensure-cluster-packages
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python bench/cluster.py $(CLUSTER_BENCH_ARGS)

# mypy's django-stubs plugin imports config.settings, which reads the environment: pin what it needs
# so a production-like shell (DEBUG=0 without SECRET_KEY) cannot break the type check.
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DJANGO_SETTINGS_MODULE=config.settings DEBUG=1 $(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/audit_deps.py $(DEV_LOCK)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --quiet

# The docs site (docs/, mkdocs.yml): built from the sources, its reference pages generated from the code
# by scripts/docs_reference.py (loading the apps needs the development profile, nothing more).
DOCS_ENV := DJANGO_SETTINGS_MODULE=config.settings DEBUG=1 NO_MKDOCS_2_WARNING=1
DOCS_PORT ?= 8001
docs: install-dev
	$(DOCS_ENV) $(BIN)/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

# Re-resolve both locks from pyproject.toml, keeping every current pin that still fits (delete a
# line from a lock, or pass PIP_COMPILE_ARGS=--upgrade-package=NAME, to move it). The dev lock is
# constrained by the runtime lock, so both install the same runtime versions. OpenTelemetry
# packages are resolved in the same run and stay in step (STACK.md).
locks:
	$(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --disable-pip-version-check $(PIP_TOOLS)
	cd requirements && CUSTOM_COMPILE_COMMAND="make locks" $(CURDIR)/$(LOCK_VENV)/bin/pip-compile --quiet \
		--generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links $(PIP_COMPILE_ARGS) \
		--extra agents --output-file runtime.lock ../pyproject.toml
	cd requirements && CUSTOM_COMPILE_COMMAND="make locks" $(CURDIR)/$(LOCK_VENV)/bin/pip-compile --quiet \
		--generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links $(PIP_COMPILE_ARGS) \
		--extra agents --extra test --extra lint --constraint runtime.lock --output-file dev.lock ../pyproject.toml

bench: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/transitions.py

bench-e2e: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/e2e.py

bench-leases: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/leases.py

bench-approvals: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/approvals.py

bench-console: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/console.py

prod-check: install  # the production layout from deploy/ (Procfile, env.example, gunicorn.conf.py) on loopback, probed
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python scripts/prod_check.py

bench-agents: install  # the Agents SDK adapter against the same tools as a native workflow (bench/sdk_agents.py)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/sdk_agents.py

bench-a2a: install  # the same tasks through A2A (the a2a-sdk client) and the REST API, same workers (bench/a2a_vs_rest.py)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/a2a_vs_rest.py

bench-all: install  # every figure in one run (under 15 minutes): bench/all.py, JSON in bench/results/
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(BIN)/python bench/all.py
