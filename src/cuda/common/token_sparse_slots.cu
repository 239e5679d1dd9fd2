// CUDA token_sparse_kv_indices (msa/token_sparse.h): the paged-cache slot of every selected
// position, with the CPU reference's checks (src/cpu/token_sparse.cpp) on the device, reported
// in its order through the status buffer (token_sparse.cuh). Three launches, nothing allocated:
//  1. one CTA: arms the offence key, checks requests and seq_lens (classes 2, 3);
//  2. one CTA per flat row: range and repeat (0, 1), then each used position's length and page
//     (4, 5, 6) and its slot; a bad value is never used as an address (its slot is -1);
//  3. one CTA: locates a pending offence into the status words.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend.h"
#include "cuda/common/token_sparse.cuh"
#include "cuda/device/check.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda {
namespace {

using namespace token_sparse;

// Classes after the row checks (kRange, kRepeat), in the CPU's order.
enum SlotClass : uint32_t { kRequest = 2, kSeqLen = 3, kPastLen = 4, kPageNegative = 5, kPageBig = 6 };

constexpr int kPrepThreads = 1024;
constexpr int kRowThreads = 128;

struct SlotParams {
  const int32_t* positions;  // [flat_rows, k] (flat row = kv head * rows + row)
  const int32_t* requests;   // [rows]
  const int32_t* table;      // [batch, width], row stride ld
  const int32_t* seq_lens;   // [batch] or null
  int32_t* slots;            // [flat_rows, k]
  int32_t* status;           // int32[4]
  int64_t rows, flat_rows, k, batch, width, ld, page_size;
  int64_t keys;              // width * page_size: positions are below it
};

__global__ void __launch_bounds__(kPrepThreads) slots_prep_kernel(SlotParams p) {
  __shared__ unsigned long long scratch[32];
  if (threadIdx.x == 0) arm(p.status);
  __syncthreads();
  unsigned long long off = kNoOffence;
  for (int64_t t = threadIdx.x; t < p.rows; t += kPrepThreads) {
    const int32_t b = p.requests[t];
    if (b < 0 || b >= p.batch) {
      off = offence_key(kRequest, uint64_t(t));
      break;  // this thread's later rows come after
    }
  }
  if (p.seq_lens)
    for (int64_t b = threadIdx.x; b < p.batch; b += kPrepThreads) {
      const int32_t len = p.seq_lens[b];
      if (len < 0 || len > p.keys) {
        off = min(off, offence_key(kSeqLen, uint64_t(b)));
        break;
      }
    }
  off = block_min(off, scratch);
  if (threadIdx.x == 0) report(p.status, off);
}

__global__ void __launch_bounds__(kRowThreads) slots_row_kernel(SlotParams p) {
  extern __shared__ int32_t table[];
  __shared__ unsigned long long scratch[32];
  __shared__ int flag;
  const int64_t r = blockIdx.x;
  const int32_t* row = p.positions + r * p.k;
  int32_t* out = p.slots + r * p.k;
  unsigned long long off = check_row(row, p.k, p.keys, r, table, &flag);
  const int32_t b = p.requests[r % p.rows];
  const bool req_ok = b >= 0 && b < p.batch;
  const int64_t len = req_ok && p.seq_lens ? int64_t(p.seq_lens[b]) : p.keys;
  // The largest page id whose slots (id * page_size + page_size - 1) fit int32.
  const int64_t max_page = (int64_t(INT32_MAX) - (p.page_size - 1)) / p.page_size;
  for (int64_t e = threadIdx.x; e < p.k; e += kRowThreads) {
    const int32_t v = row[e];
    int32_t slot = -1;
    if (v >= 0 && int64_t(v) < p.keys && req_ok) {
      const uint64_t entry = uint64_t(r * p.k + e);
      if (int64_t(v) >= len) off = min(off, offence_key(kPastLen, entry));
      const int64_t page = p.table[int64_t(b) * p.ld + v / p.page_size];
      if (page < 0) off = min(off, offence_key(kPageNegative, entry));
      else if (page > max_page) off = min(off, offence_key(kPageBig, entry));
      else slot = int32_t(page * p.page_size + v % p.page_size);
    }
    out[e] = slot;
  }
  off = block_min(off, scratch);
  if (threadIdx.x == 0) report(p.status, off);
}

__global__ void __launch_bounds__(kPrepThreads) slots_finalize_kernel(SlotParams p) {
  __shared__ unsigned long long scratch[32];
  __shared__ unsigned long long key_s;
  const unsigned long long key = pending_key(p.status, &key_s);
  if (key == kNoOffence) return;
  const uint32_t cls = key_class(key);
  const int64_t i = key_index(key);
  // Entry classes index [flat_rows * k]; the others rows, requests. An index outside them (a
  // corrupt buffer) is written without reading anything.
  const bool entry_class = cls == kRange || cls >= kPastLen;
  const int64_t limit = entry_class ? p.flat_rows * p.k : cls == kRepeat ? p.flat_rows
                        : cls == kRequest ? p.rows : p.batch;
  if (i >= limit || cls > kPageBig || (cls == kSeqLen && !p.seq_lens)) {
    if (threadIdx.x == 0) write_status(p.status, StatusCode::shape_mismatch, cls, i, 0);
    return;
  }
  if (cls == kRepeat) {
    int64_t value = 0, entry = 0;
    locate_repeat(p.positions + i * p.k, p.k, p.keys, value, entry, scratch);
    if (threadIdx.x == 0) write_status(p.status, StatusCode::position_repeated, i, value, entry);
    return;
  }
  if (threadIdx.x != 0) return;
  const int64_t r = entry_class ? i / p.k : 0, e = entry_class ? i % p.k : 0;
  const int32_t v = entry_class ? p.positions[i] : 0;
  switch (cls) {
    case kRange: return write_status(p.status, StatusCode::position_out_of_range, r, e, v);
    case kRequest:
      return write_status(p.status, StatusCode::request_out_of_range, i, p.requests[i], p.batch);
    case kSeqLen:
      return write_status(p.status, StatusCode::seq_len_out_of_range, i, p.seq_lens[i],
                          p.keys < INT32_MAX ? p.keys : int64_t(INT32_MAX));
    case kPastLen: return write_status(p.status, StatusCode::position_past_seq_len, r, e, v);
    default: {  // kPageNegative, kPageBig
      const int32_t b = p.requests[r % p.rows];
      return write_status(p.status, StatusCode::page_id_invalid, b, v / p.page_size,
                          p.table[int64_t(b) * p.ld + v / p.page_size]);
    }
  }
}

}  // namespace

