# etcd for cluster metadata tests: Debian's etcd-server (3.4), installed once with apt.
# Tests start their own etcd processes on loopback ports (tests/etcd_fixtures.py); the
# package's systemd unit is never used.

.PHONY: etcd
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends etcd-server; }
	@etcd --version | head -1

test-deps: etcd

# The Jepsen-style fault test over many seeded schedules (tests/chaos.py); not part of `make test`
# (which runs one 20 s schedule). `make chaos CHAOS_RUNS=5 CHAOS_SECONDS=30` for a shorter one.
CHAOS_RUNS ?= 20
CHAOS_SECONDS ?= 60
.PHONY: chaos
chaos: venv etcd
	$(BIN)/python -m tests.chaos --runs $(CHAOS_RUNS) --seconds $(CHAOS_SECONDS)
