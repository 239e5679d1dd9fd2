// GPU benchmark of the sparse prefill and the CSR builder for the bench/CASES.md cases P8K-tok,
// P32K-tok, P32K-blk, P48K-tok, P32K-tok64 / blk64, VARLEN-tok, CSR-32K, the FP8 / FP4 / dense ones
// and the token-sparse TOKSPARSE-* (kv_block_size 1). Called by bench_sparse_fwd (main) and
// by `msa bench --case NAME` (tools/cli): msa_bench::run_sparse_case(name, options).
#pragma once

#include <string>
#include <vector>

namespace msa_bench {

struct SparseBenchOptions {
  int warmup = 3;                // untimed runs after the correctness check
  int iters = 20;                // timed runs (median and spread reported)
  bool check = true;             // compare a sample of rows with a GPU fp32 reference first
  bool flush_l2 = true;          // overwrite a 256 MB buffer before every timed run
  std::string partial = "bf16";  // partial_dtype: "bf16" or "f32"
  std::string json_path;         // append one record per case (bench/SCHEMA.md) when set
  std::string dump_dir;          // write each case's q2k there (int32, raw) for bench/peers.py
};

// The case names this program runs, in bench/CASES.md order.
const std::vector<std::string>& sparse_case_names();

// Runs one case on the current CUDA device; prints one human-readable line and (if asked) the
// JSON record. Returns 0 on success, 1 if the correctness check failed, 2 for an unknown case
// or a missing GPU. Throws msa::Error on library errors.
int run_sparse_case(const std::string& name, const SparseBenchOptions& options);

}  // namespace msa_bench