void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& a, cudaStream_t stream) {
  const Tensor& pos = a.positions;
  SlotParams p{};
  p.positions = pos.ptr<int32_t>();
  p.requests = a.requests.ptr<int32_t>();
  p.table = a.block_table.ptr<int32_t>();
  p.seq_lens = a.seq_lens.defined() ? a.seq_lens.ptr<int32_t>() : nullptr;
  p.slots = a.slots.ptr<int32_t>();
  p.status = a.status.ptr<int32_t>();
  p.k = pos.shape[pos.ndim - 1];
  p.rows = pos.shape[pos.ndim - 2];
  p.flat_rows = pos.ndim == 3 ? pos.shape[0] * p.rows : p.rows;
  p.batch = a.block_table.shape[0];
  p.width = a.block_table.shape[1];
  p.ld = a.block_table.strides[0];
  p.page_size = a.page_size;
  p.keys = p.width * p.page_size;
  slots_prep_kernel<<<1, kPrepThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
  if (p.flat_rows > 0 && p.k > 0) {
    const size_t smem = size_t(row_table_slots(p.k)) * sizeof(int32_t);
    allow_dynamic_smem(slots_row_kernel, smem, "token_sparse_kv_indices");  // K > 4096: past 48 KB
    slots_row_kernel<<<unsigned(p.flat_rows), kRowThreads, smem, stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
  }
  slots_finalize_kernel<<<1, kPrepThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
