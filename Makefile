# Everything bootstraps from nothing: a venv in .venv, tools and artifacts in .cache.
PY ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
CACHE := $(CURDIR)/.cache
DEMO_DATA ?= $(CURDIR)/demo-data

.PHONY: venv demo test lint typecheck unit clean

# setup.py builds the C topic cache (seglog/topics/_topic_cache.c): an edit rebuilds it.
$(BIN)/.installed: pyproject.toml setup.py seglog/topics/_topic_cache.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

# The embedded demo, then the cluster demo (about 20 s more). The embedded one needs no etcd
# and runs first either way.
demo: venv
	$(BIN)/seglog demo $(DEMO_DATA)
	$(MAKE) --no-print-directory demo-cluster

# Cluster demo (issue 13): etcd + 3 `seglog serve` nodes in a temporary directory, acks="all"
# keyed producer, shard 0's leader SIGKILLed mid-stream, everything read back: exits 1 if an
# acknowledged record is missing. `make demo-cluster DEMO_CLUSTER_ARGS="--seconds 20 --keep"`.
DEMO_CLUSTER_ARGS ?=

.PHONY: demo-cluster
demo-cluster: venv etcd
	$(BIN)/seglog demo-cluster $(DEMO_CLUSTER_ARGS)

lint: venv
	$(BIN)/ruff check seglog tests bench examples
	$(BIN)/ruff format --check seglog tests bench examples

typecheck: venv
	$(BIN)/mypy seglog

unit: venv
	$(BIN)/pytest -q

test: lint typecheck test-deps
	$(BIN)/pytest -q -p no:cacheprovider

clean:
	rm -rf $(DEMO_DATA) build *.egg-info

# Fragments add targets and prerequisites of `test-deps` (MinIO, Spark jars, peers).
test-deps: venv
include $(wildcard mk/*.mk)

.PHONY: bench-core
bench-core: venv
	$(BIN)/python -m bench.core

# Subscriptions: 10,000 subscribers on 100 streams at 50,000 records/s.
.PHONY: bench-subs
bench-subs: venv
	$(BIN)/python -m bench.subscriptions

# Transparent huge pages kept vs turned off, in alternating child processes.
.PHONY: bench-thp
bench-thp: venv
	$(BIN)/python -m bench.thp

# Keyed appends and read_key; `make bench-keys BEFORE=<git ref>` also runs that commit's seglog.
.PHONY: bench-keys
bench-keys: venv
	$(BIN)/python -m bench.keys $(if $(BEFORE),--before $(BEFORE))
