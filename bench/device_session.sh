#!/usr/bin/env bash
# One GPU-machine session for every CUDA op: GPU tests, compute-sanitizer (MSA_TEST_SMALL=1),
# benchmarks with their correctness checks, peers in the same run, and an ncu profile. Runs the
# binaries that `make device-bin` built here and the device call carries (BIN, default
# build-device-bin). Logs go to $OUT; a short summary prints last. Records (bench/SCHEMA.md): the
# benchmark programs' in $OUT/records.jsonl, the peers' in $OUT/peers.jsonl; `python3
# bench/plot.py records.jsonl peers.jsonl --out DIR` draws them.
#   bench/device_session.sh [steps...]
#   steps: tests memcheck racecheck synccheck initcheck bench ab peers pytest soak demo examples pybench latency
#          merge (the merging KV-major kernel against the combine path: bitwise test, A/B, suites)
#          bsr (bench/bsr_bench.py: BSR-108K, BSR-32K-R1 and FlexAttention on the same mask; the wheel)
#          icp (bench/icp_bench.py: ICP-DECODE-B64, ICP-PREFILL-128K; WORLD=2 for a real group)
#          ncu-sparse ncu-uniform ncu-indexer ncu-indexer-fp8 ncu-decode
#          ncu-times ncu-combine ncu-mtp (the FP8 DEC-MTP launch) bench-sparse
#          decode-read (bench_decode and its peers with MSA_BENCH_FLUSH=read: an L2 of clean lines);
#          ab (BIN_OLD=dir: old against new binaries, bench/compare.py's table);
#          TESTS="..." limits the test suites (tests and the compute-sanitizer tools), PAR=N runs N
#          of them at a time; SHARDED="..." (default test_sparse_fwd, ~400 s serial on the H200, its
#          CPU references the time) runs each such suite as SHARDS (default 3) gtest shards at
#          once, under a cap of 300 s instead of 120;
#          soak (scripts/gpu_soak.py: SOAK_CALLS random valid and invalid calls through the Python
#          API on CUDA tensors, default 10000; $OUT/soak.json, $OUT/soak.log)
#   (pytest and soak install the cp312 wheel that `make device-wheel` left in .whl/: carry .whl too)
#   (default: tests bench peers). DEADLINE (s, default 540) bounds the whole session.
set -u
OUT=${OUT:-/tmp/msa_out}
BIN=${BIN:-build-device-bin}
mkdir -p "$OUT" /tmp/msa_dump
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
steps=${*:-tests bench peers}
TESTS=${TESTS:-"test_index_checks test_quant_gpu test_topk_gpu test_indexer_gpu test_icp_gpu test_csr_build test_logits_gpu test_token_topk_gpu test_sparse_fwd test_sparse_fwd_paged test_decode_gpu test_pipeline_gpu test_sdsa_gpu"}
summary=()
t0=$(date +%s)
DEADLINE=${DEADLINE:-540}
# left N: seconds a step may use (its cap N, never past the deadline); 0 = skip the step
left() { local r=$(( DEADLINE - ($(date +%s) - t0) - 10 )); (( r > $1 )) && r=$1; (( r < 15 )) && r=0; echo $r; }
passed() { grep -E '^\[  (PASSED|FAILED)' "$1" | tr '\n' ' '; }

