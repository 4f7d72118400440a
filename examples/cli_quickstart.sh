#!/bin/sh
# The command line on a new data directory: sh examples/cli_quickstart.sh [DATA_DIR] (seglog on PATH).
set -eu
DATA=${1:-data}
seq 1 5 | seglog produce "$DATA" telemetry --topic sensors/s1/temp --shards 4      # lines from a pipe
printf 'd7:21.5\nd4:19.0\n' | seglog produce "$DATA" telemetry --topic sensors/s2/temp --key-separator : --header unit=C
seglog consume "$DATA" telemetry --max 3                   # every shard, merged by time, as JSON lines
seglog consume "$DATA" telemetry --shard 3 --format raw    # one shard, values only
seglog consume "$DATA" telemetry --topic 'sensors/+/temp' --max 4 --format raw   # an MQTT topic filter
seglog consume "$DATA" telemetry --group dashboards > /dev/null   # commits as it prints
seglog groups "$DATA" telemetry                            # committed offset and lag per shard
seglog stats "$DATA"                                       # read-only: also while a producer runs
