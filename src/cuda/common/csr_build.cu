// Kernels of the GPU k2q CSR builder (csr_build.cuh) and the cuda:: entry points of
// build_k2q_csr. Determinism: the only reordering is CUB's stable LSD radix sort, so each row's
// batch-local query ids come out ascending and the output equals the CPU builder's bit for bit.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>

#include "backend.h"
#include "common/schedule.h"
#include "cuda/common/csr_build.cuh"
#include "cuda/device/check.h"
#include "cuda/device/status.cuh"

namespace msa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;

// Sort keys are head * (total_rows + 1) + row, with row = total_rows for an unused slot, so every
// head keeps exactly total_q * topk entries and its unused slots sort to the end of its segment.
int key_bits(int64_t hkv, int64_t total_rows) {
  const uint64_t max_key = uint64_t(hkv) * uint64_t(total_rows + 1);
  int bits = 1;
  while (bits < 32 && (uint64_t(1) << bits) <= max_key) ++bits;
  return bits;
}

// Workspace plan, in order: q2k-check scratch, first_row [total_q + 2], sort keys in / out,
// values in [n] (reused as run flags and their scan), CUB temp storage.
struct WorkspacePlan {
  size_t check = 0, first_row = 0, keys_in = 0, keys_out = 0, vals_in = 0, temp = 0, total = 0;
  size_t temp_bytes = 0;
};

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

WorkspacePlan plan_workspace(int64_t hkv, int64_t total_rows, int64_t total_q, int64_t topk) {
  MSA_CHECK(hkv * (total_rows + 1) < INT32_MAX, "build_k2q_csr: Hkv * (total_rows + 1) = ",
            hkv * (total_rows + 1), " must fit int32 sort keys");
  const int64_t n = hkv * total_q * topk;
  MSA_CHECK(n < INT32_MAX, "build_k2q_csr: Hkv * total_q * topk = ", n,
            " must be below 2^31 on CUDA");
  WorkspacePlan w;
  size_t sort_bytes = 0, scan_bytes = 0;
  if (n > 0) {
    MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(n), 0,
        key_bits(hkv, total_rows)));
    MSA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                                 static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), int(n)));
  }
  w.temp_bytes = std::max(sort_bytes, scan_bytes);
  size_t off = 0;
  w.check = off;     off += align256(kQ2KCheckWorkspaceBytes);
  w.first_row = off; off += align256(size_t(total_q + 2) * 4);
  w.keys_in = off;   off += align256(size_t(n) * 4);
  w.keys_out = off;  off += align256(size_t(n) * 4);
  w.vals_in = off;   off += align256(size_t(n) * 4);
  w.temp = off;      off += align256(w.temp_bytes);
  w.total = off;
  return w;
}

// One block: rowoff_b = sum_{b' < b} nblk_b', stored at first_row[cu_q[b]] for every batch that
// has queries (the only ones a token can look up), so the buffer is sized by total_q, not B.
// first_row[total_q + 1] = total rows. Also flags rows past row_ptr's total_rows in `status`.
__global__ void __launch_bounds__(kScanThreads) batch_rows_kernel(CsrBuildParams p,
                                                                  int32_t* first_row) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int carry = 0;  // sum of nblk_b, saturating: total_rows fits int32 (checked on the host)
  for (int64_t base = 0; base < p.batch; base += kScanThreads) {
    const int64_t b = base + threadIdx.x;
    int nblk = 0;
    if (b < p.batch) {
      const int64_t lk = batch_keys(p.keys, b);
      nblk = int(lk > 0 ? std::min<int64_t>((lk + p.kv_block_size - 1) / p.kv_block_size,
                                            INT32_MAX / 2)
                        : 0);
    }
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(nblk, excl, agg);
    if (b < p.batch) {
      const int64_t first = p.cu_seqlens_q[b], lq = int64_t(p.cu_seqlens_q[b + 1]) - first;
      if (lq > 0 && first >= 0 && first < p.total_q)
        first_row[first] = int32_t(std::min<int64_t>(int64_t(carry) + excl, INT32_MAX));
    }
    carry = int(std::min<int64_t>(int64_t(carry) + agg, INT32_MAX / 2));
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    first_row[p.total_q + 1] = carry;
    if (p.check_total_rows && carry > p.total_rows)
      flag_status(p.status, int32_t(StatusCode::csr_rows_short), carry, p.total_rows, 0);
  }
}

