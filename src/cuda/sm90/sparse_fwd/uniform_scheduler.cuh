// Scheduler of the uniform path: finds the (kv head, query block) pairs whose q2k rows are all
// equal (block-uniform selections; query blocks of 64 or 128 tokens, traits.h qblock_shift_of),
// counts their units of up to 128 rows (192 on 64-column tiles: unit_tiles_of), and writes the
// unit table the uniform kernel walks. Runs after row_start_kernel (which also fills qblock_start)
// and before chunk_table_kernel (which drops those tokens from the KV-major work). Included by
// launch.cu.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>

#include "cuda/common/index_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/scheduler.cuh"
#include "cuda/sm90/sparse_fwd/traits.h"
#include "cuda/sm90/sparse_fwd/walk.h"

namespace msa::cuda::sparse_fwd {

// One block per (kv head, global query block) pair (grid-stride; blockDim a multiple of 32).
// Uniform: every row of the block equals its first row, whose ids are in [-1, nblk) and
// distinct. Writes the flag and the pair's unit count ceil(tokens / unit_tokens) into unit_start
// (scanned by unit_scan_kernel). The rows of a pair are contiguous in q2k: the block compares
// them with 32-bit indices, each thread a strided share, and agrees by __syncthreads_and.
__device__ inline void uniform_detect_body(const PrepParams& p, int64_t block, int64_t blocks) {
  const int64_t pairs = p.num_kv_heads * p.qblock_cap;
  const int64_t total_blocks = p.qblock_start[p.batch];
  const int topk = p.topk;
  for (int64_t pair = block; pair < pairs; pair += blocks) {
    const int64_t h = pair / p.qblock_cap, g = pair % p.qblock_cap;
    bool ok = false;
    int64_t n_tok = 0;
    const bool live = p.uniform_enabled && g < total_blocks && p.batch > 0;  // same for the block
    if (live) {
      const int64_t b = last_le(p.qblock_start, p.batch, g);
      const int64_t qb = g - p.qblock_start[b];
      const int64_t q_start = p.cu_seqlens_q[b], lq = int64_t(p.cu_seqlens_q[b + 1]) - q_start;
      const int64_t lk = int64_t(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
      const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
      n_tok = min(int64_t(1) << p.qblock_shift, lq - (qb << p.qblock_shift));
      const int64_t t0 = q_start + (qb << p.qblock_shift);
      ok = n_tok > 0 && t0 >= 0 && t0 + n_tok <= p.total_q;
      if (ok) {
        const int32_t* row0 = p.q2k + (h * p.total_q + t0) * topk;
        for (int s = threadIdx.x; s < topk; s += blockDim.x) {
          const int32_t id = row0[s];
          if (id < -1 || id >= nblk) ok = false;
          for (int r = 0; r < s && id >= 0; ++r)
            if (row0[r] == id) ok = false;
        }
        const int n = int(n_tok) * topk;  // <= 128 * topk
        int col = (topk + int(threadIdx.x)) % topk;
        const int step = int(blockDim.x) % topk;
        for (int i = topk + threadIdx.x; i < n; i += blockDim.x) {
          if (row0[i] != row0[col]) ok = false;
          col += step;
          if (col >= topk) col -= topk;
        }
      }
    }
    ok = __syncthreads_and(ok);  // also orders this pair's reads before the next pair's
    if (threadIdx.x == 0) {
      p.uniform[pair] = ok ? 1 : 0;
      p.unit_start[pair] = ok ? units_of(n_tok, p.group, p.unit_tiles) : 0;
    }
  }
}

__global__ void uniform_detect_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  uniform_detect_body(p, blockIdx.x, gridDim.x);
}

// One block: exclusive prefix of the unit counts in walk order (walk.h pair_at) into
// unit_order_start (unit_order_start[pairs] = *num_units).
template <int kT>
__device__ void unit_scan_body(const PrepParams& p) {
  using Scan = cub::BlockScan<int, kT>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t hkv = p.num_kv_heads, pairs = hkv * p.qblock_cap;
  int carry = 0;
  for (int64_t base = 0; base < pairs; base += kT) {
    const int64_t o = base + threadIdx.x;
    int count = 0;
    if (o < pairs) {
      const WalkPair w = pair_at(o, hkv, p.qblock_cap, p.unit_window);
      count = p.unit_start[w.h * p.qblock_cap + w.g];
    }
    int excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(count, excl, agg);
    if (o < pairs) p.unit_order_start[o] = carry + excl;
    carry += agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    p.unit_order_start[pairs] = carry;
    p.num_units[0] = carry <= p.unit_cap ? carry : 0;
    p.num_units[1] = 0;  // the uniform kernel's claim cursor
  }
}

__global__ void __launch_bounds__(kPrepThreads) unit_scan_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  unit_scan_body<kPrepThreads>(p);
}

// UnitDesc `u` of the table: unit k (k * unit_tokens(G, tiles) tokens in) of kv head h's query block qb
// of batch b. Shared by the sparse table (unit_table_kernel) and the dense one (dense_units_kernel).
__device__ __forceinline__ void write_unit(const PrepParams& p, int64_t u, int64_t h, int64_t b,
                                           int64_t qb, int64_t k) {
  const int64_t tokens_per_unit = unit_tokens(p.group, p.unit_tiles);
  const int32_t q_start = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q_start;
  const int32_t lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  const int32_t k_start = p.paged ? int32_t(b) : p.cu_seqlens_k[b];  // see PrepParams
  const int64_t q0 = qb << p.qblock_shift;  // the query block's first batch-local token
  const int64_t n_tok = min(int64_t(1) << p.qblock_shift, lq - q0);
  const int64_t first = k * tokens_per_unit;
  const int32_t t0 = int32_t(q_start + q0);
  int4* dst = static_cast<int4*>(p.units) + 2 * u;
  dst[0] = make_int4(int32_t(h), t0 + int32_t(first),
                     int32_t(min(tokens_per_unit, n_tok - first)), int32_t(q0 + first));
  dst[1] = make_int4(batch_diag(p, b, lq, lk), k_start, lk, t0);
}

