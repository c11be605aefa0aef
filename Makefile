# Each target bootstraps .venv from the project's own files when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-dashboard test lint bench bench-hosts chaos chaos-hosts clean

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

test: $(STAMP) $(NODE_STAMP)
	ROTA_NODE_CLIENT=required $(BIN)/python -m pytest -n 2 -q

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
# tools/chaos is not shipped: it runs from the repository's root.
chaos: $(STAMP)
	$(BIN)/python -m tools.chaos

# Workers on 4 hosts (network namespaces, needs root): a long and a short network cut,
# a slow lossy link, a SIGKILL and a PostgreSQL restart; prints the checks and one
# summary line. tools/chaos_hosts is not shipped: it runs from the repository's root.
chaos-hosts: $(STAMP)
	$(BIN)/python -m tools.chaos_hosts

lint: $(STAMP)
	$(BIN)/ruff check src demo tests tools
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(NODE_CLIENT)/node_modules
