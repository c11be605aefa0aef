# Each target bootstraps .venv from the project's own files when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-dashboard test test-django lint bench bench-hosts chaos chaos-hosts clean

$(STAMP): pyproject.toml demo/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q -e ./demo
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rota-demo

# The demo, then rota's dashboard on its data (http://127.0.0.1:8080/) until Ctrl-C.
demo-dashboard: $(STAMP)
	$(BIN)/rota-demo --dashboard

# The Node client's packages (clients/node: pg, from its lock file), for its end-to-end
# test, installed once with the machine's npm; the test then runs only the local node.
NODE_CLIENT := clients/node
NODE_STAMP := $(NODE_CLIENT)/node_modules/.package-lock.json

$(NODE_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund

# The Django backend's tests (tests/django_project) need Django 6, hence Python 3.12 or
# newer, in a second virtualenv: DJANGO_PY names the interpreter, else the first 3.12+
# found on PATH or under pyenv. None found is an error, never a silent skip.
DJ_VENV := .venv-django
DJ_STAMP := $(DJ_VENV)/.installed
DJANGO_PY ?=

$(DJ_STAMP): pyproject.toml
	@py="$(DJANGO_PY)"; \
	if [ -z "$$py" ]; then \
	  for c in python3.14 python3.13 python3.12 \
	           $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python \
	           /root/.pyenv/versions/3.1[2-9]*/bin/python; do \
	    if command -v "$$c" >/dev/null 2>&1 && \
	       "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
	      py="$$(command -v "$$c")"; break; \
	    fi; \
	  done; \
	fi; \
	if [ -z "$$py" ]; then \
	  echo "make: the Django tests need Python 3.12 or newer and none was found" \
	       "(install one, or set DJANGO_PY=/path/to/python3.12)" >&2; exit 1; \
	fi; \
	echo "Django tests: $$py"; \
	test -x $(DJ_VENV)/bin/python || "$$py" -m venv $(DJ_VENV)
	$(DJ_VENV)/bin/python -m pip install -q --upgrade pip
	$(DJ_VENV)/bin/python -m pip install -q -e '.[dev]'
	$(DJ_VENV)/bin/python -c 'import django; assert django.VERSION >= (6,), django.VERSION'
	touch $(DJ_STAMP)

# The second line is the pooler leg: the same queues through PgBouncer in transaction
# mode (tests/conftest.py, queue_url), and the short chaos run with the server restarted
# behind a PgBouncer (tests/test_chaos.py); tests/test_poolers.py and
# tests/test_failover.py run in the first. The tests marked `timing` (a promise in
# milliseconds: tests/test_wake_ups.py) run alone after the first, not beside it: under
# the suite's own load a wake-up 100 ms late was the machine's (119.8 ms once).
test: $(STAMP) $(NODE_STAMP) $(DJ_STAMP)
	ROTA_NODE_CLIENT=required $(BIN)/python -m pytest -n 2 -q -m "not timing"
	$(BIN)/python -m pytest -q -m timing
	ROTA_TEST_POOLER=transaction $(BIN)/python -m pytest -n 2 -q tests/test_dashboard_queries.py \
		tests/test_rates.py tests/test_quota.py tests/test_chaos.py
	$(DJ_VENV)/bin/python -m pytest -n 2 -q tests/django_project

test-django: $(DJ_STAMP)
	$(DJ_VENV)/bin/python -m pytest -n 2 -q tests/django_project

# Claim latency vs backlog (rota, the naive fair query, FIFO; builds up to 1M rows,
# a few minutes), its EXPLAIN at 1M, and enqueue throughput vs procrastinate and
# pgqueuer. Results in bench/results/; see bench/RESULTS.md. BENCH_ARGS=--quick stops
# at 100k pending.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# Jobs/s and claim latency with 1, 2, 4 and 8 workers over 4 namespaced hosts, with 0 and
# 5 ms added to each round trip (needs root; a private server; a few minutes). The table
# is bench/RESULTS.md's section 7.
bench-hosts: $(STAMP)
	$(BIN)/python -m bench.hosts $(BENCH_HOSTS_ARGS)

# 5,000 jobs (runaway handlers and 5 unreadable poison rows among them), 4 workers
# SIGKILLed at random, one PostgreSQL restart (the embedded server,
# or the machine's when DATABASE_URL names it); prints the checks and one summary line.
# CHAOS_ARGS="--pooler transaction" runs it through a real PgBouncer in front of that
# server. tools/chaos is not shipped: it runs from the repository's root.
chaos: $(STAMP)
	$(BIN)/python -m tools.chaos $(CHAOS_ARGS)

# Workers on 4 hosts (network namespaces, needs root): a long and a short network cut,
# a slow lossy link, a SIGKILL and a PostgreSQL restart; prints the checks and one
# summary line. tools/chaos_hosts is not shipped: it runs from the repository's root.
chaos-hosts: $(STAMP)
	$(BIN)/python -m tools.chaos_hosts

lint: $(STAMP)
	$(BIN)/ruff check src demo tests tools
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(DJ_VENV) .pytest_cache .mypy_cache .ruff_cache $(NODE_CLIENT)/node_modules
