// Scheduler of the sparse forward: turns the k2q schedule (one item per non-empty (kv head, row),
// src/common/schedule.h) into the chunk table the persistent kernel walks. Runs before the main
// kernel on the same stream: row offsets per batch, a completeness check of the schedule with the
// chunk prefix sums, then one warp per chunk writing its ChunkDesc and the q2k slot of each of
// its CSR entries (where its partial goes), and a permutation of the chunks into walk order
// (sorted by query window). Kernels included only by launch.cu.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>

#include "common/schedule.h"
#include "cuda/common/pdl.cuh"
#include "cuda/device/status.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"
#include "msa/common.h"

namespace msa::cuda::sparse_fwd {

constexpr int kPrepThreads = 1024;
// Chunk walk order (chunk_table_kernel, chunk_permute_kernel): chunks are sorted, stably, by the
// query window of their first token (2^kWindowShift query blocks), so the CTAs running at any
// moment gather the same few thousand tokens' Q and find it in L2, instead of every row's
// tokens across the whole sequence. The sort uses only the key bits in use (launch.cu).

// Each prep step is a __device__ body, run by its own kernel (the chain of prep.cu) or as one
// phase of the fused prep kernel (prep_fused.cu). Single-block bodies take the block size kT as
// a template parameter; grid-wide bodies take the block's index and the number of blocks.

// One block: row_start[b] = sum_{b' < b} ceil(Lk_b' / kv_block_size) and qblock_start[b] =
// sum_{b' < b} ceil(Lq_b' / Q) for b in [0, B], Q = 2^qblock_shift.
template <int kT>
__device__ void row_start_body(const PrepParams& p) {
  using Scan = cub::BlockScan<int, kT>;
  __shared__ typename Scan::TempStorage tmp;
  int carry_k = 0, carry_q = 0;  // totals fit int32 (checked on the host)
  for (int64_t base = 0; base <= p.batch; base += kT) {
    const int64_t b = base + threadIdx.x;
    int nk = 0, nq = 0;
    if (b < p.batch) {
      const int lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
      const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      nk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
      nq = lq > 0 ? ((lq - 1) >> p.qblock_shift) + 1 : 0;
    }
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(nk, excl, agg);
    if (b <= p.batch) p.row_start[b] = carry_k + excl;
    carry_k += agg;
    __syncthreads();
    Scan(tmp).ExclusiveSum(nq, excl, agg);
    if (b <= p.batch) p.qblock_start[b] = carry_q + excl;
    carry_q += agg;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kPrepThreads) row_start_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  row_start_body<kPrepThreads>(p);
}

// One block: the schedule of a caller's row_ptr given without one (same format and order as
// build_k2q_csr's): one item per non-empty (head, row), ranked by a block scan of the flags.
template <int kT>
__device__ void schedule_from_row_ptr_body(const PrepParams& p, int32_t* schedule) {
  using Scan = cub::BlockScan<int, kT>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t rows = p.total_rows, n = p.num_kv_heads * rows;
  const int64_t rows_div = rows > 0 ? rows : 1;
  int carry = 0;
  for (int64_t base = 0; base < n; base += kT) {
    const int64_t r = base + threadIdx.x;
    const int32_t* rp = p.row_ptr + (r / rows_div) * (rows + 1) + r % rows_div;
    const int flag = r < n && rp[1] > rp[0];
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(flag, excl, agg);
    if (flag) {
      int32_t* it = schedule + sched::kHeaderInts + sched::kItemInts * int64_t(carry + excl);
      it[0] = int32_t(r / rows);
      it[1] = int32_t(r % rows);
      it[2] = rp[0];
      it[3] = rp[1];
    }
    carry += agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    schedule[0] = sched::kMagic;
    schedule[1] = carry;
  }
}

__global__ void __launch_bounds__(kPrepThreads) schedule_from_row_ptr_kernel(PrepParams p,
                                                                             int32_t* schedule) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  schedule_from_row_ptr_body<kPrepThreads>(p, schedule);
}

