# Peer-system comparison benchmark (bench/compare.py).
#
#   make peers        install redis-server (apt), nats-server (go install) and Kafka jars (Maven)
#   make bench        peers + full-size run of every system -> bench/results/<date>.md/.png
#   make bench-quick  peers + quick run of every system      -> bench/results/quick-<date>.md/.png
#   make bench-net    the network benchmark (see below)
#
# Everything lands in $(CACHE) (never committed); stamp files make a second `make peers` instant.
# Not a prerequisite of `test-deps`: the test suite only runs the in-process systems.

NATS_SERVER_VERSION := v2.15.2
KAFKA_VERSION := 4.3.1
KAFKA_SCALA := 2.13
SLF4J_VERSION := 2.0.17
LOG4J_VERSION := 2.24.3

STAMPS := $(CACHE)/stamps
NATS_STAMP := $(STAMPS)/nats-server-$(NATS_SERVER_VERSION)
KAFKA_HOME := $(CACHE)/kafka
KAFKA_STAMP := $(STAMPS)/kafka-$(KAFKA_SCALA)-$(KAFKA_VERSION)
BENCH_SYSTEMS ?= raw,seglog,seglog-arrow,lmdb,sqlite,redis,nats,kafka
BENCH_OUT ?= $(CURDIR)/bench/results

.PHONY: peers peer-redis peer-nats peer-kafka bench bench-quick

peers: peer-redis peer-nats peer-kafka

# `command -v` is the stamp: instant when redis-server is already on PATH.
peer-redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends redis-server; }
	@redis-server --version

peer-nats: $(NATS_STAMP)

$(NATS_STAMP):
	@mkdir -p $(STAMPS) $(CACHE)/bin
	GOBIN=$(CACHE)/bin GOFLAGS=-mod=mod CGO_ENABLED=0 \
	  go install github.com/nats-io/nats-server/v2@$(NATS_SERVER_VERSION)
	$(CACHE)/bin/nats-server --version
	@touch $@

peer-kafka: $(KAFKA_STAMP)

# A throwaway pom whose only job is `dependency:copy-dependencies` of the broker and a log binding.
$(KAFKA_STAMP):
	@mkdir -p $(STAMPS) $(KAFKA_HOME)
	rm -rf $(KAFKA_HOME)/libs
	printf '%s\n' \
	  '<project xmlns="http://maven.apache.org/POM/4.0.0">' \
	  '  <modelVersion>4.0.0</modelVersion>' \
	  '  <groupId>seglog.bench</groupId><artifactId>kafka-peer</artifactId>' \
	  '  <version>1</version><packaging>pom</packaging>' \
	  '  <dependencies>' \
	  '    <dependency><groupId>org.apache.kafka</groupId>' \
	  '      <artifactId>kafka_$(KAFKA_SCALA)</artifactId><version>$(KAFKA_VERSION)</version></dependency>' \
	  '    <dependency><groupId>org.slf4j</groupId>' \
	  '      <artifactId>slf4j-api</artifactId><version>$(SLF4J_VERSION)</version></dependency>' \
	  '    <dependency><groupId>org.apache.logging.log4j</groupId>' \
	  '      <artifactId>log4j-slf4j2-impl</artifactId><version>$(LOG4J_VERSION)</version></dependency>' \
	  '    <dependency><groupId>org.apache.logging.log4j</groupId>' \
	  '      <artifactId>log4j-core</artifactId><version>$(LOG4J_VERSION)</version></dependency>' \
	  '  </dependencies>' \
	  '</project>' > $(KAFKA_HOME)/pom.xml
	mvn -q -B -f $(KAFKA_HOME)/pom.xml -Dmaven.repo.local=$(CACHE)/m2 \
	  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(KAFKA_HOME)/libs
	echo '$(KAFKA_VERSION)' > $(KAFKA_HOME)/VERSION
	@ls $(KAFKA_HOME)/libs | wc -l | xargs echo "kafka jars:"
	@touch $@

bench: venv peers
	$(BIN)/python -m bench.compare --systems $(BENCH_SYSTEMS) --cache $(CACHE) --out $(BENCH_OUT)

