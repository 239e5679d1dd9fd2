#!/usr/bin/env bash
# Pipe, issue and shared-memory utilization of one kernel launch on the GPU machine (ncu sections
# ComputeWorkloadAnalysis, InstructionStats, MemoryWorkloadAnalysis_Chart, WarpStateStats),
# written as the report plus its raw metric page (CSV) under $OUT; prints the pipe lines.
#   [NCU_SKIP=n] scripts/ncu_pipes.sh NAME KERNEL_REGEX COMMAND...
set -u
OUT=${OUT:-/tmp/msa_out}
name=$1 regex=$2
shift 2
mkdir -p "$OUT"
ncu --clock-control none --kernel-name regex:"$regex" --launch-count 1 ${NCU_SKIP:+--launch-skip $NCU_SKIP} \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section WarpStateStats \
  -f -o "$OUT/$name" "$@" > "$OUT/${name}_ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$OUT/$name.ncu-rep" --page raw --csv > "$OUT/${name}_raw.csv" 2>&1
ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
python3 - "$OUT/${name}_raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: sys.exit("no raw rows")
names, vals = rows[0], rows[2]
for n, v in zip(names, vals):
    if ("pipe" in n and "pct_of_peak_sustained_active" in n) or "data_bank" in n or "gpu__time_duration.sum" == n \
       or ("warp_latency_issue_stalled" in n and n.endswith(".ratio")):
        print(f"{n:90s} {v}")
PY