// One thread per (head, token) row of q2k: sort key and value (batch-local token or -1) of each
// slot. Ids outside [0, nblk_b) (already reported by the q2k check) become unused slots.
__global__ void keys_kernel(CsrBuildParams p, const int32_t* first_row, uint32_t* keys,
                            int32_t* vals) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.num_kv_heads * p.total_q) return;
  const int64_t h = row / p.total_q, t = row % p.total_q;
  const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
  const int64_t q_start = p.cu_seqlens_q[b];
  const int64_t rowoff = (q_start >= 0 && q_start <= t) ? first_row[q_start] : -1;
  const int64_t lk = batch_keys(p.keys, b);
  const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
  const uint32_t head_base = uint32_t(h * (p.total_rows + 1));
  const int32_t* ids = p.q2k + row * p.topk;
  for (int64_t s = 0; s < p.topk; ++s) {
    const int64_t kb = ids[s];
    const int64_t r = rowoff + kb;
    const bool valid = rowoff >= 0 && kb >= 0 && kb < nblk && r < p.total_rows;
    keys[row * p.topk + s] = head_base + uint32_t(valid ? r : p.total_rows);
    vals[row * p.topk + s] = valid ? int32_t(t - q_start) : -1;
  }
}

// One thread per sorted entry: writes row_ptr entries of the rows that start at this entry (each
// row_ptr entry exactly once, empty rows included) and flags the first entry of each used row.
__global__ void boundaries_kernel(CsrBuildParams p, const uint32_t* keys, int32_t* flags) {
  const int64_t seg = p.total_q * p.topk;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.num_kv_heads * seg) return;
  const int64_t h = i / seg, pos = i % seg;
  const int64_t base = h * (p.total_rows + 1);
  const int64_t cur = int64_t(keys[i]) - base;
  const int64_t prev = pos == 0 ? -1 : int64_t(keys[i - 1]) - base;
  int32_t* rp = p.row_ptr + base;
  for (int64_t r = prev + 1; r <= cur; ++r) rp[r] = int32_t(pos);
  if (pos == seg - 1)
    for (int64_t r = cur + 1; r <= p.total_rows; ++r) rp[r] = int32_t(seg);
  flags[i] = (cur != prev && cur < p.total_rows) ? 1 : 0;
}

// One thread per sorted entry: the first entry of each used row writes that row's item at its
// rank among used rows (exclusive scan of the flags); the last entry writes the header.
__global__ void items_kernel(CsrBuildParams p, const uint32_t* keys, const int32_t* flags,
                             const int32_t* rank) {
  const int64_t seg = p.total_q * p.topk, n = p.num_kv_heads * seg;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (flags[i]) {
    const int64_t h = i / seg, base = h * (p.total_rows + 1);
    const int64_t r = int64_t(keys[i]) - base;
    int32_t* item = p.schedule + sched::kHeaderInts + sched::kItemInts * int64_t(rank[i]);
    item[0] = int32_t(h);
    item[1] = int32_t(r);
    item[2] = p.row_ptr[base + r];
    item[3] = p.row_ptr[base + r + 1];
  }
  if (i == n - 1) {
    p.schedule[0] = sched::kMagic;
    p.schedule[1] = rank[i] + flags[i];
  }
}

