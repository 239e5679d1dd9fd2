#!/usr/bin/env bash
# Issue 31's launch budgets, checked on any machine: bench_latency's LAT-* calls run under the
# stand-in CUDA runtime (bench/host_sim.cpp: no kernel runs, a stream capture counts the
# launches), and each op's launches per call must stay within its budget (a prefill call 4, the
# pipeline 6, decode run() 2; the size functions none), with no memset or other graph node. The GPU suites assert
# the same budgets on real captures (expect_launch_budget); this catches a regression between
# GPU sessions.
#   host_sim_launch_budget.sh BENCH_LATENCY HOST_SIM_DIR
set -euo pipefail
out=$(LD_LIBRARY_PATH="$2" "$1" --host-only --no-check --calls 2 --warmup 0)
echo "$out"
echo "$out" | awk '
  / launches,/ {
    op = $2
    for (i = 1; i <= NF; ++i) {
      if ($(i) ~ /^launches,/) k = $(i - 1)
      if ($(i) ~ /^memsets,/) m = $(i - 1)
      if ($(i) == "other") o = $(i - 1)
    }
    budget = op == "pipeline" ? 6 : (op ~ /^attention_forward/ ? 4 : (op ~ /^decode/ ? 2 : 0))
    if (k > budget || m != 0 || o != 0) {
      printf "over budget: %s %s: %d launches (budget %d), %d memsets, %d other nodes\n", $1, op, k, budget, m, o
      bad = 1
    }
    ++seen
  }
  END {
    if (seen < 22) { printf "expected 22 timed ops (4 cases x 5, and 2 decodes on LAT-CHUNK), saw %d\n", seen; exit 1 }
    exit bad
  }'