// One thread per unit (grid-stride over `threads`): its pair by binary search in walk order,
// then the UnitDesc.
__device__ inline void unit_table_body(const PrepParams& p, int64_t thread, int64_t threads) {
  const int32_t n_units = *p.num_units;
  const int64_t hkv = p.num_kv_heads, pairs = hkv * p.qblock_cap;
  for (int64_t u = thread; u < n_units; u += threads) {
    const int64_t o = last_le(p.unit_order_start, pairs, u);
    const WalkPair w = pair_at(o, hkv, p.qblock_cap, p.unit_window);
    const int64_t b = last_le(p.qblock_start, p.batch, w.g);
    write_unit(p, u, w.h, b, w.g - p.qblock_start[b], u - p.unit_order_start[o]);
  }
}

__global__ void unit_table_kernel(PrepParams p) {
  pdl_wait();  // pdl.cuh
  pdl_trigger();
  unit_table_body(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                  int64_t(gridDim.x) * blockDim.x);
}

// The unit table of dense attention (no q2k: every pair is uniform and selects every visible
// block), in one block instead of the sparse path's four prep kernels. Checks cu_seqlens_q (and a
// flat cache's cu_seqlens_k; a pool's key offsets come clamped from the paged check) as the q2k
// check does, first offence into the status; then qblock_start, the pairs' unit counts scanned
// in walk order (walk.h at window 1: dense K/V already hit L2) and each pair's units written by
// the thread that counted them (no per-unit search). Broken lengths leave no unit, so nothing
// reads K/V through them. Without keys (uniform_enabled 0) every pair's flag is cleared for the
// combine, which then writes the zero rows.
template <int kT>
__device__ void dense_units_body(const PrepParams& p, int64_t total_k) {
  using Scan = cub::BlockScan<int, kT>;
  using Reduce = cub::BlockReduce<long long, kT>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ long long first_bad;
  const int64_t batch = p.batch;
  long long bad = LLONG_MAX;  // offence index batch * 2 + which, as the q2k check orders them
  for (int64_t b = threadIdx.x; b <= batch; b += kT)
    for (int which = 0; which < 2; ++which) {
      const int32_t* cu = which == 0 ? p.cu_seqlens_q : (total_k >= 0 ? p.cu_seqlens_k : nullptr);
      if (cu == nullptr) continue;
      const int64_t total = which == 0 ? p.total_q : total_k;
      const bool broken = (b == 0 ? cu[0] != 0 : cu[b] < cu[b - 1]) || (b == batch && cu[b] != total);
      if (broken) bad = min(bad, (long long)(b * 2 + which));
    }
  bad = Reduce(tmp.reduce).Reduce(bad, [](long long x, long long y) { return x < y ? x : y; });
  if (threadIdx.x == 0) {
    first_bad = bad;
    if (bad != LLONG_MAX) flag_status(p.status, int32_t(StatusCode::bad_cu_seqlens), bad & 1, bad >> 1, 0);
  }
  __syncthreads();
  const bool ok = first_bad == LLONG_MAX;
  int carry = 0;  // qblock_start (totals fit int32: checked on the host)
  for (int64_t base = 0; base <= batch; base += kT) {
    const int64_t b = base + threadIdx.x;
    int nq = 0;
    if (b < batch) {
      const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      nq = lq > 0 ? ((lq - 1) >> p.qblock_shift) + 1 : 0;
    }
    int excl = 0, agg = 0;
    Scan(tmp.scan).ExclusiveSum(nq, excl, agg);
    if (b <= batch) p.qblock_start[b] = carry + excl;
    carry += agg;
    __syncthreads();
  }
  const int64_t hkv = p.num_kv_heads, pairs = hkv * p.qblock_cap;
  if (!p.uniform_enabled)
    for (int64_t i = threadIdx.x; i < pairs; i += kT) p.uniform[i] = 0;
  const int64_t total_blocks = min(int64_t(carry), p.qblock_cap);
  int units = 0;
  for (int64_t base = 0; base < pairs; base += kT) {
    const int64_t o = base + threadIdx.x;
    const int64_t g = p.qblock_cap - 1 - o / hkv, h = o % hkv;
    int64_t b = 0, qb = 0;
    int count = 0;
    if (ok && p.uniform_enabled && o < pairs && g < total_blocks) {
      b = last_le(p.qblock_start, batch, g);
      qb = g - p.qblock_start[b];
      const int64_t n_tok = min(int64_t(1) << p.qblock_shift,
                                int64_t(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]) -
                                    (qb << p.qblock_shift));
      count = n_tok > 0 ? units_of(n_tok, p.group, p.unit_tiles) : 0;
    }
    int excl = 0, agg = 0;
    Scan(tmp.scan).ExclusiveSum(count, excl, agg);
    for (int k = 0; k < count; ++k) write_unit(p, int64_t(units + excl + k), h, b, qb, k);
    units += agg;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    p.num_units[0] = ok ? units : 0;
    p.num_units[1] = 0;  // the uniform kernel's claim cursor
  }
}

__global__ void __launch_bounds__(kPrepThreads) dense_units_kernel(PrepParams p,
                                                                   int64_t total_k) {
  pdl_wait();  // pdl.cuh; the uniform kernel's producer waits before reading the table
  pdl_trigger();
  dense_units_body<kPrepThreads>(p, total_k);
}

}  // namespace msa::cuda::sparse_fwd
