# Tiering test infrastructure: a MinIO server binary and the Hadoop S3A jars for Spark.
# Both land in $(CACHE) (never committed) and are stamped, so reruns are instant.

# MinIO publishes no semver tags; this pseudo-version is tag RELEASE.2025-09-07T16-13-09Z.
MINIO_VERSION := v0.0.0-20250907161309-07c3a429bfed
MINIO_BIN := $(CACHE)/bin/minio
MINIO_STAMP := $(CACHE)/bin/.minio-$(MINIO_VERSION)

# hadoop-aws must match the Hadoop bundled in pyspark (jars/hadoop-client-api-<ver>.jar);
# it is read from the installed pyspark in the recipe's shell (make's own $(wildcard) caches
# directory listings and would not see a venv created earlier in the same run).
SPARK_JARS_DIR := $(CACHE)/spark-jars
SPARK_JARS_POM := $(CACHE)/spark-jars-pom/pom.xml

# A throw-away pom whose only dependency is hadoop-aws; hadoop-common is `provided` there,
# so the runtime closure is hadoop-aws + the AWS SDK v2 bundle (+ tiny helpers).
define SPARK_JARS_POM_XML
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>seglog</groupId>
  <artifactId>spark-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-aws</artifactId>
      <version>@HADOOP_VERSION@</version>
    </dependency>
  </dependencies>
</project>
endef
export SPARK_JARS_POM_XML

.PHONY: minio spark-jars

minio: $(MINIO_STAMP)

# A stamp without its binary (deleted by hand) must not count as built.
ifeq ($(wildcard $(MINIO_BIN)),)
.PHONY: $(MINIO_STAMP)
endif

$(MINIO_STAMP):
	@mkdir -p $(CACHE)/bin
	@echo "building minio $(MINIO_VERSION) (takes a few minutes cold)"
	GOBIN=$(CACHE)/bin GOFLAGS=-buildvcs=false go install github.com/minio/minio@$(MINIO_VERSION)
	@rm -f $(CACHE)/bin/.minio-*
	touch $@

# hadoop-aws with its runtime closure minus everything pyspark already ships (hadoop-common,
# hadoop-client-*, ...): in practice hadoop-aws itself plus the AWS SDK v2 bundle and the
# small helpers it needs. The stamp records the Hadoop version it was fetched for.
spark-jars: venv
	@set -e; \
	jar=$$(ls $(VENV)/lib/python3*/site-packages/pyspark/jars/hadoop-client-api-*.jar 2>/dev/null | head -n 1); \
	test -n "$$jar" || { echo "pyspark jars not found under $(VENV)"; exit 1; }; \
	ver=$$(basename "$$jar" .jar); ver=$${ver#hadoop-client-api-}; \
	if [ ! -f $(SPARK_JARS_DIR)/.hadoop-$$ver ]; then \
		echo "fetching hadoop-aws $$ver and its AWS SDK bundle"; \
		rm -rf $(SPARK_JARS_DIR) && mkdir -p $(SPARK_JARS_DIR) $(dir $(SPARK_JARS_POM)); \
		printf '%s\n' "$$SPARK_JARS_POM_XML" | sed "s/@HADOOP_VERSION@/$$ver/" > $(SPARK_JARS_POM); \
		mvn -q -B -f $(SPARK_JARS_POM) dependency:copy-dependencies \
			-DincludeScope=runtime -DoutputDirectory=$(SPARK_JARS_DIR); \
		touch $(SPARK_JARS_DIR)/.hadoop-$$ver; \
		ls $(SPARK_JARS_DIR); \
	fi

test-deps: minio spark-jars

# Tiering throughput (file and MinIO) and Spark scan throughput (data source vs plain Parquet).
.PHONY: bench-tier
bench-tier: venv minio spark-jars
	$(BIN)/python -m bench.tier

# Reads of tiered history through the store: the read cache against no cache, same run.
.PHONY: bench-tier-reads
bench-tier-reads: venv minio
	$(BIN)/python -m bench.tier_reads
