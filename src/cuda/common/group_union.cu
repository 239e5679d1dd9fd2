// CUDA group_union_masks (msa/token_sparse.h): groups of a request's consecutive rows, each
// group's key union (ascending) and each row's mask over it, with the CPU reference's checks
// (src/cpu/token_sparse.cpp) on the device, reported in its order through the status buffer
// (token_sparse.cuh). Four launches, nothing allocated, no host sync:
//  1. one CTA: arms the offence key, checks cu_seqlens_q (class 2), writes group_rows (a scan of
//     each request's group count; the groups past the last hold no row) and reports more groups
//     than the outputs hold (class 3);
//  2. one CTA per flat row: range and repeat (classes 0, 1), independent of the groups, so that
//     they are found even where cu_seqlens_q is broken;
//  3. one CTA per (group, kv head): the union in a shared-memory hash set (at most U keys: one
//     more is reported, class 4, and the group written empty), sorted, then each row's mask
//     built as bits in shared memory and written whole;
//  4. one CTA: locates a pending offence into the status words.
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "backend.h"
#include "cuda/common/block_sort.cuh"
#include "cuda/common/token_sparse.cuh"
#include "cuda/device/check.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda {
namespace {

using namespace token_sparse;

enum UnionClass : uint32_t { kCu = 2, kGroups = 3, kUnion = 4 };

constexpr int kOneCtaThreads = 1024;
// The group-rows scan: 1024 threads would spill its 64-bit scan under the 64-register bound.
constexpr int kScanThreads = 512;
constexpr int kRowThreads = 128;
// The union kernel sorts up to U = 16384 keys: more threads shorten its bitonic stages.
constexpr int kUnionThreads = 512;

struct UnionParams {
  const int32_t* positions;  // [heads * rows, k]
  const int32_t* cu;         // [batch + 1]
  int32_t* keys;             // [heads, groups, cap]
  int32_t* lens;             // [heads, groups]
  int32_t* group_rows;       // [groups + 1]
  uint8_t* mask;             // [heads, rows, mask_cols]: bool bytes, or bits when packed
  int32_t* status;           // int32[4]
  int64_t heads, rows, k, batch, group_size, groups, cap, mask_cols;
  int64_t table_slots, list_slots;  // the union kernel's hash set and sort buffer (powers of 2)
  bool packed;
};

__global__ void __launch_bounds__(kScanThreads) group_rows_kernel(UnionParams p) {
  using Scan = cub::BlockScan<long long, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ long long excl_s[kScanThreads];
  __shared__ unsigned long long scratch[32];
  if (threadIdx.x == 0) arm(p.status);
  __syncthreads();
  // cu_seqlens_q: its start (index 0), then the first decrease (2 i), then its end (2 B + 1).
  unsigned long long off = kNoOffence;
  for (int64_t i = threadIdx.x; i <= p.batch; i += kScanThreads) {
    if (i == 0 && p.cu[0] != 0) off = min(off, offence_key(kCu, 0));
    if (i >= 1 && p.cu[i] < p.cu[i - 1]) off = min(off, offence_key(kCu, uint64_t(2 * i)));
    if (i == p.batch && p.cu[i] != p.rows) off = min(off, offence_key(kCu, uint64_t(2 * i + 1)));
  }
  off = block_min(off, scratch);
  const bool cu_ok = off == kNoOffence;
  long long total = 0;
  if (cu_ok) {
    // Request b's ceil(len_b / group_size) groups start at its rows cu[b] + j * group_size.
    for (int64_t base = 0; base < p.batch; base += kScanThreads) {
      const int64_t b = base + threadIdx.x;
      const long long n = b < p.batch ? (p.cu[b + 1] - p.cu[b] + p.group_size - 1) / p.group_size : 0;
      long long excl = 0, agg = 0;
      Scan(scan).ExclusiveSum(n, excl, agg);
      excl_s[threadIdx.x] = excl;
      __syncthreads();
      const int valid = int(p.batch - base < kScanThreads ? p.batch - base : kScanThreads);
      for (long long idx = threadIdx.x; idx < agg; idx += kScanThreads) {
        int lo = 0, hi = valid - 1;  // the last request of the chunk starting at or before idx
        while (lo < hi) {
          const int mid = (lo + hi + 1) >> 1;
          if (excl_s[mid] <= idx) lo = mid; else hi = mid - 1;
        }
        const long long gi = total + idx;
        if (gi < p.groups)
          p.group_rows[gi] = int32_t(p.cu[base + lo] + (idx - excl_s[lo]) * p.group_size);
      }
      total += agg;
      __syncthreads();
    }
    if (total > p.groups) off = offence_key(kGroups, uint64_t(total));
  }
  // The groups past the last hold no row; with a broken cu_seqlens_q every group is empty.
  const int64_t first = cu_ok ? (total < p.groups ? total : p.groups) : 0;
  for (int64_t gi = first + threadIdx.x; gi <= p.groups; gi += kScanThreads)
    p.group_rows[gi] = cu_ok ? int32_t(p.rows) : 0;
  if (threadIdx.x == 0) report(p.status, off);
}

__global__ void __launch_bounds__(kRowThreads) union_rows_check_kernel(UnionParams p) {
  extern __shared__ int32_t table[];
  __shared__ unsigned long long scratch[32];
  __shared__ int flag;
  const int64_t r = blockIdx.x;
  unsigned long long off = check_row(p.positions + r * p.k, p.k, INT32_MAX, r, table, &flag);
  off = block_min(off, scratch);
  if (threadIdx.x == 0) report(p.status, off);
}

// A position that joins a union: the checks report the others (-1 is no position).
__device__ __forceinline__ bool joins(int32_t v) { return v >= 0 && v != INT32_MAX; }

__global__ void __launch_bounds__(kUnionThreads) union_kernel(UnionParams p) {
  extern __shared__ int32_t smem[];
  int32_t* table = smem;                                      // [table_slots]
  int32_t* list = table + p.table_slots;                      // [list_slots]
  uint32_t* bits = reinterpret_cast<uint32_t*>(list + p.list_slots);  // [ceil(cap / 32)]
  __shared__ int count, overflow, filled;
  const int64_t gi = blockIdx.x, h = blockIdx.y;
  // group_rows as written by group_rows_kernel, clamped all the same: never a row outside.
  int64_t r0 = p.group_rows[gi], r1 = p.group_rows[gi + 1];
  r0 = r0 < 0 ? 0 : r0 > p.rows ? p.rows : r0;
  r1 = r1 < r0 ? r0 : r1 > p.rows ? p.rows : r1;
  for (int64_t i = threadIdx.x; i < p.table_slots; i += kUnionThreads) table[i] = -1;
  if (threadIdx.x == 0) count = overflow = filled = 0;
  __syncthreads();
  const int32_t* rows = p.positions + (h * p.rows + r0) * p.k;
  for (int64_t i = threadIdx.x; i < (r1 - r0) * p.k; i += kUnionThreads) {
    const int32_t v = rows[i];
    if (!joins(v)) continue;
    const int added = hash_insert(table, uint32_t(p.table_slots - 1), v);
    if ((added == 1 && atomicAdd(&count, 1) >= p.cap) || added < 0) overflow = 1;
  }
  __syncthreads();
  int32_t* keys = p.keys + (h * p.groups + gi) * p.cap;
  uint8_t* mask = p.mask + (h * p.rows + r0) * p.mask_cols;
  if (overflow) {  // reported, and written empty rather than truncated
    if (threadIdx.x == 0) {
      report(p.status, offence_key(kUnion, uint64_t(h * p.groups + gi)));
      p.lens[h * p.groups + gi] = 0;
    }
    for (int64_t i = threadIdx.x; i < p.cap; i += kUnionThreads) keys[i] = -1;
    for (int64_t i = threadIdx.x; i < (r1 - r0) * p.mask_cols; i += kUnionThreads) mask[i] = 0;
    return;
  }
  const int n = count;
  for (int64_t i = threadIdx.x; i < p.table_slots; i += kUnionThreads)
    if (table[i] != -1) list[atomicAdd(&filled, 1)] = table[i];
  const int sorted = int(pow2_at_least(n, 1));
  __syncthreads();
  for (int i = n + threadIdx.x; i < sorted; i += kUnionThreads) list[i] = INT32_MAX;
  block_bitonic_sort(list, sorted);
  for (int64_t i = threadIdx.x; i < p.cap; i += kUnionThreads) keys[i] = i < n ? list[i] : -1;
  if (threadIdx.x == 0) p.lens[h * p.groups + gi] = n;
  const int64_t words = (p.cap + 31) / 32;
  for (int64_t t = 0; t < r1 - r0; ++t) {
    for (int64_t w = threadIdx.x; w < words; w += kUnionThreads) bits[w] = 0;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < p.k; e += kUnionThreads) {
      const int32_t v = rows[t * p.k + e];
      if (!joins(v)) continue;
      const int j = lower_bound(list, n, v);
      atomicOr(&bits[j >> 5], 1u << (j & 31));
    }
    __syncthreads();
    uint8_t* out = mask + t * p.mask_cols;
    if (p.packed) {
      for (int64_t j = threadIdx.x; j < p.mask_cols; j += kUnionThreads)
        out[j] = uint8_t(bits[j >> 2] >> ((j & 3) * 8));
    } else {
      for (int64_t i = threadIdx.x; i < p.cap; i += kUnionThreads)
        out[i] = uint8_t((bits[i >> 5] >> (i & 31)) & 1u);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kOneCtaThreads) union_finalize_kernel(UnionParams p) {
  __shared__ unsigned long long scratch[32];
  __shared__ unsigned long long key_s;
  const unsigned long long key = pending_key(p.status, &key_s);
  if (key == kNoOffence) return;
  const uint32_t cls = key_class(key);
  const int64_t i = key_index(key);
  const int64_t flat_rows = p.heads * p.rows;
  // An index outside its class's range (a corrupt buffer) is written without reading anything.
  const int64_t limit = cls == kRange ? flat_rows * p.k : cls == kRepeat ? flat_rows
                        : cls == kCu ? 2 * p.batch + 2 : cls == kGroups ? (1ll << 56)
                        : p.heads * p.groups;
  if (i >= limit || cls > kUnion) {
    if (threadIdx.x == 0) write_status(p.status, StatusCode::shape_mismatch, cls, i, 0);
    return;
  }
  if (cls == kRepeat) {
    int64_t value = 0, entry = 0;
    locate_repeat(p.positions + i * p.k, p.k, INT32_MAX, value, entry, scratch);
    if (threadIdx.x == 0) write_status(p.status, StatusCode::position_repeated, i, value, entry);
    return;
  }
  if (threadIdx.x != 0) return;
  switch (cls) {
    case kRange:
      return write_status(p.status, StatusCode::position_out_of_range, i / p.k, i % p.k,
                          p.positions[i]);
    case kCu: return write_status(p.status, StatusCode::bad_cu_seqlens, 0, i / 2, 0);
    case kGroups: return write_status(p.status, StatusCode::groups_past_capacity, i, p.groups, 0);
    default:
      return write_status(p.status, StatusCode::union_past_capacity, i / p.groups, i % p.groups,
                          p.cap);
  }
}

}  // namespace

void group_union_masks(const GroupUnionMasksArgs& a, cudaStream_t stream) {
  const Tensor& pos = a.positions;
  UnionParams p{};
  p.positions = pos.ptr<int32_t>();
  p.cu = a.cu_seqlens_q.ptr<int32_t>();
  p.keys = a.union_keys.ptr<int32_t>();
  p.lens = a.union_lens.ptr<int32_t>();
  p.group_rows = a.group_rows.ptr<int32_t>();
  p.mask = static_cast<uint8_t*>(a.mask.data);
  p.status = a.status.ptr<int32_t>();
  p.heads = pos.ndim == 3 ? pos.shape[0] : 1;
  p.rows = pos.shape[pos.ndim - 2];
  p.k = pos.shape[pos.ndim - 1];
  p.batch = a.cu_seqlens_q.shape[0] - 1;
  p.group_size = a.group_size;
  p.groups = a.group_rows.shape[0] - 1;
  p.cap = a.union_keys.shape[a.union_keys.ndim - 1];
  p.packed = a.mask.dtype == DType::u8;
  p.mask_cols = p.packed ? (p.cap + 7) / 8 : p.cap;
  p.table_slots = pow2_at_least(2 * p.cap, 64);
  p.list_slots = pow2_at_least(p.cap, 1);
  MSA_CHECK(p.heads <= 65535, "group_union_masks: CUDA takes up to 65535 kv heads, got ", p.heads);
  group_rows_kernel<<<1, kScanThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
  const int64_t flat_rows = p.heads * p.rows;
  if (flat_rows > 0 && p.k > 0) {
    const size_t smem = size_t(row_table_slots(p.k)) * sizeof(int32_t);
    allow_dynamic_smem(union_rows_check_kernel, smem, "group_union_masks");
    union_rows_check_kernel<<<unsigned(flat_rows), kRowThreads, smem, stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
  }
  if (p.groups > 0 && p.heads > 0) {
    const size_t smem = size_t(p.table_slots + p.list_slots + (p.cap + 31) / 32 + 1) * sizeof(int32_t);
    allow_dynamic_smem(union_kernel, smem, "group_union_masks");
    union_kernel<<<dim3(unsigned(p.groups), unsigned(p.heads)), kUnionThreads, smem, stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
  }
  union_finalize_kernel<<<1, kOneCtaThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
