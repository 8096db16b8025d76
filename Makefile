# Developer and CI entry points for pgbroker: help (the default), venv, test, test-quick, lint,
# schema-dump, reference, demo, bench, bench-peers, clean, pg-partman, chromium, rabbitmq, brokers, pgbouncer,
# pgq.
# Works from a fresh clone on Debian with Python >= 3.11, also as `make -f path/to/Makefile`
# from another directory; `make test` is what .ci/run runs.

# Every recipe runs from the repository root, wherever make was started.
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
# Re-installs when pyproject.toml changes (new dependency, new extra).
STAMP := $(VENV)/.pgbroker-installed

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.ONESHELL:
# A bare `make` only says what there is: the full suite takes long and installs services.
.DEFAULT_GOAL := help

.PHONY: help venv test test-quick lint generate schema-dump reference demo bench bench-peers clean pg-partman chromium rabbitmq brokers pgbouncer pgq

help:
	@echo "usage: make TARGET"
	echo
	echo "  demo        a tour of pgbroker on an embedded PostgreSQL (installs .venv first)"
	echo "  venv        .venv with pgbroker and every extra, editable"
	echo "  test        lint, then the whole suite with every service it needs (what CI runs)"
	echo "  test-quick  the tests that need PostgreSQL alone"
	echo "  lint        ruff, mypy, the import contracts and the committed sync twins' freshness"
	echo "  generate    regenerate the sync twins after editing an asyncio module"
	echo "  schema-dump refresh docs/reference/schema.sql and route-example.sql"
	echo "  reference   refresh docs/reference/sql.md, python.md and cli.md"
	echo "  bench       the benchmarks; bench-peers: beside PgQueuer, Procrastinate and pgmq"
	echo "  pgq         PgQ and pgqd for the bench's scenario (h) (as root with apt; bench installs it)"
	echo "  clean       remove .venv and the caches"

# mypy fails on a directory without Python files (bench/ until it is written): name only those
# that have some.
MYPY_PATHS = $$(for d in src tests bench scripts; do \
  if [ -n "$$(find "$$d" -name '*.py' -print -quit 2>/dev/null)" ]; then echo "$$d"; fi; done)

venv: $(STAMP)

