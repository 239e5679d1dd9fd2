#!/usr/bin/env bash
# One GPU-machine session for the decode: tests, sanitizer (MSA_TEST_SMALL=1), benchmark and
# peers. Uses binaries prebuilt here (BIN, default build-dec) when they run on the machine, else
# builds test_decode_gpu and bench_decode there. Logs go to $OUT; a short table prints last.
#   bench/decode_device.sh [steps...]   steps: tests memcheck racecheck bench peers ncu
set -u
OUT=${OUT:-/tmp/msa_out}
BIN=${BIN:-build-dec}
mkdir -p "$OUT"
steps=${*:-tests memcheck bench peers}
summary=()
t0=$(date +%s)
DEADLINE=${DEADLINE:-280}
left() { local r=$(( DEADLINE - ($(date +%s) - t0) - 5 )); (( r > $1 )) && r=$1; (( r < 10 )) && r=0; echo $r; }

TEST=$BIN/tests/cuda/test_decode_gpu
BENCH=$BIN/bench/bench_decode
if ! "$TEST" --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt binaries do not run here ($("$TEST" --gtest_list_tests 2>&1 | head -2)); building"
  cmake -S . -B build -G Ninja -DMSA_CUDA=ON > "$OUT/cmake.log" 2>&1 &&
    cmake --build build -j16 --target test_decode_gpu bench_decode > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  TEST=build/tests/cuda/test_decode_gpu
  BENCH=build/bench/bench_decode
  summary+=("built on the machine in $(( $(date +%s) - t0 ))s")
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

for step in $steps; do
  start=$(date +%s)
  case $step in
    tests)
      lim=$(left 120)
      timeout $lim "$TEST" > "$OUT/tests.log" 2>&1
      rc=$?
      summary+=("tests rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')$(( $(date +%s) - start ))s")
      grep -E "Failure|error:|Expected|Which is|Value of|DecodeGpu.*\(|FAILED|Actual" "$OUT/tests.log" | head -60 ;;
    memcheck|racecheck)
      lim=$(left 110)
      filter='*'
      [[ $step == racecheck ]] && filter='DecodeGpu.SweepDenseAndSparse:DecodeGpu.Fp8AndF16:DecodeGpu.Skewed*'
      MSA_TEST_SMALL=1 timeout $lim compute-sanitizer --tool $step --error-exitcode 9 \
        "$TEST" --gtest_filter="$filter" > "$OUT/$step.log" 2>&1
      rc=$?
      summary+=("$step rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$step.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$step.log" | tr '\n' ' ')$(( $(date +%s) - start ))s")
      grep -E "Invalid|Race|Error|FAILED|rror" "$OUT/$step.log" | head -20 ;;
    bench)
      lim=$(left 120)
      rm -f "$OUT/bench.json"
      timeout $lim "$BENCH" --iters 30 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
      summary+=("bench rc=$? $(( $(date +%s) - start ))s") ;;
    ncu)
      for c in DEC-B32-dense:0 DEC-MTP:2; do  # CASE:launches to skip (DEC-MTP: its bf16 runs, then fp8)
        lim=$(left 45); (( lim == 0 )) && { summary+=("ncu $c skipped (time)"); continue; }
        timeout $lim ncu --clock-control none --kernel-name regex:decode_kernel --launch-skip ${c##*:} --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
          --section WarpStateStats --section SchedulerStats --section LaunchStats \
          "$BENCH" --case ${c%%:*} --iters 1 --warmup 0 --no-check > "$OUT/ncu_${c%%:*}.log" 2>&1
        summary+=("ncu ${c%%:*} rc=$?")
        grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Registers Per|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_${c%%:*}.log" | head -24
      done ;;
    peers)
      lim=$(left 90)
      timeout $lim python3 bench/peers_decode.py --ours "$OUT/bench.json" > "$OUT/peers.log" 2>&1
      summary+=("peers rc=$? $(( $(date +%s) - start ))s") ;;
  esac
done
echo "=== summary ($(( $(date +%s) - t0 ))s)"
printf '%s\n' "${summary[@]}"
[[ -f $OUT/bench.log ]] && cut -c1-220 "$OUT/bench.log"
[[ -f $OUT/peers.log ]] && tail -8 "$OUT/peers.log"
