#!/usr/bin/env bash
# Pipe, issue and shared-memory utilization of one kernel launch (scripts/ncu_source.sh, pipes mode).
#   [NCU_SKIP=n] scripts/ncu_pipes.sh NAME KERNEL_REGEX COMMAND...
NCU_MODE=pipes exec "$(dirname "$0")/ncu_source.sh" "$@"
