// Host-side geometry of a varlen batch (token -> batch, kv blocks, CSR rows) and the q2k / k2q /
// schedule routines shared by the CPU CSR builder (cpu/csr.cpp), the public CPU converters
// (api/csr.cpp) and CPU attention (cpu/attention.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "msa/csr.h"

namespace msa::cpu {

// Lengths and offsets of a varlen batch, read once from host tensors.
struct BatchGeometry {
  int64_t kv_block_size = 128;
  std::vector<int64_t> q_start;      // [B+1] cu_seqlens_q
  std::vector<int64_t> key_len;      // [B] Lk_b
  std::vector<int64_t> row_start;    // [B+1] rowoff_b = sum_{b'<b} nblk_b'; [B] = total_rows
  std::vector<int64_t> token_batch;  // [total_q] batch of each token

  int64_t batch() const { return int64_t(key_len.size()); }
  int64_t total_q() const { return q_start.back(); }
  int64_t total_rows() const { return row_start.back(); }
  int64_t q_len(int64_t b) const { return q_start[b + 1] - q_start[b]; }
  int64_t num_blocks(int64_t b) const { return row_start[b + 1] - row_start[b]; }
  int64_t max_blocks() const;
};

// cu_seqlens_q: validated host [B+1] int32; key_len: Lk_b for each batch.
BatchGeometry batch_geometry(const Tensor& cu_seqlens_q, std::vector<int64_t> key_len,
                             int64_t kv_block_size);

// Throws msa::Error (the describe_status message, identical to the GPU's) at the first
// (head, token, slot) in lexicographic order whose id is outside [-1, nblk_b) or repeats an
// earlier id of its row. q2k: validated host [Hkv, total_q, topk] int32, contiguous.
void check_q2k_ids(const Tensor& q2k, const BatchGeometry& g);

// Writes the k2q CSR of a checked q2k: row_ptr [Hkv, rows+1], q_idx [Hkv, total_q*topk] (both
// contiguous int32), each row's batch-local query ids ascending, q_idx's tail -1. rows >=
// g.total_rows(); the rows past g.total_rows() are empty.
void fill_k2q(const Tensor& q2k, const BatchGeometry& g, int64_t rows, int32_t* row_ptr,
              int32_t* q_idx);

// The inverse, for tests: writes q2k [Hkv, total_q, topk] (contiguous int32) from a k2q CSR,
// each token's blocks ascending, -1 padded. Throws msa::Error on a malformed CSR (row_ptr not
// starting at 0 or decreasing, a query id outside [0, Lq_b) or not strictly ascending within
// a row, more than topk blocks for one token).
// row_ptr has `rows` >= g.total_rows() rows; those past g.total_rows() must be empty.
void fill_q2k(const int32_t* row_ptr, const int32_t* q_idx, int64_t rows, const BatchGeometry& g,
              const Tensor& q2k);

// Writes the schedule (src/common/schedule.h) for a filled row_ptr into `schedule`, whose size
// was checked against k2q_schedule_size.
void fill_schedule(const int32_t* row_ptr, int64_t num_kv_heads, int64_t total_rows,
                   const Tensor& schedule);

// Throws msa::Error unless `schedule` covers every non-empty (head, row) of row_ptr exactly
// once with that row's exact slice.
void check_schedule(const Tensor& schedule, const int32_t* row_ptr, int64_t num_kv_heads,
                    int64_t total_rows);

}  // namespace msa::cpu
