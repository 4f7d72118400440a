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
