#!/usr/bin/env bash
# One GPU-machine session for the sparse prefill: tests, benchmark, peers, sanitizer, profile.
# Uses binaries prebuilt here (BIN, default build-gpu-bin) when they run on the machine, else
# builds the needed targets there. Logs go to $OUT (or /tmp/msa_out); a short table prints last.
#   bench/run_device.sh [steps...]   steps: tests bench peers sanitize ncu (default: tests bench)
set -u
OUT=${OUT:-/tmp/msa_out}
BIN=${BIN:-build-gpu-bin}
mkdir -p "$OUT"
steps=${*:-tests bench}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
summary=()
t0=$(date +%s)
DEADLINE=${DEADLINE:-560}
# left N: seconds a step may use (its own cap N, never past the deadline); 0 = skip the step
left() { local r=$(( DEADLINE - ($(date +%s) - t0) - 10 )); (( r > $1 )) && r=$1; (( r < 20 )) && r=0; echo $r; }

if ! "$BIN/test_sparse_fwd" --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt binaries do not run here; building"
  cmake -S . -B build -G Ninja -DMSA_CUDA=ON > "$OUT/cmake.log" 2>&1 &&
    cmake --build build -j16 --target test_sparse_fwd test_csr_build bench_sparse_fwd \
      > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  BIN=build-bin
  mkdir -p $BIN
  cp build/tests/cuda/test_sparse_fwd build/tests/cuda/test_csr_build build/bench/bench_sparse_fwd $BIN/
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

for step in $steps; do
  case $step in
    tests)
      for t in test_csr_build test_sparse_fwd; do
        start=$(date +%s)
        lim=$(left 150); (( lim == 0 )) && { summary+=("$t skipped (time)"); continue; }
        timeout $lim "$BIN/$t" > "$OUT/$t.log" 2>&1
        rc=$?
        summary+=("$t rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ') $(( $(date +%s) - start ))s")
        grep -E "Failure|error|Expected|Which is|Value of|case [0-9]+:|FAILED" "$OUT/$t.log" | head -40
      done ;;
    bench)
      rm -f "$OUT/bench.json"
      mkdir -p /tmp/msa_dump
      lim=$(left 200); (( lim == 0 )) && { summary+=("bench skipped (time)"); continue; }
      timeout $lim "$BIN/bench_sparse_fwd" --json "$OUT/bench.json" --dump /tmp/msa_dump \
        --iters ${ITERS:-10} --warmup 2 2>&1 | tee "$OUT/bench.log"
      summary+=("bench rc=${PIPESTATUS[0]}") ;;
    peers)
      lim=$(left 170); (( lim == 0 )) && { summary+=("peers skipped (time)"); continue; }
      PYTHONUNBUFFERED=1 timeout $lim python3 bench/peers.py --dump /tmp/msa_dump \
        --ours "$OUT/bench.json" --iters 5 2>&1 | tee "$OUT/peers.log" | grep -v Warning
      summary+=("peers rc=${PIPESTATUS[0]}") ;;
    sanitize)
      for tool in racecheck memcheck; do
        for t in test_sparse_fwd test_csr_build; do
          lim=$(left 60); (( lim == 0 )) && { summary+=("sanitizer $tool $t skipped (time)"); continue; }
          MSA_TEST_SMALL=1 timeout $lim compute-sanitizer --tool $tool --error-exitcode 9 \
            "$BIN/$t" > "$OUT/san_${tool}_$t.log" 2>&1
          rc=$?
          summary+=("sanitizer $tool $t rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_$t.log" | tr '\n' ' ')")
        done
      done ;;
    ncu)
      lim=$(left 120); (( lim == 0 )) && { summary+=("ncu skipped (time)"); continue; }
      timeout $lim ncu --clock-control none --kernel-name regex:"sparse_fwd_kernel|sparse_fwd_uniform_kernel|combine_kernel" \
        --launch-skip 0 --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats \
        "$BIN/bench_sparse_fwd" --case P32K-tok --iters 1 --warmup 0 --no-check \
        > "$OUT/ncu.log" 2>&1
      summary+=("ncu rc=$?")
      grep -E "sparse_fwd_kernel|combine_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers|Stall|Issue Slots" "$OUT/ncu.log" | head -40 ;;
    sass)
      cuobjdump --dump-sass "$BIN/bench_sparse_fwd" > /tmp/sass.txt 2>&1
      summary+=("sass: HGMMA $(grep -c HGMMA /tmp/sass.txt) UTMALDG $(grep -c UTMALDG /tmp/sass.txt) LDL $(grep -c 'LDL' /tmp/sass.txt)") ;;
  esac
done
echo "==== summary ===="
for s in "${summary[@]}"; do echo "$s"; done
