# Fault-injection test tools: strace (syscall order of fsync and acknowledgement, injected
# fsync delays) and e2fsprogs (small ext4 images on loop devices: real ENOSPC and EIO).
# `command -v` is the stamp: instant when both are on PATH.

.PHONY: fault-tools

fault-tools:
	@command -v strace >/dev/null 2>&1 && command -v mkfs.ext4 >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends strace e2fsprogs util-linux mount; }
	@strace -V | head -n 1

test-deps: fault-tools
