#!/usr/bin/env bash
# Per-SASS-instruction profile of one kernel launch on the GPU machine: warp-stall samples and
# executed instructions per instruction (ncu SourceCounters), exported as CSV next to the report.
#   [NCU_SKIP=n] scripts/ncu_source.sh NAME KERNEL_REGEX COMMAND...   (writes $OUT/NAME.ncu-rep, $OUT/NAME_sass.csv;
#   NCU_SKIP: launches of the kernel to skip first)
# Summarize here with scripts/sass_hotspots.py $OUT/NAME_sass.csv.
set -u
OUT=${OUT:-/tmp/msa_out}
name=$1 regex=$2
shift 2
mkdir -p "$OUT"
ncu --clock-control none --kernel-name regex:"$regex" --launch-count 1 ${NCU_SKIP:+--launch-skip $NCU_SKIP} \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  --import-source no -f -o "$OUT/$name" "$@" > "$OUT/${name}_ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
echo "export rc=$? $(wc -l < "$OUT/${name}_sass.csv") lines"
ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
grep -E "Duration|Compute \(SM\)|Issue Slots|No Eligible|Warp Cycles Per Issued" "$OUT/${name}_details.txt" | head