bench-quick: venv peers
	$(BIN)/python -m bench.compare --quick --systems $(BENCH_SYSTEMS) --cache $(CACHE) \
	  --out $(BENCH_OUT)

# Network benchmark (issue 12, bench/net.py): one `seglog serve --fsync always` process against
# embedded append_arrow (the baseline) and Kafka through aiokafka -> bench/results/net-<date>.md.
#   make bench-net                          full run
#   make bench-net BENCH_NET_ARGS=--quick   under 3 minutes (bench/results/quick-net-<date>.md)
# Not part of `make test`.
BENCH_NET_ARGS ?=

.PHONY: bench-net
bench-net: venv peer-kafka
	$(BIN)/python -m bench.net --cache $(CACHE) $(BENCH_NET_ARGS)

# This machine's costs that every write-heavy or hand-off-heavy figure pays: page-cache writes
# into recycled pages against fresh guest memory, and a loop -> thread -> loop wake-up
# (bench/machine.py; results in bench/results/machine-<date>.md).
.PHONY: bench-machine
bench-machine: venv
	$(BIN)/python -m bench.machine

# CPU per tick of the node's store work in bench-net's 16-shard end-to-end shape (no network,
# no Kafka; bench/net_tick.py): `make bench-net-tick BEFORE=/path/to/a/worktree` also runs
# that checkout's seglog in alternating runs and prints the ratio.
.PHONY: bench-net-tick
bench-net-tick: venv
	$(BIN)/python -m bench.net_tick $(if $(BEFORE),--before $(BEFORE)) $(BENCH_NET_TICK_ARGS)

# Streams: a selective wildcard read through streams vs a filtered full scan, and the append
# cost of stamping streams against a same-run baseline without (bench/streams.py).
# `make bench-streams QUICK=1` runs the small version and only prints.
.PHONY: bench-streams
bench-streams: venv
	$(BIN)/python -m bench.streams $(if $(QUICK),--quick)

# Wildcard reads over the network: StreamReader against a network scan filtered in the client
# (and the embedded reads) on one `seglog serve` (bench/net_streams.py).
.PHONY: bench-net-streams
bench-net-streams: venv
	$(BIN)/python -m bench.net_streams

# Cluster benchmark (issue 13, bench/cluster.py): etcd + three `seglog serve --fsync always
# --etcd` nodes on this machine against one node, embedded append_arrow and a 3-broker Kafka
# (acks=all, min.insync.replicas=2; --no-kafka skips it), acks all/quorum/1, steady 10k
# records/s acks=all (ack and end-to-end p99), and leader-SIGKILL failover time
# -> bench/results/cluster-<date>.md/.json.
#   make bench-cluster                              full run (20 kills)
#   make bench-cluster BENCH_CLUSTER_ARGS=--quick   under 3 minutes (3 kills)
# Not part of `make test`.
BENCH_CLUSTER_ARGS ?=

.PHONY: bench-cluster
bench-cluster: venv etcd peer-kafka
	$(BIN)/python -m bench.cluster --cache $(CACHE) $(BENCH_CLUSTER_ARGS)

# The tier manifest as history grows (bench/manifest.py): load, save, one upload's manifest
# work and lookups at 1,000 to 100,000 objects; `make bench-manifest BEFORE=<git ref>` also
# runs that commit's seglog (up to 10,000 objects) -> bench/results/manifest-<date>.md/.json.
.PHONY: bench-manifest
bench-manifest: venv
	$(BIN)/python -m bench.manifest $(if $(BEFORE),--before $(BEFORE))

# Many network readers tailing one stream (bench/net_fanout.py): node CPU per append, delivery
# latency and the node's reads per append; `make bench-net-fanout BEFORE=<git ref>` also runs
# nodes of that commit (no shared reads) -> bench/results/net-fanout-<date>.md/.json.
.PHONY: bench-net-fanout
bench-net-fanout: venv
	$(BIN)/python -m bench.net_fanout $(if $(BEFORE),--before $(BEFORE))

# Reading the cluster metadata as databases accumulate (bench/metadata.py): one snapshot
# against a read per database, on a local etcd -> bench/results/metadata-<date>.md/.json.
.PHONY: bench-metadata
bench-metadata: venv etcd
	$(BIN)/python -m bench.metadata
