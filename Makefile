# Every target builds what it needs: a fresh clone runs `make test` or `make demo` alone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-newest test-matrix test-fast test-valkey lint docs demo bench screenshots clean

# The browser test drives Debian's Chromium (never a browser downloaded by a test tool);
# `CHROMIUM=/path/to/chromium make test` uses another binary.
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	apt-get install -y --no-install-recommends chromium || \
	  (apt-get update && apt-get install -y --no-install-recommends chromium)

# The PostgreSQL engine is tested behind Debian's PgBouncer too (transaction pooling).
PGBOUNCER ?= /usr/sbin/pgbouncer
$(PGBOUNCER):
	apt-get install -y --no-install-recommends pgbouncer || \
	  (apt-get update && apt-get install -y --no-install-recommends pgbouncer)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The demo needs the app, DRF and the Prometheus client: not the test tools.
DEMO_STAMP := $(VENV)/.demo-installed
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# The site in docs/_build/html; any warning (a broken link or reference, a page left out
# of every table of contents) fails the build.
docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build --fail-on-warning --keep-going --quiet -b html docs docs/_build/html

install: $(STAMP)

# Every suite runs on every core (pytest-xdist): a file's tests on one worker, each worker
# with a private redis-server of its own; one process when REDIS_URL names the one Redis
# to use.
TEST_JOBS := $(if $(REDIS_URL),,-n auto --dist loadfile)

test: $(STAMP) $(CHROMIUM) $(PGBOUNCER)
	$(BIN)/python -m pytest $(TEST_JOBS)

# The newest pair we support, in its own environment under .nox/ (noxfile.py): Python 3.13
# (pyenv's, or python3.13 on PATH) with Django 6.1. `make test-matrix` runs every pair.
test-newest: $(STAMP) $(CHROMIUM) $(PGBOUNCER)
	$(BIN)/nox -s "tests(py3.13-django6.1)" -- $(TEST_JOBS)

test-matrix: $(STAMP) $(CHROMIUM) $(PGBOUNCER)
	$(BIN)/nox -- $(TEST_JOBS)

# The suite on Valkey: every server, cluster and sentinel it starts is valkey-server,
# joined by valkey-cli (tests/redis_server.py), and the limiter's URLs say valkey://.
# Left out: the throughput and latency tests of our own servers (tests/servers, the
# adaptive limiter's) and the browser walk, which measure our Python, not the store.
# Valkey 8 is Debian's, from bookworm-backports (added to apt's sources if missing).
VALKEY ?= /usr/bin/valkey-server
BACKPORTS := /etc/apt/sources.list.d/bookworm-backports.list
$(VALKEY):
	grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/ || \
	  echo 'deb http://deb.debian.org/debian bookworm-backports main' > $(BACKPORTS)
	apt-get update
	apt-get install -y --no-install-recommends -t bookworm-backports valkey-server valkey-tools

test-valkey: $(STAMP) $(VALKEY) $(CHROMIUM) $(PGBOUNCER)
	RATELIMITS_TEST_STORE=valkey $(BIN)/python -m pytest $(TEST_JOBS) \
	  --ignore tests/servers --deselect tests/test_browser.py \
	  --deselect tests/pipeline/test_adaptive_servers.py

# The edit loop: no cluster, no server processes, no browser (the tests marked `slow`).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(TEST_JOBS)

# The README's pictures, taken by the browser test as it walks through the admin.
screenshots: $(STAMP) $(CHROMIUM)
	RATELIMITS_SCREENSHOTS=docs/img $(BIN)/python -m pytest tests/test_browser.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/check_duplicates.py
	$(BIN)/python tools/check_sizes.py

# `make demo PORT=8001` when 8000 is taken.
PORT ?= 8000
demo: $(DEMO_STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_policies
	$(BIN)/python manage.py demo_admin --port $(PORT)
	$(BIN)/python manage.py runserver 127.0.0.1:$(PORT)

# HTTP load for `make bench`: Debian's wrk.
WRK ?= /usr/bin/wrk
$(WRK):
	apt-get install -y --no-install-recommends wrk || \
	  (apt-get update && apt-get install -y --no-install-recommends wrk)

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(WRK)
	$(BIN)/python bench/run_all.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .nox build dist *.egg-info .pytest_cache docs/_build