// One block: checks that the schedule covers every non-empty (head, row) of row_ptr exactly once
// with its exact slice (items strictly increasing in (head, row), each matching row_ptr, as many
// items as non-empty rows), and (check_rows) that row_ptr has at least sum_b nblk_b rows. On
// success writes the chunk prefix sums and the chunk count; otherwise status schedule_incomplete /
// csr_rows_short and a chunk count of 0, so the main kernel does nothing and never reads past any
// buffer.
template <int kT>
__device__ void schedule_check_body(const PrepParams& p) {
  using Reduce = cub::BlockReduce<long long, kT>;
  using Scan = cub::BlockScan<int, kT>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ long long shared_totals[2];
  const int32_t* sc = p.schedule;
  const int64_t rows = p.total_rows, nnz_cap = p.total_q * p.topk;
  const int64_t n_items = sc[1];
  const bool header_ok = sc[0] == sched::kMagic && n_items >= 0 && n_items <= p.schedule_capacity;

  if (p.valid_per_head)  // a caller's k2q: each head's entries = its q2k ids in range
    for (int64_t h = threadIdx.x; h < p.num_kv_heads; h += kT) {
      const int32_t* rp = p.row_ptr + h * (rows + 1);
      if (rp[0] != 0 || rp[rows] - rp[0] != p.valid_per_head[h])
        atomicMin(p.k2q_first, static_cast<unsigned long long>(h * (rows + 1) + rows));
    }
  long long non_empty = 0, bad = 0;
  for (int64_t r = threadIdx.x; r < p.num_kv_heads * rows; r += kT) {
    const int32_t* rp = p.row_ptr + (r / rows) * (rows + 1) + r % rows;
    non_empty += rp[1] > rp[0];
  }
  if (header_ok) {
    for (int64_t i = threadIdx.x; i < n_items; i += kT) {
      const int32_t* it = sc + sched::kHeaderInts + sched::kItemInts * i;
      const int64_t h = it[0], row = it[1];
      if (h < 0 || h >= p.num_kv_heads || row < 0 || row >= rows) { ++bad; continue; }
      const int32_t* rp = p.row_ptr + h * (rows + 1) + row;
      if (it[2] != rp[0] || it[3] != rp[1] || it[2] < 0 || it[2] >= it[3] || it[3] > nnz_cap) ++bad;
      if (i > 0) {
        const int32_t* pv = it - sched::kItemInts;
        if (int64_t(pv[0]) * rows + pv[1] >= h * rows + row) ++bad;
      }
    }
  }
  const long long total_non_empty = Reduce(tmp.reduce).Sum(non_empty);
  __syncthreads();
  const long long total_bad = Reduce(tmp.reduce).Sum(bad);
  if (threadIdx.x == 0) {
    shared_totals[0] = total_non_empty;
    shared_totals[1] = total_bad;
  }
  __syncthreads();
  // A caller's row_ptr may have rows past the batches' blocks (sized for an upper bound); they
  // map to no block, so an entry in one fails the k2q check in chunk_table_kernel.
  const bool rows_ok = !p.check_rows || p.row_start[p.batch] <= rows;
  if (!rows_ok || !header_ok || shared_totals[1] != 0 || shared_totals[0] != n_items) {
    if (threadIdx.x == 0) {
      if (!rows_ok)
        flag_status(p.status, int32_t(StatusCode::csr_rows_short), p.row_start[p.batch], rows, 0);
      else
        flag_status(p.status, int32_t(StatusCode::schedule_incomplete), shared_totals[0],
                    header_ok ? int32_t(n_items) : -1, 0);
      *p.num_chunks = 0;
    }
    return;
  }
  long long carry = 0;
  for (int64_t base = 0; base < n_items; base += kT) {
    const int64_t i = base + threadIdx.x;
    int c = 0;
    if (i < n_items) {
      const int32_t* it = sc + sched::kHeaderInts + sched::kItemInts * i;
      c = (it[3] - it[2] + p.chunk_tokens - 1) / p.chunk_tokens;
    }
    int excl = 0, agg = 0;
    Scan(tmp.scan).ExclusiveSum(c, excl, agg);
    if (i < n_items) p.chunk_start[i] = int32_t(carry + excl);
    carry += agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    p.chunk_start[n_items] = int32_t(carry);
    *p.num_chunks = carry <= p.chunk_capacity ? int32_t(carry) : 0;
  }
}

