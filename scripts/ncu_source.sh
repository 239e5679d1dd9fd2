#!/usr/bin/env bash
# One kernel launch profiled by ncu on the GPU machine, report and exports under $OUT:
#   source (default): warp-stall samples and executed instructions per SASS instruction
#     (SourceCounters), exported as $OUT/NAME_sass.csv; summarize here with
#     scripts/sass_hotspots.py $OUT/NAME_sass.csv.
#   pipes (scripts/ncu_pipes.sh): pipe, issue and shared-memory utilization (ComputeWorkloadAnalysis,
#     InstructionStats, MemoryWorkloadAnalysis), the raw metric page as $OUT/NAME_raw.csv; prints
#     the pipe, bank and stall-ratio lines.
#   [NCU_SKIP=n] [NCU_MODE=source|pipes] scripts/ncu_source.sh NAME KERNEL_REGEX COMMAND...
#   (NCU_SKIP: launches of the kernel to skip first)
set -u
OUT=${OUT:-/tmp/msa_out}
mode=${NCU_MODE:-source}
name=$1 regex=$2
shift 2
mkdir -p "$OUT"
if [[ $mode == pipes ]]; then
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
            --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section WarpStateStats)
else
  sections=(--section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no)
fi
ncu --clock-control none --kernel-name regex:"$regex" --launch-count 1 ${NCU_SKIP:+--launch-skip $NCU_SKIP} \
  "${sections[@]}" -f -o "$OUT/$name" "$@" > "$OUT/${name}_ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
if [[ $mode == pipes ]]; then
  ncu -i "$OUT/$name.ncu-rep" --page raw --csv > "$OUT/${name}_raw.csv" 2>&1
  python3 - "$OUT/${name}_raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: sys.exit("no raw rows")
for n, v in zip(rows[0], rows[2]):  # row 1 holds the units
    if ("pipe" in n and "pct_of_peak_sustained_active" in n) or "data_bank" in n or n == "gpu__time_duration.sum" \
       or ("warp_latency_issue_stalled" in n and n.endswith(".ratio")):
        print(f"{n:90s} {v}")
PY
else
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
  echo "export rc=$? $(wc -l < "$OUT/${name}_sass.csv") lines"
fi
grep -E "Duration|Compute \(SM\)|Issue Slots|No Eligible|Warp Cycles Per Issued" "$OUT/${name}_details.txt" | head