"$BIN/test_index_checks" --gtest_list_tests > /dev/null 2>&1 ||
  { echo "binaries in $BIN do not run here; run 'make device-bin' and carry $BIN"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

# Installs the wheel that `make device-wheel` left in .whl/ (once per session).
install_wheel() {
  [[ -n ${wheel_installed:-} ]] && return 0
  local whl; whl=$(ls .whl/msa*-cp3*.whl 2>/dev/null | head -1)
  [[ -z $whl ]] && { summary+=("no .whl/msa*.whl (make device-wheel, carry .whl)"); return 1; }
  python3 -m pip install -q --no-deps --no-index --force-reinstall "$whl" > "$OUT/wheel_install.log" 2>&1 &&
    wheel_installed=1
}

ncu_step() {  # name, kernel regex, command...
  local name=$1 regex=$2; shift 2
  local lim; lim=$(left 120); (( lim == 0 )) && { summary+=("ncu $name skipped (time)"); return; }
  timeout $lim ncu --clock-control none --kernel-name regex:"$regex" --launch-count ${NCU_COUNT:-1} \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section SchedulerStats ${NCU_EXTRA:-} "$@" > "$OUT/ncu_$name.log" 2>&1
  summary+=("ncu $name rc=$?")
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|No Eligible|Achieved Occupancy|Warp Cycles Per Issued" "$OUT/ncu_$name.log" | head -14
}

for step in $steps; do
  start=$(date +%s)
  case $step in
    tests|memcheck|racecheck|synccheck|initcheck)
      # PAR suites at a time (default 1): each runs in its own process on the one GPU, and its
      # summary line is collected in suite order once all have finished.
      for t in $TESTS; do
        if [[ $step == tests ]]; then lim=$(left 120); else lim=$(left 90); fi
        (( lim == 0 )) && { echo "$step $t skipped (time)" > "$OUT/.sum_${step}_$t"; continue; }
        (
          if [[ $step == tests && " ${SHARDED-test_sparse_fwd} " == *" $t "* ]]; then
            lim=$(left 300); n=${SHARDS:-3}; rcs=""
            for ((i = 0; i < n; ++i)); do
              GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout $lim "$BIN/$t" > "$OUT/$t.$i.log" 2>&1 &
            done
            for ((i = 0; i < n; ++i)); do wait -n; rcs+="$? "; done
            cat "$OUT"/$t.*.log > "$OUT/$t.log" && rm -f "$OUT"/$t.*.log
            echo "$t ($n shards) rc=$rcs$(passed "$OUT/$t.log")" > "$OUT/.sum_${step}_$t"
            grep -E "Failure|Expected|Which is|FAILED  \]" "$OUT/$t.log" | head -12
          elif [[ $step == tests ]]; then
            timeout $lim "$BIN/$t" > "$OUT/$t.log" 2>&1
            echo "$t rc=$? $(passed "$OUT/$t.log")" > "$OUT/.sum_${step}_$t"
            grep -E "Failure|Expected|Which is|FAILED  \]" "$OUT/$t.log" | head -12
          else
            MSA_TEST_SMALL=1 timeout $lim compute-sanitizer --tool $step --error-exitcode 9 \
              "$BIN/$t" > "$OUT/${step}_$t.log" 2>&1
            echo "$step $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/${step}_$t.log" | tail -1)" \
              > "$OUT/.sum_${step}_$t"
          fi
        ) &
        while (( $(jobs -rp | wc -l) >= ${PAR:-1} )); do wait -n; done
      done
      wait
      for t in $TESTS; do summary+=("$(cat "$OUT/.sum_${step}_$t" 2>/dev/null)"); rm -f "$OUT/.sum_${step}_$t"; done ;;
    bench)
      rm -f "$OUT"/records.jsonl "$OUT"/bench_indexer.log
      lim=$(left 200); (( lim > 0 )) && { timeout $lim "$BIN/bench_sparse_fwd" --json "$OUT/records.jsonl" \
        --dump /tmp/msa_dump --iters ${ITERS:-10} --warmup 2 > "$OUT/bench_sparse.log" 2>&1;
        summary+=("bench_sparse_fwd rc=$?"); }
      for fp8 in 0 1 tensor; do  # tensor: FP8 with one scale per tensor (IDX-32K-fp8-tensor)
        args="--fp8 $fp8"; [[ $fp8 == tensor ]] && args="--fp8 1 --fp8-scales tensor"
        lim=$(left 90); (( lim > 0 )) && { timeout $lim "$BIN/bench_indexer" $args \
          --json "$OUT/records.jsonl" >> "$OUT/bench_indexer.log" 2>&1; summary+=("bench_indexer fp8=$fp8 rc=$?"); }
      done
      lim=$(left 120); (( lim > 0 )) && { timeout $lim "$BIN/bench_decode" --iters 30 \
        --json "$OUT/records.jsonl" > "$OUT/bench_decode.log" 2>&1; summary+=("bench_decode rc=$?"); }
      lim=$(left 120); (( lim > 0 )) && { timeout $lim "$BIN/bench_pipeline" --json "$OUT/records.jsonl" \
        > "$OUT/bench_pipeline.log" 2>&1; summary+=("bench_pipeline rc=$?"); } ;;
    ab)  # old (BIN_OLD) and new (BIN) binaries on every named benchmark case, one program at a
         # time, the two back to back; bench/compare.py prints the per-case ratio table
      if [[ -z ${BIN_OLD:-} ]]; then summary+=("ab: set BIN_OLD to the old binaries"); continue; fi
      rm -f "$OUT"/ab_old.jsonl "$OUT"/ab_new.jsonl "$OUT"/ab_old.log "$OUT"/ab_new.log
      ab_run() {  # cap (s), program, args...: old, new, new, old (drift cancels in the means)
        local cap=$1 prog=$2 side bin lim; shift 2
        for side in old new new old; do
          bin=$BIN; [[ $side == old ]] && bin=$BIN_OLD
          lim=$(left $cap); (( lim == 0 )) && { summary+=("ab $prog $side skipped (time)"); continue; }
          timeout $lim "$bin/$prog" "$@" --json "$OUT/ab_$side.jsonl" >> "$OUT/ab_$side.log" 2>&1
          summary+=("ab $prog $* $side rc=$?")
        done
      }
      ab_run 80 bench_sparse_fwd --iters ${ITERS:-10} --warmup 2 --no-check
      ab_run 60 bench_indexer --fp8 0
      ab_run 60 bench_indexer --fp8 1
      ab_run 60 bench_indexer --fp8 1 --fp8-scales tensor
      ab_run 90 bench_decode --iters 30 --no-check
      ab_run 60 bench_pipeline
      ab_run 30 bench_latency
      python3 bench/compare.py "$OUT/ab_old.jsonl" "$OUT/ab_new.jsonl" > "$OUT/ab.md" 2>&1
      cat "$OUT/ab.md" ;;
    merge)  # the merging KV-major kernel (docs/kernels/sparse_fwd.md) against the combine path:
            # the bitwise test, then the per-token cases and LAT-8K with MSA_SPARSE_FWD_MERGE
            # 0 / 1 / 1 / 0 (compare.py: old = 0, new = 1), then the two sparse suites with it on
      lim=$(left 90); (( lim > 0 )) && { timeout $lim "$BIN/test_sparse_fwd" \
        --gtest_filter='*MergeMatchesCombineBitwise*:*CallIsFour*' > "$OUT/merge_bitwise.log" 2>&1
        summary+=("merge bitwise rc=$? $(passed "$OUT/merge_bitwise.log")"); }
      rm -f "$OUT"/merge_0.jsonl "$OUT"/merge_1.jsonl
      for m in 0 1 1 0; do
        lim=$(left 60); (( lim == 0 )) && { summary+=("merge=$m skipped (time)"); continue; }
        MSA_SPARSE_FWD_MERGE=$m timeout $lim "$BIN/bench_sparse_fwd" --case P8K-tok --case P32K-tok \
          --case VARLEN-tok --case P32K-blk --iters ${ITERS:-10} --warmup 2 --no-check \
          --json "$OUT/merge_$m.jsonl" >> "$OUT/merge_$m.log" 2>&1
        summary+=("merge=$m bench_sparse_fwd rc=$?")
        lim=$(left 40); (( lim > 0 )) && MSA_SPARSE_FWD_MERGE=$m timeout $lim "$BIN/bench_latency" \
          --case LAT-8K --op pipeline --op attention_forward --json "$OUT/merge_$m.jsonl" >> "$OUT/merge_$m.log" 2>&1
      done
      python3 bench/compare.py "$OUT/merge_0.jsonl" "$OUT/merge_1.jsonl" > "$OUT/merge.md" 2>&1
      cat "$OUT/merge.md"
      for t in test_sparse_fwd_paged test_pipeline_gpu; do
        lim=$(left 120); (( lim == 0 )) && continue
        MSA_SPARSE_FWD_MERGE=1 timeout $lim "$BIN/$t" > "$OUT/merge_$t.log" 2>&1
        summary+=("merge=1 $t rc=$? $(passed "$OUT/merge_$t.log")")
      done ;;
    bench-sparse)  # bench_sparse_fwd alone (its cases only; peers then compare those)
      rm -f "$OUT"/records.jsonl
      lim=$(left 200); (( lim > 0 )) && { timeout $lim "$BIN/bench_sparse_fwd" --json "$OUT/records.jsonl" \
        --dump /tmp/msa_dump --iters ${ITERS:-10} --warmup 2 > "$OUT/bench_sparse.log" 2>&1;
        summary+=("bench_sparse_fwd rc=$?"); } ;;
    peers)
      lim=$(left 200); (( lim > 0 )) && { PYTHONUNBUFFERED=1 timeout $lim python3 bench/peers.py --dump /tmp/msa_dump \
        --ours "$OUT/records.jsonl" --e2e "$OUT/records.jsonl" --json "$OUT/peers.jsonl" --iters 5 \
        > "$OUT/peers_sparse.log" 2>&1; summary+=("peers.py rc=$?"); }
      lim=$(left 150); (( lim > 0 )) && { PYTHONUNBUFFERED=1 timeout $lim python3 bench/peers_toksparse.py \
        --dump /tmp/msa_dump --ours "$OUT/records.jsonl" --json "$OUT/peers.jsonl" --iters 5 \
        > "$OUT/peers_toksparse.log" 2>&1; summary+=("peers_toksparse.py rc=$?"); }
      lim=$(left 90); [[ -f $OUT/records.jsonl ]] && (( lim > 0 )) && { timeout $lim python3 bench/peers_decode.py \
        --ours "$OUT/records.jsonl" --json "$OUT/peers.jsonl" \
        > "$OUT/peers_decode.log" 2>&1; summary+=("peers_decode.py rc=$?"); } ;;
    decode-read)
      lim=$(left 120); (( lim > 0 )) && { MSA_BENCH_FLUSH=read timeout $lim "$BIN/bench_decode" --iters 30 \
        --json "$OUT/records.jsonl" > "$OUT/bench_decode_read.log" 2>&1; summary+=("bench_decode (read flush) rc=$?"); }
      lim=$(left 90); [[ -f $OUT/records.jsonl ]] && (( lim > 0 )) && { MSA_BENCH_FLUSH=read timeout $lim \
        python3 bench/peers_decode.py --ours "$OUT/records.jsonl" --json "$OUT/peers.jsonl" \
        > "$OUT/peers_decode_read.log" 2>&1;
        summary+=("peers_decode.py (read flush) rc=$?"); } ;;
    demo)  # msa demo at its default GPU shape (the serving pipeline against the dense reference)
      lim=$(left 120); (( lim > 0 )) && { timeout $lim "$BIN/msa" demo > "$OUT/demo.log" 2>&1;
        summary+=("msa demo rc=$?"); grep -E "^  |dense reference|sparse pipeline|result" "$OUT/demo.log"; } ;;
    examples)  # the Python examples on CUDA (needs the wheel: run after pytest, or install it)
      install_wheel && for ex in examples/python/sparse_layer.py examples/python/serving_backend.py; do
        lim=$(left 120); (( lim == 0 )) && break
        (cd /tmp && timeout $lim python3 "$OLDPWD/$ex" --device cuda) > "$OUT/$(basename "$ex" .py).log" 2>&1
        summary+=("$ex rc=$? $(tail -1 "$OUT/$(basename "$ex" .py).log")")
      done ;;
    latency)  # the LAT-* cases: bench_latency, then the Python API and FA4 / cuDNN dense on the
              # same shapes (needs the wheel; FA4 when PEERS.md's /tmp/site is installed)
      install_wheel || continue
      rm -f "$OUT"/latency_cpp.jsonl
      lim=$(left 120); (( lim > 0 )) && { timeout $lim "$BIN/bench_latency" --json "$OUT/latency_cpp.jsonl" \
        > "$OUT/latency_cpp.log" 2>&1; summary+=("bench_latency rc=$?"); cat "$OUT/latency_cpp.log"; }
      fa4_path=""; [[ -d /tmp/site ]] && fa4_path=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
      lim=$(left 200); (( lim > 0 )) && { (cd /tmp && PYTHONPATH=$fa4_path PYTHONUNBUFFERED=1 timeout $lim \
        python3 "$OLDPWD/bench/python_bench.py" --latency-cpp "$OUT/latency_cpp.jsonl" \
        --json "$OUT/latency_py.jsonl") > "$OUT/latency_py.log" 2>&1; summary+=("python_bench latency rc=$?");
        tail -8 "$OUT/latency_py.log"; } ;;
    bsr)  # BSR-108K / BSR-32K-R1 through msa.BlockSparseAttention, Flex on the same mask (the wheel)
      install_wheel || continue
      lim=$(left 200); (( lim > 0 )) && { (cd /tmp && PYTHONUNBUFFERED=1 timeout $lim python3 \
        "$OLDPWD/bench/bsr_bench.py" --iters ${ITERS:-20} --json "$OUT/bsr.jsonl") > "$OUT/bsr.log" 2>&1
        summary+=("bsr_bench rc=$?"); tail -7 "$OUT/bsr.log"; } ;;
    icp)  # ICP-PREFILL-128K / ICP-DECODE-B64 (bench/icp_bench.py, the wheel): a real group with
          # WORLD GPUs when given (NCCL), else ranks in turn on this GPU (--simulate 2)
      install_wheel || continue
      if [[ -n ${WORLD:-} ]]; then icp_mode="--world $WORLD"; else icp_mode="--simulate 2"; fi
      for c in ICP-DECODE-B64 ICP-PREFILL-128K; do
        lim=$(left 200); (( lim > 0 )) || break
        (cd /tmp && PYTHONUNBUFFERED=1 timeout $lim python3 "$OLDPWD/bench/icp_bench.py" --case $c \
          $icp_mode --json "$OUT/records.jsonl") >> "$OUT/icp.log" 2>&1
        summary+=("icp_bench $c rc=$?")
      done
      # The C++ driver (NCCL from the machine's nvidia-nccl wheel) on a real group.
      if [[ -n ${WORLD:-} && -x $BIN/msa_icp_driver ]] && (( $(left 120) > 0 )); then
        nccl_lib=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")/lib
        LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0 timeout $(left 120) \
          "$BIN/msa_icp_driver" --world $WORLD --keys 131072 --queries 4096 >> "$OUT/icp.log" 2>&1
        summary+=("msa_icp_driver rc=$?")
      fi
      tail -6 "$OUT/icp.log" ;;
    pybench)  # the Python API against the C++ figures of the same run (needs the wheel)
      install_wheel || continue
      lim=$(left 200); (( lim > 0 )) && { timeout $lim "$BIN/bench_sparse_fwd" --case P8K-tok --case P32K-tok \
        --case P32K-blk --json "$OUT/pybench_cpp.jsonl" --dump /tmp/msa_dump --iters ${ITERS:-20} --warmup 3 \
        > "$OUT/pybench_cpp.log" 2>&1; summary+=("bench_sparse_fwd (pybench) rc=$?"); }
      lim=$(left 60); (( lim > 0 )) && { timeout $lim "$BIN/bench_latency" --json "$OUT/pybench_cpp.jsonl" \
        >> "$OUT/pybench_cpp.log" 2>&1; summary+=("bench_latency rc=$?"); }
      lim=$(left 200); (( lim > 0 )) && { (cd /tmp && PYTHONUNBUFFERED=1 timeout $lim python3 "$OLDPWD/bench/python_bench.py" \
        --dump /tmp/msa_dump --cpp "$OUT/pybench_cpp.jsonl" --latency-cpp "$OUT/pybench_cpp.jsonl" \
        --iters ${ITERS:-20} --json "$OUT/pybench.jsonl") > "$OUT/pybench.log" 2>&1; summary+=("python_bench rc=$?"); }
      grep -E "median|host" "$OUT/pybench_cpp.log" | cut -c1-160; cat "$OUT/pybench.log" ;;
    pytest)
      if install_wheel; then
        lim=$(left 240); (( lim > 0 )) && (cd /tmp && timeout $lim python3 -m pytest "$OLDPWD/python/tests" -q -rs \
          -p no:cacheprovider > "$OUT/pytest.log" 2>&1); summary+=("pytest rc=$? $(tail -1 "$OUT/pytest.log")")
        grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
      fi ;;
    soak)  # the Python API soak on CUDA (scripts/gpu_soak.py); exit status 1 on any defect
      install_wheel || continue
      lim=$(left 420); (( lim > 0 )) && { (cd /tmp && PYTHONUNBUFFERED=1 timeout $lim python3 \
        "$OLDPWD/scripts/gpu_soak.py" --calls ${SOAK_CALLS:-10000} --json "$OUT/soak.json") \
        > "$OUT/soak.log" 2>&1; summary+=("soak rc=$? $(tail -1 "$OUT/soak.log")"); }
      grep -A3 -E "^(rejected_valid|accepted_invalid|other_exception|wrong|crash) " "$OUT/soak.log" | head -20 ;;
    ncu-sparse) ncu_step sparse "sparse_fwd_kernel" "$BIN/bench_sparse_fwd" --case P32K-tok --iters 1 --warmup 0 --no-check ;;
    ncu-uniform) ncu_step uniform "uniform_kernel" "$BIN/bench_sparse_fwd" --case P32K-blk --iters 1 --warmup 0 --no-check ;;
    ncu-indexer) ncu_step indexer "block_scores_kernel" "$BIN/bench_indexer" --seq 16384 --iters 1 --warmup 0 ;;
    ncu-indexer-fp8) ncu_step indexer_fp8 "block_scores_kernel" "$BIN/bench_indexer" --seq 16384 --fp8 1 \
      --iters 1 --warmup 0 ;;
    ncu-times)  # every kernel's duration in one iteration of the prefill cases (prep, main, combine)
      lim=$(left 120); (( lim > 0 )) && { timeout $lim ncu --clock-control none --metrics gpu__time_duration.sum \
        --csv "$BIN/bench_sparse_fwd" --case P32K-blk --case P8K-tok --case P32K-tok --iters 1 --warmup 0 \
        --no-check --no-flush > "$OUT/ncu_times.log" 2>&1; summary+=("ncu times rc=$?");
        grep gpu__time_duration "$OUT/ncu_times.log" | awk -F'","' '{printf "%-60.60s %s\n", $5, $NF}' | tr -d '"' | head -60; } ;;
    ncu-combine) ncu_step combine "combine_kernel" "$BIN/bench_sparse_fwd" --case P32K-tok --iters 1 --warmup 0 --no-check ;;
    ncu-mtp) NCU_EXTRA="--launch-skip 2" ncu_step mtp "decode_kernel" "$BIN/bench_decode" --case DEC-MTP --iters 1 --warmup 0 --no-check ;;
    ncu-decode) ncu_step decode "decode_kernel" "$BIN/bench_decode" --case DEC-B32-dense --iters 1 --warmup 0 --no-check ;;
    *) summary+=("unknown step $step") ;;
  esac
  summary+=("  ($step: $(( $(date +%s) - start ))s)")
done
echo "==== summary ($(( $(date +%s) - t0 ))s)"
printf '%s\n' "${summary[@]}"
for f in bench_sparse bench_indexer bench_decode bench_pipeline bench_decode_read; do [[ -f $OUT/$f.log ]] && cut -c1-200 "$OUT/$f.log" | grep -vE "^\s*$" | tail -8; done
for f in peers_sparse peers_decode peers_decode_read; do [[ -f $OUT/$f.log ]] && grep -v Warning "$OUT/$f.log" | tail -8; done
# At most 8 files come back from a device call: the logs travel as one archive (records stay loose).
# A second session in the same call writes logs_2.tgz (and so on) instead of replacing the first.
printf '%s\n' "${summary[@]}" > "$OUT/summary.txt"
archive=logs.tgz n=1
while [[ -e $OUT/$archive ]]; do n=$((n + 1)); archive=logs_$n.tgz; done
(cd "$OUT" && tar czf "$archive" --remove-files *.log summary.txt 2>/dev/null)