__global__ void __launch_bounds__(kPrepThreads) schedule_check_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  schedule_check_body<kPrepThreads>(p);
}

// Last i in [0, n) with a[i] <= x, for a non-decreasing a with a[0] <= x, n >= 1: a 32-way
// search by the whole warp (each lane probes one point per round), so a lookup costs
// log32(n) dependent loads instead of log2(n). Every lane gets the answer.
__device__ __forceinline__ int64_t warp_last_le(const int32_t* a, int64_t n, int64_t x, int lane) {
  int64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    const int64_t step = (hi - lo + 31) / 32;
    const int64_t i = lo + int64_t(lane) * step;
    const unsigned le = __ballot_sync(0xffffffffu, i < hi && a[i] <= x);
    lo += int64_t(31 - __clz(le)) * step;  // lane 0 probes lo itself: le is never 0
    hi = min(hi, lo + step);
  }
  return lo;
}

// One warp per chunk (grid-stride over the `threads` threads of the grid, this one `thread`):
// lane 0 writes the ChunkDesc, the lanes compact the chunk's CSR entries that the main kernel must
// do into work_local / work_slot (from e_begin on, CSR order kept) and shrink e_end to match.
// Dropped: tokens of query blocks done by the uniform path, and entries whose token's q2k row
// does not hold the block (a CSR that does not match q2k). With `fill_capacity` (the chain's radix
// sort, which sorts the whole capacity) the capacity past the real chunks gets keys that sort
// last.
__device__ inline void chunk_table_body(const PrepParams& p, int64_t thread, int64_t threads,
                                        bool fill_capacity) {
  const int32_t n_chunks = *p.num_chunks;
  const int lane = threadIdx.x & 31;
  const int64_t warps = threads / 32;
  const int32_t* sc = p.schedule;
  const int64_t n_items = n_chunks > 0 ? sc[1] : 0;
  for (int64_t c = thread / 32; c < n_chunks; c += warps) {
    const int64_t lo = warp_last_le(p.chunk_start, n_items, c, lane);  // the chunk's item
    const int32_t* it = sc + sched::kHeaderInts + sched::kItemInts * lo;
    const int32_t head = it[0], row = it[1];
    const int32_t e0 = it[2] + int32_t(c - p.chunk_start[lo]) * p.chunk_tokens;
    const int32_t e1 = min(it[3], e0 + p.chunk_tokens);
    const int64_t blo = warp_last_le(p.row_start, p.batch, row, lane);  // the row's batch
    const int32_t kb = row - p.row_start[blo];
    const int32_t q_start = p.cu_seqlens_q[blo], q_len = p.cu_seqlens_q[blo + 1] - q_start;
    const int32_t k_len = p.cu_seqlens_k[blo + 1] - p.cu_seqlens_k[blo];
    const int32_t k_start = p.paged ? int32_t(blo) : p.cu_seqlens_k[blo];  // see PrepParams
    const int32_t* uni = p.uniform + int64_t(head) * p.qblock_cap;
    const int64_t off = int64_t(head) * p.total_q * p.topk;
    int32_t kept = 0;
    const bool check = p.valid_per_head != nullptr;
    bool mismatch = false;
    for (int32_t e_base = e0; e_base < e1; e_base += 32) {
      const int32_t e = e_base + lane;
      int32_t tl = -1, slot = -1;
      if (e < e1) {
        tl = p.q_idx[off + e];
        bool holds = false;  // the token's q2k row holds kb
        if (tl >= 0 && tl < q_len && int64_t(q_start) + tl < p.total_q) {
          const int64_t qblock = int64_t(p.qblock_start[blo]) + (tl >> p.qblock_shift);
          const bool mine = qblock >= p.qblock_cap || !uni[qblock];  // not the uniform path's
          if (mine || check) {
            // A uniform pair's rows all equal its first: test that one (the same row for
            // every token of the query block, so the check's loads stay in L1).
            const int32_t row_tok = mine ? tl : tl >> p.qblock_shift << p.qblock_shift;
            const int32_t* ids = p.q2k + (int64_t(head) * p.total_q + q_start + row_tok) * p.topk;
            if (p.q2k_vec4) {  // rows of whole, 16-byte aligned int4s: 4 ids per load
              for (int32_t s = 0; s < p.topk && slot < 0; s += 4) {
                const int4 v = *reinterpret_cast<const int4*>(ids + s);
                slot = v.x == kb ? s : v.y == kb ? s + 1 : v.z == kb ? s + 2 : v.w == kb ? s + 3 : -1;
              }
            } else {
              for (int32_t s = 0; s < p.topk; ++s)
                if (ids[s] == kb) { slot = s; break; }
            }
            holds = slot >= 0;
            if (!mine) slot = -1;  // found only for the check
          }
        }
        // Strictly ascending within the row (the chunk's first entry against the row's previous).
        if (check && (!holds || (e > it[2] && p.q_idx[off + e - 1] >= tl))) mismatch = true;
      }
      const unsigned keep = __ballot_sync(0xffffffffu, slot >= 0);
      if (slot >= 0) {
        const int32_t at = e0 + kept + __popc(keep & ((1u << lane) - 1));
        p.work_local[off + at] = tl;
        p.work_slot[off + at] = slot;
      }
      kept += __popc(keep);
    }
    if (__any_sync(0xffffffffu, mismatch) && lane == 0)
      atomicMin(p.k2q_first, static_cast<unsigned long long>(int64_t(head) * (p.total_rows + 1) + row));
    if (lane == 0) {
      int4* dst = static_cast<int4*>(p.chunks_by_row) + 2 * c;
      dst[0] = make_int4(head, kb, e0, e0 + kept);
      dst[1] = make_int4(q_start, batch_diag(p, blo, q_len, k_len), k_start, k_len);
      // Walk-order key: the query window of the chunk's first token (0 for a corrupt entry).
      const int32_t tl0 = e0 < e1 ? p.q_idx[off + e0] : -1;
      const int64_t qblock =
          tl0 >= 0 && tl0 < q_len ? int64_t(p.qblock_start[blo]) + (tl0 >> p.qblock_shift) : 0;
      const int64_t window = qblock >> kWindowShift;
      const uint32_t key = uint32_t(window < p.window_keys - 1 ? window : p.window_keys - 1);
      p.chunk_keys[c] = key;
      p.chunk_ids[c] = int32_t(c);
    }
  }
  if (!fill_capacity) return;
  // Capacity past the real chunks: keys that sort last.
  for (int64_t c = n_chunks + thread; c < p.chunk_capacity; c += threads) {
    p.chunk_keys[c] = uint32_t(p.window_keys);
    p.chunk_ids[c] = int32_t(c);
  }
}