__global__ void empty_schedule_kernel(int32_t* schedule) {
  schedule[0] = sched::kMagic;
  schedule[1] = 0;
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

size_t csr_build_workspace_bytes(int64_t hkv, int64_t total_rows, int64_t total_q, int64_t topk) {
  return plan_workspace(hkv, total_rows, total_q, topk).total;
}

void launch_csr_build(const CsrBuildParams& p, cudaStream_t stream) {
  const WorkspacePlan w = plan_workspace(p.num_kv_heads, p.total_rows, p.total_q, p.topk);
  auto* ws = static_cast<uint8_t*>(p.workspace);
  if (p.run_q2k_check) launch_q2k_check(p, ws + w.check, p.status, stream);
  const int64_t n = p.num_kv_heads * p.total_q * p.topk;
  auto* first_row = reinterpret_cast<int32_t*>(ws + w.first_row);
  if (p.batch > 0) {
    batch_rows_kernel<<<1, kScanThreads, 0, stream>>>(p, first_row);
    MSA_CUDA_CHECK_LAUNCH();
  }
  if (n == 0) {  // no slots: every row empty
    MSA_CUDA_CHECK(cudaMemsetAsync(p.row_ptr, 0,
                                   size_t(p.num_kv_heads) * size_t(p.total_rows + 1) * 4, stream));
    if (p.schedule) {
      empty_schedule_kernel<<<1, 1, 0, stream>>>(p.schedule);
      MSA_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  auto* keys_in = reinterpret_cast<uint32_t*>(ws + w.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + w.keys_out);
  auto* vals_in = reinterpret_cast<int32_t*>(ws + w.vals_in);
  keys_kernel<<<blocks_for(p.num_kv_heads * p.total_q), kThreads, 0, stream>>>(p, first_row,
                                                                             keys_in, vals_in);
  MSA_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = w.temp_bytes;
  MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + w.temp, temp_bytes, keys_in, keys_out,
                                                 vals_in, p.q_idx, int(n), 0,
                                                 key_bits(p.num_kv_heads, p.total_rows), stream));
  // keys_in and vals_in are free after the sort: reuse them for the run flags and their ranks.
  auto* flags = reinterpret_cast<int32_t*>(keys_in);
  auto* rank = vals_in;
  boundaries_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, keys_out, flags);
  MSA_CUDA_CHECK_LAUNCH();
  if (!p.schedule) return;
  temp_bytes = w.temp_bytes;
  MSA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(ws + w.temp, temp_bytes, flags, rank, int(n),
                                               stream));
  items_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, keys_out, flags, rank);
  MSA_CUDA_CHECK_LAUNCH();
}

// ---- backend entry points (backend.h) ------------------------------------------------------

size_t csr_workspace_bytes(int64_t hkv, int64_t total_rows, int64_t total_q, int64_t topk) {
  return csr_build_workspace_bytes(hkv, total_rows, total_q, topk);
}

void build_k2q_csr(const CsrBuildArgs& a, const ProblemShape& s, cudaStream_t stream) {
  CsrBuildParams p;
  p.q2k = a.q2k.ptr<int32_t>();
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  if (a.kv.layout == KVLayout::flat) {
    p.keys.cu_seqlens_k = a.kv.cu_seqlens_k.ptr<int32_t>();
    p.keys.total_k = a.kv.k.values.defined() ? a.kv.k.values.shape[0] : -1;
  } else {
    p.keys.seqused_k = a.kv.seqused_k.defined() ? a.kv.seqused_k.ptr<int32_t>() : nullptr;
    p.keys.max_keys = s.max_pages * s.page_size;
  }
  p.batch = s.batch;
  p.num_kv_heads = s.num_kv_heads;
  p.total_q = s.total_q;
  p.topk = s.topk;
  p.kv_block_size = s.kv_block_size;
  p.total_rows = a.out.row_ptr.shape[1] - 1;
  p.check_total_rows = true;
  p.row_ptr = a.out.row_ptr.ptr<int32_t>();
  p.q_idx = a.out.q_idx.ptr<int32_t>();
  p.schedule = a.out.schedule.defined() ? a.out.schedule.ptr<int32_t>() : nullptr;
  p.workspace = a.workspace.data;
  p.status = a.status.ptr<int32_t>();
  MSA_CHECK((reinterpret_cast<uintptr_t>(p.workspace) & 255) == 0 || p.workspace == nullptr,
            "workspace: must be 256-byte aligned on CUDA");
  launch_csr_build(p, stream);
}

}  // namespace msa::cuda