$(STAMP): $(ROOT)/pyproject.toml
	@cd "$(ROOT)"
	echo "make venv: installing pgbroker[dev,embedded,spark,bench,http,bridge,codecs,otel] into $(VENV)"
	# A shim (pyenv) may resolve differently inside make, or not at all for a version it lacks:
	# ask each candidate for its real interpreter and keep the first that is >= 3.11.
	pick_python() {
	  local cand exe
	  for cand in python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
	    command -v "$$cand" >/dev/null 2>&1 || continue
	    exe=$$("$$cand" -c 'import sys; assert sys.version_info >= (3, 11); print(sys.executable)' \
	      2>/dev/null) || continue
	    [ -n "$$exe" ] && { echo "$$exe"; return 0; }
	  done
	  return 1
	}
	if ! "$(PY)" -c 'import sys; assert sys.version_info >= (3, 11)' >/dev/null 2>&1; then
	  python=$$(pick_python) || { echo "make venv: Python >= 3.11 not found on PATH" >&2; exit 1; }
	  rm -rf "$(VENV)"
	  if ! "$$python" -m venv "$(VENV)"; then
	    # Debian ships venv's ensurepip in a separate package.
	    rm -rf "$(VENV)"
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	      ver=$$("$$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
	      apt-get update -qq
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$$ver-venv" \
	        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
	      "$$python" -m venv "$(VENV)"
	    else
	      echo "make venv: '$$python -m venv' failed; install python3-venv and retry" >&2
	      exit 1
	    fi
	  fi
	fi
	"$(PY)" -m pip install -q --disable-pip-version-check -e '.[dev,embedded,spark,bench,http,bridge,codecs,otel]'
	# Spark's Python workers import pyspark from its zip: give the zip its bytecode (see the script).
	"$(PY)" scripts/precompile_pyspark.py
	touch "$@"

# Partitioned queues need pg_partman on the server. As root with apt-get, install Debian's
# postgresql-<major>-partman for every server under /usr/lib/postgresql that lacks it (the
# embedded test cluster runs those binaries); otherwise just say so: those tests then skip.
pg-partman:
	@missing=()
	for bin in /usr/lib/postgresql/*/bin/postgres; do
	  [ -x "$$bin" ] || continue
	  major=$$(basename "$$(dirname "$$(dirname "$$bin")")")
	  [ -e "/usr/share/postgresql/$$major/extension/pg_partman.control" ] \
	    || missing+=("postgresql-$$major-partman")
	done
	[ $${#missing[@]} -gt 0 ] || exit 0
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	  echo "make pg-partman: installing $${missing[*]}"
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$${missing[@]}"; } \
	    || echo "make pg-partman: could not install $${missing[*]}; partitioned-queue tests will skip" >&2
	else
	  echo "make pg-partman: $${missing[*]} missing (installing needs root and apt-get);" \
	    "partitioned-queue tests will skip" >&2
	fi

# The bridge tests need a RabbitMQ: the one on localhost:5672 (or $PGBROKER_TEST_AMQP) when it
# answers, else the installed rabbitmq-server started, else Debian's installed (as root); otherwise
# this fails saying how to get one (the bridge tests never skip).
rabbitmq:
	@"$(ROOT)/scripts/ensure-rabbitmq"

# The connector tests start private Redis, NATS (JetStream) and Mosquitto servers: as root with
# apt-get, install Debian's redis-server, nats-server and mosquitto when missing; otherwise this
# fails saying what to install (those tests never skip).
brokers:
	@"$(ROOT)/scripts/ensure-brokers"

# The dashboard's browser test drives Debian's chromium through its chromedriver (never a browser
# downloaded by a test tool). As root with apt-get, install both when missing; otherwise say so:
# that test then fails and says how to install them (it does not skip).
chromium:
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && exit 0
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	  echo "make chromium: installing chromium chromium-driver"
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
	    || echo "make chromium: could not install chromium chromium-driver; the dashboard test will fail" >&2
	else
	  echo "make chromium: chromium and chromium-driver missing (installing needs root and apt-get);" \
	    "the dashboard test will fail" >&2
	fi

# The pooler tests put Debian's pgbouncer (transaction pooling) in front of the test server. As
# root with apt-get, install it when missing; otherwise say so: those tests then fail saying how.
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] && exit 0
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	  echo "make pgbouncer: installing pgbouncer"
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; } \
	    || echo "make pgbouncer: could not install pgbouncer; the pooler tests will fail" >&2
	else
	  echo "make pgbouncer: pgbouncer missing (installing needs root and apt-get);" \
	    "the pooler tests will fail" >&2
	fi

# Benchmark scenario (h) runs a stream group beside PgQ: Debian's postgresql-<major>-pgq3 (the
# extension, for each server under /usr/lib/postgresql that lacks it; Debian packages it for 15) and
# pgqd (its ticker). As root with apt-get, install what is missing; otherwise say so: the bench then
# leaves PgQ's column empty and says why (as it does on a server of another major).
pgq:
	@missing=()
	for bin in /usr/lib/postgresql/*/bin/postgres; do
	  [ -x "$$bin" ] || continue
	  major=$$(basename "$$(dirname "$$(dirname "$$bin")")")
	  [ -e "/usr/share/postgresql/$$major/extension/pgq.control" ] || missing+=("postgresql-$$major-pgq3")
	done
	command -v pgqd >/dev/null 2>&1 || missing+=(pgqd)
	[ $${#missing[@]} -gt 0 ] || exit 0
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	  echo "make pgq: installing $${missing[*]}"
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$${missing[@]}"; } \
	    || echo "make pgq: could not install $${missing[*]} (Debian packages PgQ for PostgreSQL 15);" \
	      "the bench will run without PgQ where it is missing" >&2
	else
	  echo "make pgq: $${missing[*]} missing (installing needs root and apt-get);" \
	    "the bench will run without PgQ where it is missing" >&2
	fi

test: venv pg-partman chromium rabbitmq brokers pgbouncer
	cd "$(ROOT)"
	.venv/bin/python scripts/async_to_sync.py --check
	.venv/bin/ruff check src tests bench scripts
	.venv/bin/ruff format --check src tests bench scripts
	.venv/bin/mypy $(MYPY_PATHS)
	.venv/bin/lint-imports --no-logo
	# Four processes on two cores (many tests wait on clocks, hangs and restarts: with three, the
	# CPU idled through the last third; 14:40 against 16:51 on stop 43's machine), a test file each
	# at a time (its module fixtures stay in one process); each process starts its own embedded
	# cluster. The longest files go first (tests/plugins/scheduling.py), the slowest tests are
	# listed at the end.
	.venv/bin/pytest -n 4 --dist loadfile --no-loadscope-reorder --durations=25

# Postgres alone: the tests marked with another service, and the slow ones, are deselected
# (tests/README.md lists the markers; a test that starts a service without its marker fails).
QUICK_MARKERS := not (slow or rabbitmq or redis or nats or mqtt or sqs or spark or browser or pgbouncer)

test-quick: venv
	cd "$(ROOT)"
	.venv/bin/python scripts/async_to_sync.py --check
	.venv/bin/pytest -m '$(QUICK_MARKERS)' -x

lint: venv
	cd "$(ROOT)"
	.venv/bin/python scripts/async_to_sync.py --check
	.venv/bin/ruff check src tests bench scripts
	.venv/bin/ruff format --check src tests bench scripts
	.venv/bin/mypy $(MYPY_PATHS)
	.venv/bin/lint-imports --no-logo

# The sync twins (src/pgbroker/queues/_client.py, streams/_client.py) are generated from the asyncio
# modules (scripts/async_to_sync.py says how) and committed: run this after changing one of those.
# test, test-quick and lint only check (--check), so a stale committed twin fails them.
generate: venv
	cd "$(ROOT)"
	.venv/bin/python scripts/async_to_sync.py

# The engine as a new database holds it (docs/reference/schema.sql) and an example of the route
# functions it generates (docs/reference/route-example.sql), committed so that an engine change
# reads as a diff; tests/engine/test_schema_dump.py fails while they are stale.
schema-dump: venv
	cd "$(ROOT)"
	.venv/bin/python scripts/dump_schema.py

# The references generated from the code (docs/reference/sql.md, python.md, cli.md: the public SQL
# functions' header comments with a new database's catalog, the public __all__, the CLI's --help);
# tests/tree/test_reference_docs.py and tests/engine/test_sql_reference.py fail while stale.
reference: venv
	cd "$(ROOT)"
	.venv/bin/python -m scripts.gen_reference

# As root the embedded cluster's default home is machine-wide (/var/lib/pgbroker): give each
# checkout its own (.pgbroker/, git-ignored), so that a second clone does not reuse the first's data.
demo: venv
	cd "$(ROOT)"
	if [ "$$(id -u)" = 0 ] && [ -z "$${PGBROKER_HOME:-}" ]; then export PGBROKER_HOME="$(ROOT)/.pgbroker"; fi
	.venv/bin/python -m pgbroker.demo

bench: venv pgq
	cd "$(ROOT)"
	.venv/bin/python -m bench

# Only the worker runtimes side by side (PgQueuer, Procrastinate, pgmq, pgbroker): scenario (f).
# (PgQ, for scenario (h), is installed too: bench-peers is the target that sets up the peers.)
bench-peers: venv pgq
	cd "$(ROOT)"
	.venv/bin/python -m bench --peers

clean:
	cd "$(ROOT)"
	rm -rf .venv build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis .import_linter_cache
	find src tests bench -name __pycache__ -type d -prune -exec rm -rf {} +
