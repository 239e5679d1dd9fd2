// GPU k2q CSR + schedule builder (docs/semantics.md, k2q CSR): q2k -> row_ptr, q_idx and the work
// schedule, bit-identical to the CPU builder. Called by cuda::build_k2q_csr (public API) and by
// sparse attention when the caller passes no K2QIndex. Asynchronous, no allocation,
// graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/index_checks.cuh"

namespace msa::cuda {

// The index inputs (q2k, cu_seqlens_q, key lengths, shape) are the q2k check's, so the builder
// hands itself to launch_q2k_check as is.
struct CsrBuildParams : Q2KCheckParams {
  int64_t total_rows = 0;     // rows of row_ptr; an upper bound when !check_total_rows
  bool check_total_rows = true;  // status csr_rows_short if sum_b nblk_b > total_rows
  bool run_q2k_check = true;  // validate q2k / cu_seqlens into status first
  int32_t* row_ptr = nullptr;   // out [Hkv, total_rows + 1]
  int32_t* q_idx = nullptr;     // out [Hkv, total_q * topk], tail -1
  int32_t* schedule = nullptr;  // out (nullable): sched:: header + one item per non-empty row
  void* workspace = nullptr;    // csr_build_workspace_bytes(...) bytes, 256-byte aligned
  int32_t* status = nullptr;    // int32[4]
};

// Scratch bytes of launch_csr_build for this shape (host function, no device calls).
size_t csr_build_workspace_bytes(int64_t num_kv_heads, int64_t total_rows, int64_t total_q,
                                 int64_t topk);

// Enqueues the build on `stream`: q2k check, per-batch row offsets, sort keys, a stable radix
// sort of (head, row) keys carrying batch-local query ids (so each row's queries come out
// ascending, as on the CPU), row boundaries, and the schedule items.
void launch_csr_build(const CsrBuildParams& p, cudaStream_t stream);

}  // namespace msa::cuda