__global__ void chunk_table_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  chunk_table_body(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                   int64_t(gridDim.x) * blockDim.x, /*fill_capacity=*/true);
}

// One thread, after chunk_table: the first k2q mismatch it found into the status buffer.
__device__ __forceinline__ void report_k2q_mismatch(const PrepParams& p) {
  if (!p.k2q_first) return;
  const unsigned long long key = *p.k2q_first;
  if (key != ~0ull) {
    const int64_t rows1 = p.total_rows + 1, h = int64_t(key / rows1), r = int64_t(key % rows1);
    flag_status(p.status, int32_t(StatusCode::k2q_mismatch), h, r == p.total_rows ? -1 : r, 0);
  }
}

// After the sort: chunks[v] = chunks_by_row[order[v]] for the real chunks.
__global__ void chunk_permute_kernel(PrepParams p, const int32_t* order) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  if (blockIdx.x == 0 && threadIdx.x == 0) report_k2q_mismatch(p);
  const int32_t n_chunks = *p.num_chunks;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n_chunks;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int4* src = static_cast<const int4*>(p.chunks_by_row) + 2 * int64_t(order[v]);
    int4* dst = static_cast<int4*>(p.chunks) + 2 * v;
    dst[0] = src[0];
    dst[1] = src[1];
  }
}

}  // namespace msa::cuda::sparse_fwd
