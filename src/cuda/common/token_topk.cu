// CUDA token top-K over logits rows (docs/semantics.md, Indexer logits), giving the CPU
// reference's ids (src/cpu/logits.cpp) bit for bit: per row the topk best positions of [ks, ke)
// (score_key order: higher first, -0 == +0, NaN below every number, -inf never), ties toward the
// lower position, written ascending, -1 padded.
//
// One CTA per row, a radix select on the 32-bit score keys (0 = -inf, not a candidate) in three
// digits (12, 10, 10 bits) that finds T, the topk-th best key, and `need`, how many keys equal
// to T to take (the lowest positions among them); the keys above T are then exactly
// topk - need. The passes:
//  1. stream the row from global memory once (16-byte loads): the level-0 histogram, and the
//     keys of the row's first positions kept in shared memory (16K or 48K keys, below);
//  2. if the chosen level-0 bucket holds at most kBufKeys keys, one more pass over the row
//     copies them into a shared buffer, and the next digits histogram only that buffer; a
//     bucket too large (long rows of equal scores) is refined over the row instead;
//  3. the output pass walks the row in position order, 2048 positions per step: a block-wide
//     prefix sum of (keys > T, keys == T) gives each selected position its output slot, so the
//     row comes out ascending without a sort.
// Re-reading a row hits the shared-memory cache for its first positions and L2 for the rest.
// Rows no longer than topk skip the select (every candidate is taken).
//
// Two kernels share this select. The whole-row kernel (below) holds the row's keys in shared
// memory; persistent CTAs, 1024 threads (512 where two CTAs fit an SM); it takes every call whose
// longest row fits (~52K keys). The streaming kernel caches the row's first 16K keys (48K with no
// more rows than SMs) and reads the rest from L2 again in each pass; it takes longer rows. H200,
// old (one CTA a row; streaming at TOPK2048-32K) / new: TOPK2048-B64 22.4 -> 20.6 us,
// TOPK2048-32K 2.734 -> 2.298 ms (docs/kernels/common.md has the phases and what bounds them).
//
// A version splitting a row over a cluster of 2, 4 or 8 CTAs (the histograms and output offsets
// read through distributed shared memory; a key a thread, ballots in the output pass) was slower
// with every cluster size: TOPK2048-B64 34.8 / 66.7 / 189.9 us, TOPK2048-32K 4.6 / 11.1 /
// 45.6 ms (4.1 ms with one CTA a row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "backend.h"
#include "cuda/common/topk_select.cuh"
#include "cuda/device/check.h"
#include "cuda/device/status.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/device/smem_limit.h"

namespace msa::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins0 = 4096;  // level 0: the key's top 12 bits (sign, exponent, 3 mantissa bits)
constexpr int kBins = 1024;   // levels 1 and 2: 10 bits each
constexpr int kShift0 = 20, kShift1 = 10;
// The level-0 bucket of the topk-th key spans 1/8 of an octave: about 750 of 32K normal
// logits for topk 2048; 4096 keys cover rows of a few hundred thousand positions.
constexpr int kBufKeys = 4096;
// Keys of a row's first positions kept for the later passes: 64 KB, so that two CTAs fit an SM;
// with no more rows than SMs (decode) each CTA has an SM to itself and caches up to 192 KB.
constexpr int kMaxCacheKeys = 16384;
constexpr int kMaxCacheKeysAlone = 49152;
constexpr int kTile = 4 * kThreads;  // positions of one output step: 4 per thread

static_assert(kBins0 % kThreads == 0 && kBins % kThreads == 0, "bins split evenly over threads");
static_assert(kTile < 65536, "the output pass packs two per-step counts into 16 bits each");

struct TokenTopKParams {
  const float* logits;  // [rows, cols], row stride ld elements
  const int32_t* ks;    // [rows] or null (with ke: the whole row)
  const int32_t* ke;    // [rows] or null
  int32_t* ids;         // [rows, topk] contiguous
  int32_t* status;      // int32[4]
  int64_t report_base;  // added to the row a status report names (mqa_logits_topk's chunks)
  int64_t ld;
  int32_t cols;
  int32_t topk;
  int32_t cache_keys;   // keys the dynamic shared memory caches per row
};

// The bucket holding the remaining-th best key of a histogram, from the top.
struct Pick {
  uint32_t total;   // keys counted in the histogram
  uint32_t bucket;  // the bucket
  uint32_t above;   // keys in the buckets above it
  uint32_t count;   // keys in it
};

struct Smem {
  uint32_t hist[kBins0];
  uint32_t buf[kBufKeys];
  uint32_t warp_sums[kWarps];
  Pick pick;
  uint32_t buf_count;
  uint32_t cache[1];  // cache_keys entries follow (dynamic)
};

// score_key with -inf -> 0, without branches: x + 0 turns -0 into +0; NaN -> 1. Equal to
// `x == -inf ? 0 : score_key(x)` for every float (checked over all 2^32 bit patterns).
__device__ __forceinline__ uint32_t topk_key(float x) {
  const uint32_t u = __float_as_uint(__fadd_rn(x, 0.f));
  const uint32_t key = (u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u)) + 1u;
  return x > -__int_as_float(0x7f800000) ? key : (x != x ? 1u : 0u);
}

// Exclusive prefix sum over the CTA in thread order; `total` gets the sum. Ends synchronized so
// that warp_sums can be reused at once.
template <int kT = kThreads>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_sums,
                                                         uint32_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = lane < (kT / 32) ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < (kT / 32)) warp_sums[lane] = w;
  }
  __syncthreads();
  total = warp_sums[(kT / 32) - 1];
  const uint32_t excl = incl - v + (warp > 0 ? warp_sums[warp - 1] : 0u);
  __syncthreads();
  return excl;
}

// Finds the bucket of the remaining-th best key of `hist` (buckets read from the top) into
// `pick`; the bucket fields are 0 when the histogram holds fewer keys (the caller checks
// pick.total). Ends synchronized.
template <int kT = kThreads>
__device__ __forceinline__ void find_bucket_in(const uint32_t* hist, int nbins, uint32_t remaining,
                                               Pick& pick, uint32_t* warp_sums) {
  const int per = nbins / kT;
  const int top = nbins - int(threadIdx.x) * per;  // this thread's bins: [top - per, top)
  uint32_t sum = 0;
  for (int j = 0; j < per; ++j) sum += hist[top - 1 - j];
  if (threadIdx.x == 0) pick = Pick{0, 0, 0, 0};
  uint32_t total;
  uint32_t above = block_exclusive_scan<kT>(sum, warp_sums, total);
  if (above < remaining && remaining <= above + sum) {
    for (int j = 0; j < per; ++j) {
      const uint32_t c = hist[top - 1 - j];
      if (remaining <= above + c) {
        pick.bucket = uint32_t(top - 1 - j);
        pick.above = above;
        pick.count = c;
        break;
      }
      above += c;
    }
  }
  if (threadIdx.x == 0) pick.total = total;
  __syncthreads();
}

__device__ __forceinline__ void find_bucket(Smem& s, int nbins, uint32_t remaining) {
  find_bucket_in(s.hist, nbins, remaining, s.pick, s.warp_sums);
}

__device__ __forceinline__ void zero_hist(Smem& s, int nbins) {
  for (int i = threadIdx.x; i < nbins; i += kThreads) s.hist[i] = 0;
  __syncthreads();
}

// The row's positions lo + [0, n); the keys of [0, cached) are in shared memory.
struct Row {
  const float* x;
  int n, cached;
};

// f(i, key) for every position of the row, in no particular order.
template <class F>
__device__ __forceinline__ void for_each_key(Row row, const uint32_t* cache, F f) {
  for (int i = threadIdx.x; i < row.cached; i += kThreads) f(i, cache[i]);
  // 8 loads in flight per thread: these re-reads come from L2 at its latency.
  for (int i0 = row.cached + int(threadIdx.x); i0 < row.n; i0 += 8 * kThreads) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * kThreads;
      v[u] = i < row.n ? __ldg(row.x + i) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * kThreads;
      if (i < row.n) f(i, topk_key(v[u]));
    }
  }
}

// Pass 1: the level-0 histogram of the whole row and the cache of its first keys, with 16-byte
// loads where the row's alignment allows.
__device__ __forceinline__ void first_pass(Smem& s, Row row) {
  const auto visit = [&s, row](int i, float x) {
    const uint32_t k = topk_key(x);
    if (i < row.cached) s.cache[i] = k;
    if (k != 0) atomicAdd(&s.hist[k >> kShift0], 1u);
  };
  const int mis = int((reinterpret_cast<uintptr_t>(row.x) >> 2) & 3);
  const int head = min(row.n, (4 - mis) & 3);
  if (int(threadIdx.x) < head) visit(threadIdx.x, __ldg(row.x + threadIdx.x));
  const int nvec = (row.n - head) >> 2;
  const float4* vec = reinterpret_cast<const float4*>(row.x + head);
  for (int j0 = threadIdx.x; j0 < nvec; j0 += 4 * kThreads) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * kThreads;
      if (j < nvec) v[u] = __ldg(vec + j);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * kThreads;
      if (j < nvec) {
        const int i = head + 4 * j;
        visit(i, v[u].x);
        visit(i + 1, v[u].y);
        visit(i + 2, v[u].z);
        visit(i + 3, v[u].w);
      }
    }
  }
  const int tail = head + 4 * nvec + int(threadIdx.x);
  if (tail < row.n) visit(tail, __ldg(row.x + tail));
  __syncthreads();
}

// The keys of the row whose bits above `shift` equal `prefix`, into the shared buffer (the
// caller made sure they fit).
__device__ __forceinline__ void collect(Smem& s, Row row, uint32_t prefix, int shift) {
  for_each_key(row, s.cache, [&](int, uint32_t k) {
    if (k != 0 && (k >> shift) == prefix) {
      const uint32_t at = atomicAdd(&s.buf_count, 1u);
      if (at < kBufKeys) s.buf[at] = k;
    }
  });
  __syncthreads();
}

// Histogram of the digit below `shift` (10 bits) over the keys whose bits above `shift` equal
// `prefix`: from the buffer, or from the whole row.
__device__ __forceinline__ void refine_hist(Smem& s, Row row, bool buffered, uint32_t prefix, int shift) {
  zero_hist(s, kBins);
  const int dshift = shift - 10;
  const auto add = [&](int, uint32_t k) {
    if (k != 0 && (k >> shift) == prefix) atomicAdd(&s.hist[(k >> dshift) & (kBins - 1)], 1u);
  };
  if (buffered) {
    const int nbuf = int(min(s.buf_count, uint32_t(kBufKeys)));
    for (int i = threadIdx.x; i < nbuf; i += kThreads) add(i, s.buf[i]);
  } else {
    for_each_key(row, s.cache, add);
  }
  __syncthreads();
}

// The output pass: ids of the keys > t and of the first `need` keys == t (t = 0: every
// candidate), ascending; then -1 to topk. Slots are bounds-checked, so a row written by another
// stream during the call cannot send a write past the row.
__device__ __forceinline__ void write_row(Smem& s, Row row, int32_t lo, uint32_t t, uint32_t need,
                          int32_t* out, int topk) {
  uint32_t sel_acc = 0, tie_acc = 0;  // selected and tied keys before this step (uniform)
  const uint32_t above_t = uint32_t(topk) - need;
  for (int base = 0; base < row.n; base += kTile) {
    uint32_t key[4];
    const int i0 = base + 4 * int(threadIdx.x);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = i0 + c;
      key[c] = i >= row.n ? 0u : i < row.cached ? s.cache[i] : topk_key(__ldg(row.x + i));
    }
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      gt += key[c] > t ? 1u : 0u;
      eq += (t != 0 && key[c] == t) ? 1u : 0u;
    }
    uint32_t total;
    const uint32_t excl = block_exclusive_scan((gt << 16) | eq, s.warp_sums, total);
    uint32_t sel = sel_acc + (excl >> 16), tie = tie_acc + (excl & 0xffffu);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (key[c] > t) {
        const uint32_t slot = sel + min(tie, need);
        if (slot < uint32_t(topk)) out[slot] = lo + i0 + c;
        ++sel;
      } else if (t != 0 && key[c] == t) {
        if (tie < need && sel + tie < uint32_t(topk)) out[sel + tie] = lo + i0 + c;
        ++tie;
      }
    }
    sel_acc += total >> 16;
    tie_acc += total & 0xffffu;
    if (t != 0 && sel_acc >= above_t && tie_acc >= need) break;  // the rest selects nothing
  }
  const uint32_t written = min(sel_acc + min(tie_acc, need), uint32_t(topk));
  for (uint32_t i = written + threadIdx.x; i < uint32_t(topk); i += kThreads) out[i] = -1;
}

// Row r's key range [lo, hi): [ks[r], ke[r]), or the whole row without ranges; a bad range is
// reported (key_range_invalid) and read as empty (the row written all -1).
__device__ __forceinline__ void row_range(const TokenTopKParams& p, int64_t r, int32_t& lo,
                                          int32_t& hi) {
  lo = 0;
  hi = p.cols;
  if (p.ks != nullptr) {
    lo = p.ks[r];
    hi = p.ke[r];
    if (lo < 0 || lo > hi || hi > p.cols) {
      if (threadIdx.x == 0) flag_status(p.status, int32_t(StatusCode::key_range_invalid), r + p.report_base, lo, hi);
      lo = hi = 0;
    }
  }
}

__global__ void __launch_bounds__(kThreads) token_topk_kernel(TokenTopKParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int64_t r = blockIdx.x;
  int32_t lo, hi;
  row_range(p, r, lo, hi);
  int32_t* out = p.ids + r * p.topk;
  Row row{p.logits + r * p.ld + lo, hi - lo, 0};
  const uint32_t k = uint32_t(p.topk);
  if (uint32_t(row.n) <= k) {  // every candidate is taken
    write_row(s, row, lo, 0u, 0u, out, p.topk);
    return;
  }
  row.cached = min(row.n, p.cache_keys);
  if (threadIdx.x == 0) s.buf_count = 0;
  zero_hist(s, kBins0);
  first_pass(s, row);
  find_bucket(s, kBins0, k);
  if (s.pick.total <= k) {  // at most topk candidates (the rest is -inf)
    write_row(s, row, lo, 0u, 0u, out, p.topk);
    return;
  }
  uint32_t remaining = k - s.pick.above, prefix = s.pick.bucket;
  bool buffered = false;
  if (s.pick.count <= uint32_t(kBufKeys)) {
    collect(s, row, prefix, kShift0);
    buffered = true;
  }
  refine_hist(s, row, buffered, prefix, kShift0);
  find_bucket(s, kBins, remaining);
  remaining -= s.pick.above;
  prefix = (prefix << 10) | s.pick.bucket;
  if (!buffered && s.pick.count <= uint32_t(kBufKeys)) {
    collect(s, row, prefix, kShift1);
    buffered = true;
  }
  refine_hist(s, row, buffered, prefix, kShift1);
  find_bucket(s, kBins, remaining);
  remaining -= s.pick.above;
  const uint32_t t = (prefix << 10) | s.pick.bucket;
  write_row(s, row, lo, t, remaining, out, p.topk);
}


// The whole-row kernel, for rows that fit in shared memory; persistent CTAs take rows
// blockIdx.x, + gridDim.x, ... A row:
//  A. bulk copies (16 KB each, an mbarrier each) bring the row's 16-byte aligned middle into shared
//     memory; as each lands its floats become keys in place, counted in the level-0 histogram (the
//     <= 3 positions either side of the middle by plain loads);
//  B. the level-0 bucket b of the topk-th key;
//  C. one sweep: each warp counts its segment's keys above bucket b (all taken) and appends bucket
//     b's keys with their ids to its share of the candidate list, counting their next digit (a
//     bucket past the list, or a share past its size, refines the next digits over the row);
//  D. the last two digits from the candidates give T (the topk-th key) and `need` (the keys equal
//     to T taken, the lowest positions), and each segment's count of keys above T and equal to T;
//  E. warp 0 finds the segment holding the last tie taken and each segment's first output slot;
//  F. each warp writes its segment's ids in order: keys above thr, where thr = T - 1 in the
//     segments before the tie segment (their ties all taken) and T after it; the tie segment goes
//     key by key.
// A segment is a warp's run of groups (4 keys), a multiple of 32 groups, and the row is padded
// with zero keys to a multiple of 32 groups, so each 32-group slot of a step is wholly in or out.
// ncu at TOPK2048-B64: 8.6M warp instructions (9.5M for the kernel with a count pass and a write
// pass, a warp scan every 4 keys a lane); the per-phase times are in docs/kernels/common.md.
constexpr int kCand = kBins0 / 2;  // bucket b's keys, then their ids, in the level-0 histogram
constexpr int kChunkKeys = 4096;   // keys of one bulk copy (16 KB)
constexpr int kMaxChunks = 16;     // rows of up to 64K keys: more than shared memory holds

struct RowSmem {
  uint32_t hist0[kBins0];  // level 0; then the candidates
  uint32_t hist1[kBins];   // level 1: bits [10, 20) of bucket b's keys
  uint32_t hist2[kBins];   // level 2: bits [0, 10)
  uint32_t seg_sel[32];   // per segment: keys above T (then every key taken)
  uint32_t seg_tie[32];   // keys equal to T
  uint32_t seg_base[32];  // the segment's first output slot
  uint32_t seg_thr[32];   // its threshold (F)
  uint32_t cand_n[32];    // the segment's candidates
  uint32_t overflow;      // a segment had more candidates than its share
  uint64_t bar[kMaxChunks];
  Pick pick;
  int32_t tie_warp;   // the tie segment (kT / 32: none)
  uint32_t tie_need;  // the ties it takes
  uint32_t written;   // ids of the row
  alignas(16) uint32_t keys[4];  // key i of the row at keys[mis + i], zeros around (dynamic)
};
static_assert(offsetof(RowSmem, keys) % 16 == 0, "16-byte shared loads of the keys");
static_assert(kChunkKeys * kMaxChunks * 4 > 232448, "the chunks cover any row that fits");

__device__ __forceinline__ uint4 keys_of(uint4 v) {
  return make_uint4(topk_key(__uint_as_float(v.x)), topk_key(__uint_as_float(v.y)),
                    topk_key(__uint_as_float(v.z)), topk_key(__uint_as_float(v.w)));
}

// Exclusive prefix sum over the warp's lanes; `total` gets the sum.
__device__ __forceinline__ uint32_t warp_exclusive_scan(uint32_t v, uint32_t& total) {
  const int lane = threadIdx.x & 31;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  total = __shfl_sync(0xffffffffu, incl, 31);
  return incl - v;
}

// hist0[key >> kShift0] += 1, -inf (key 0) included: it lands in bin 0 with NaN (key 1), the only
// keys there, and the selection never takes it (bucket 0's candidates start at key 1; a row whose
// topk-th key would be -inf takes every candidate).
__device__ __forceinline__ void count_key(const uint32_t* hist0, uint32_t key) {
  asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(
                   uint32_t(__cvta_generic_to_shared(hist0 + (key >> kShift0))))
               : "memory");
}

// The bucket of the remaining-th best key of hist (read from the top) into `pick` (bucket fields 0
// when the histogram holds fewer keys): each warp sums a slice of the bins (warp 0 the top one),
// then warp 0 scans the slices' sums, and the lanes split the chosen slice. Two block barriers
// (the caller synchronizes before); conflict-free 4-bin loads.
template <int kT, int kNBins>
__device__ __forceinline__ void find_bucket_slices(const uint32_t* hist, uint32_t remaining,
                                                   Pick& pick, uint32_t* slice_sum) {
  constexpr int kW = kT / 32, kSlice = kNBins / kW, kPer = kSlice / 32;
  static_assert(kPer >= 1 && kPer <= 8 && kSlice % 32 == 0, "lanes split a slice evenly");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int top0 = kNBins - warp * kSlice - lane * kPer;  // this lane's bins: [top0 - kPer, top0)
  uint32_t sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += hist[top0 - 1 - j];
  sum = __reduce_add_sync(0xffffffffu, sum);
  if (lane == 0) slice_sum[warp] = sum;
  __syncthreads();
  if (warp != 0) return;
  const uint32_t v = lane < kW ? slice_sum[lane] : 0u;
  uint32_t total;
  uint32_t above = warp_exclusive_scan(v, total);
  if (total < remaining) {
    if (lane == 0) pick = Pick{total, 0, 0, 0};
    return;
  }
  const int w = __ffs(__ballot_sync(0xffffffffu, above + v >= remaining)) - 1;
  above = __shfl_sync(0xffffffffu, above, w);
  const int top = kNBins - w * kSlice - lane * kPer;
  uint32_t c[kPer], part = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = hist[top - 1 - j];
    part += c[j];
  }
  uint32_t unused;
  uint32_t acc = above + warp_exclusive_scan(part, unused);
  const int l = __ffs(__ballot_sync(0xffffffffu, acc + part >= remaining)) - 1;
  if (lane == l) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (remaining <= acc + c[j]) {
        pick = Pick{total, uint32_t(top - 1 - j), acc, c[j]};
        break;
      }
      acc += c[j];
    }
  }
}

__device__ __forceinline__ uint32_t count_gt(const uint4& v, uint32_t t) {
  return uint32_t(v.x > t) + uint32_t(v.y > t) + uint32_t(v.z > t) + uint32_t(v.w > t);
}
__device__ __forceinline__ uint32_t count_eq(const uint4& v, uint32_t t) {
  return uint32_t(v.x == t) + uint32_t(v.y == t) + uint32_t(v.z == t) + uint32_t(v.w == t);
}

// F for a segment without the tie: the ids of the keys above thr in [ga, gb), from `slot` until
// `end` ids are written. A step takes 4 slots of 32 groups (conflict-free 16-byte loads); a lane's
// per-slot counts (<= 4) are packed in bytes, so one warp scan serves its 16 keys, and one loop
// over the lane's 16-bit mask writes them (a loop a slot took 4 divergent loops a step).
__device__ __forceinline__ void write_segment(const uint4* k4, int ga, int gb, uint32_t thr,
                                              uint32_t slot, uint32_t end, int32_t first_id,
                                              int32_t* out, uint32_t topk) {
  const int lane = threadIdx.x & 31;
  out = sm90::reg_copy(out);  // ptxas otherwise rebuilds the row's output address before each store
  for (int g0 = ga; g0 < gb && slot < end; g0 += 128) {
    uint32_t mask = 0, packed = 0;  // mask bit 4 j + e: slot j's key e taken
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (g0 + 32 * j < gb) {
        const uint4 v = k4[g0 + 32 * j + lane];
        const uint32_t m = uint32_t(v.x > thr) | uint32_t(v.y > thr) << 1 |
                           uint32_t(v.z > thr) << 2 | uint32_t(v.w > thr) << 3;
        mask |= m << (4 * j);
        packed |= uint32_t(__popc(m)) << (8 * j);
      }
    }
    uint32_t total;
    const uint32_t excl = warp_exclusive_scan(packed, total);
    // Slot j's first output: slot + the warp's keys of slots < j + this lane's place in slot j.
    const uint32_t t0 = total & 255u, t1 = (total >> 8) & 255u, t2 = (total >> 16) & 255u;
    const uint32_t o0 = slot + (excl & 255u), o1 = slot + t0 + ((excl >> 8) & 255u);
    const uint32_t o2 = slot + t0 + t1 + ((excl >> 16) & 255u);
    const uint32_t o3 = slot + t0 + t1 + t2 + (excl >> 24);
    const int32_t id0 = first_id + 4 * (g0 + lane);
    uint32_t prev = 0;  // this lane's taken keys so far in the current slot
    int pj = 0;
    while (mask != 0) {
      const int bit = __ffs(mask) - 1;
      mask &= mask - 1;
      const int j = bit >> 2;
      prev = j == pj ? prev : 0u;
      pj = j;
      const uint32_t at = (j == 0 ? o0 : j == 1 ? o1 : j == 2 ? o2 : o3) + prev;
      if (at < topk) out[at] = id0 + 128 * j + (bit & 3);
      ++prev;
    }
    slot += t0 + t1 + t2 + (total >> 24);
  }
}

// F for the tie segment: the keys above t and its first `need` keys equal to t, from `base`.
__device__ __forceinline__ void write_tie_segment(const uint4* k4, int ga, int gb, uint32_t t,
                                                  uint32_t need, uint32_t base, int32_t first_id,
                                                  int32_t* out, uint32_t topk) {
  const int lane = threadIdx.x & 31;
  uint32_t sel = 0, tie = 0;  // keys above t and equal to t before this step
  for (int g0 = ga; g0 < gb; g0 += 32) {
    const uint4 v = k4[g0 + lane];
    const uint32_t key[4] = {v.x, v.y, v.z, v.w};
    uint32_t gm = 0, em = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      gm |= uint32_t(key[e] > t) << e;
      em |= uint32_t(key[e] == t) << e;
    }
    uint32_t total;
    const uint32_t excl = warp_exclusive_scan(uint32_t(__popc(gm)) << 16 | uint32_t(__popc(em)), total);
    uint32_t ls = sel + (excl >> 16), lt = tie + (excl & 0xffffu);
    const int32_t id0 = first_id + 4 * (g0 + lane);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (gm & (1u << e)) {
        const uint32_t at = base + ls + min(lt, need);
        if (at < topk) out[at] = id0 + e;
        ++ls;
      } else if (em & (1u << e)) {
        if (lt < need && base + ls + lt < topk) out[base + ls + lt] = id0 + e;
        ++lt;
      }
    }
    sel += total >> 16;
    tie += total & 0xffffu;
  }
}

template <int kT>
__global__ void __launch_bounds__(kT) token_topk_row_kernel(TokenTopKParams p, int64_t rows) {
  constexpr int kW = kT / 32;
  constexpr int kCandW = kCand / kW;  // candidates a segment holds
  extern __shared__ __align__(16) unsigned char smem_raw[];
  RowSmem& s = *reinterpret_cast<RowSmem*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* k4 = reinterpret_cast<uint4*>(s.keys);
  uint32_t* cand_key = s.hist0;  // segment w's candidates at [w kCandW, w kCandW + cand_n[w])
  int32_t* cand_id = reinterpret_cast<int32_t*>(s.hist0 + kCand);
  if (threadIdx.x == 0) {
    for (int c = 0; c < kMaxChunks; ++c) sm90::mbar_init(&s.bar[c], 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  uint32_t phase = 0;  // bit c: the parity bar[c] completes next
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int32_t lo, hi;
    row_range(p, r, lo, hi);
    int32_t* out = p.ids + r * p.topk;
    const float* x = p.logits + r * p.ld + lo;
    const int n = hi - lo;
    const uint32_t k = uint32_t(p.topk);
    const bool select = uint32_t(n) > k;
    const int mis = int((reinterpret_cast<uintptr_t>(x) >> 2) & 3);
    const int head = min(n, (4 - mis) & 3);
    const int nvec = (n - head) >> 2;     // 16-byte groups of the middle
    const int g_mid = (mis + head) >> 2;  // the middle's first group
    const int gpad = (((mis + n + 3) >> 2) + 31) & ~31;
    const int per = ((gpad >> 5) + kW - 1) / kW * 32;  // groups a segment
    const int ga = min(gpad, warp * per), gb = min(gpad, ga + per);
    const int32_t first_id = lo - mis;  // the id of keys[i]
    const int nchunks = (4 * nvec + kChunkKeys - 1) / kChunkKeys;
    if (warp == 0 && lane < nchunks) {  // chunk `lane`
      const int k0 = lane * kChunkKeys;
      const uint32_t bytes = uint32_t(min(kChunkKeys, 4 * nvec - k0)) * 4u;
      sm90::mbar_arrive_expect_tx(&s.bar[lane], bytes);
      sm90::bulk_load(sm90::smem_addr(s.keys + mis + head + k0), x + head + k0, bytes,
                      sm90::smem_addr(&s.bar[lane]));
    }
    if (select)
      for (int i = threadIdx.x; i < kBins0; i += kT) s.hist0[i] = 0;
    for (int i = threadIdx.x; i < kBins; i += kT) s.hist1[i] = s.hist2[i] = 0;
    if (threadIdx.x < 32) s.cand_n[threadIdx.x] = 0;
    if (threadIdx.x == 0) s.overflow = 0;
    __syncthreads();
    // A: the keys outside the middle (the head, the tail, the zero padding), then the chunks.
    const int tail_at = mis + head + 4 * nvec, nscalar = mis + head + 4 * gpad - tail_at;
    for (int i = threadIdx.x; i < nscalar; i += kT) {
      const int at = i < mis + head ? i : tail_at + (i - mis - head), pos = at - mis;
      const uint32_t key = pos >= 0 && pos < n ? topk_key(__ldg(x + pos)) : 0u;
      s.keys[at] = key;
      if (select && pos >= 0 && pos < n) count_key(s.hist0, key);
    }
    for (int c = 0; c < nchunks; ++c) {
      sm90::mbar_wait(&s.bar[c], (phase >> c) & 1u);
      phase ^= 1u << c;
      const int c1 = min(g_mid + (c + 1) * (kChunkKeys / 4), g_mid + nvec);
#pragma unroll
      for (int u = 0; u < kChunkKeys / 4 / kT; ++u) {
        const int g = g_mid + c * (kChunkKeys / 4) + u * kT + int(threadIdx.x);
        if (g < c1) {
          const uint4 key = keys_of(k4[g]);
          k4[g] = key;
          if (select) {
            count_key(s.hist0, key.x);
            count_key(s.hist0, key.y);
            count_key(s.hist0, key.z);
            count_key(s.hist0, key.w);
          }
        }
      }
    }
    __syncthreads();
    uint32_t t = 0, need = 0;  // t = 0: every candidate taken
    bool counted = false;
    if (select) {
      find_bucket_slices<kT, kBins0>(s.hist0, k, s.pick, s.seg_base);  // B
      __syncthreads();
      if (s.pick.total > k) {
        const uint32_t b = s.pick.bucket;
        uint32_t rem = k - s.pick.above;
        // Bucket b's keys: key - lo_b <= span (key 0, -inf, never).
        const uint32_t lo_b = b == 0 ? 1u : b << kShift0, hi_b = (b << kShift0) | 0xfffffu;
        const uint32_t span = hi_b - lo_b;
        bool buffered = s.pick.count <= uint32_t(kCand);
        if (buffered) {  // C
          uint32_t above = 0;
          bool overflow = false;
          uint32_t* cand_n = &s.cand_n[warp];
          for (int g = ga + lane; g < gb; g += 32) {
            const uint4 v = k4[g];
            const uint32_t key[4] = {v.x, v.y, v.z, v.w};
            uint32_t in = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              above += key[e] > hi_b ? 1u : 0u;
              in |= key[e] - lo_b <= span ? 1u << e : 0u;
            }
            if (in != 0) {  // ~2% of the keys: a shared counter a segment
              uint32_t at = atomicAdd(cand_n, uint32_t(__popc(in)));
              overflow |= at + uint32_t(__popc(in)) > uint32_t(kCandW);
              do {
                const int e = __ffs(in) - 1;
                in &= in - 1;
                const uint32_t kv = e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
                if (at < uint32_t(kCandW)) {
                  cand_key[warp * kCandW + at] = kv;
                  cand_id[warp * kCandW + at] = first_id + 4 * g + e;
                }
                ++at;
                atomicAdd(&s.hist1[(kv >> 10) & (kBins - 1)], 1u);
              } while (in != 0);
            }
          }
          if (__any_sync(0xffffffffu, overflow) && lane == 0) s.overflow = 1;
          above = __reduce_add_sync(0xffffffffu, above);
          if (lane == 0) {
            s.seg_sel[warp] = above;
            s.seg_tie[warp] = 0;
          }
          __syncthreads();
          // A segment past its share of the list (scores clustered in one segment): the row way.
          buffered = s.overflow == 0;
          if (buffered) {  // D
            find_bucket_slices<kT, kBins>(s.hist1, rem, s.pick, s.seg_base);
            __syncthreads();
            if (s.pick.total < rem) goto take_all;  // -inf filled bucket 0: fewer than topk
            rem -= s.pick.above;
            const uint32_t prefix = (b << 10) | s.pick.bucket;
            for (int i = threadIdx.x; i < kCand; i += kT) {
              const uint32_t key = cand_key[i];
              if (uint32_t(i % kCandW) < s.cand_n[i / kCandW] && (key >> 10) == prefix)
                atomicAdd(&s.hist2[key & (kBins - 1)], 1u);
            }
            __syncthreads();
            find_bucket_slices<kT, kBins>(s.hist2, rem, s.pick, s.seg_base);
            __syncthreads();
            need = rem - s.pick.above;
            t = (prefix << 10) | s.pick.bucket;
            for (int i = threadIdx.x; i < kCand; i += kT) {
              const uint32_t key = cand_key[i];
              const int w = i / kCandW;
              if (uint32_t(i % kCandW) < s.cand_n[w] && key >= t)
                atomicAdd(key > t ? &s.seg_sel[w] : &s.seg_tie[w], 1u);
            }
            counted = true;
          } else {
            for (int i = threadIdx.x; i < kBins; i += kT) s.hist1[i] = 0;
            __syncthreads();
          }
        }
        if (!buffered) {  // the next digits over the row
          for (int g = threadIdx.x; g < gpad; g += kT) {
            const uint4 v = k4[g];
            const uint32_t key[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (key[e] - lo_b <= span) atomicAdd(&s.hist1[(key[e] >> 10) & (kBins - 1)], 1u);
          }
          __syncthreads();
          find_bucket_slices<kT, kBins>(s.hist1, rem, s.pick, s.seg_base);
          __syncthreads();
          if (s.pick.total < rem) goto take_all;
          rem -= s.pick.above;
          const uint32_t prefix = (b << 10) | s.pick.bucket;
          for (int g = threadIdx.x; g < gpad; g += kT) {
            const uint4 v = k4[g];
            const uint32_t key[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (key[e] != 0 && (key[e] >> 10) == prefix)
                atomicAdd(&s.hist2[key[e] & (kBins - 1)], 1u);
          }
          __syncthreads();
          find_bucket_slices<kT, kBins>(s.hist2, rem, s.pick, s.seg_base);
          __syncthreads();
          need = rem - s.pick.above;
          t = (prefix << 10) | s.pick.bucket;
        }
      }
    }
  take_all:
    if (!counted) {  // each segment's keys above t and equal to t
      uint32_t gt = 0, eq = 0;
      for (int g = ga + lane; g < gb; g += 32) {
        const uint4 v = k4[g];
        gt += count_gt(v, t);
        if (need != 0) eq += count_eq(v, t);
      }
      gt = __reduce_add_sync(0xffffffffu, gt);
      eq = __reduce_add_sync(0xffffffffu, eq);
      if (lane == 0) {
        s.seg_sel[warp] = gt;
        s.seg_tie[warp] = eq;
      }
    }
    __syncthreads();
    if (warp == 0) {  // E
      const uint32_t sel = lane < kW ? s.seg_sel[lane] : 0u, tie = lane < kW ? s.seg_tie[lane] : 0u;
      uint32_t ties;
      const uint32_t tie_before = warp_exclusive_scan(tie, ties);
      // Every tie taken (the usual case: T is one key): no tie segment, thr = T - 1 everywhere.
      int tw = kW;
      uint32_t before = 0;
      if (need != 0 && need < ties) {  // the segment where the ties reach `need`
        tw = __ffs(__ballot_sync(0xffffffffu, lane < kW && tie_before + tie >= need)) - 1;
        before = __shfl_sync(0xffffffffu, tie_before, tw);
      }
      // (tie is 0 without ties to take: the count pass skips them when need is 0.)
      const uint32_t taken = sel + (lane < tw ? tie : lane == tw ? need - before : 0u);
      uint32_t total;
      const uint32_t base = warp_exclusive_scan(taken, total);
      if (lane < kW) {
        s.seg_base[lane] = base;
        s.seg_sel[lane] = taken;
        s.seg_thr[lane] = need != 0 && lane < tw ? t - 1 : t;
      }
      if (lane == 0) {
        s.tie_warp = tw;
        s.tie_need = need - before;
        s.written = min(total, k);
      }
    }
    __syncthreads();
    const uint32_t base = s.seg_base[warp];  // F
    if (warp == s.tie_warp)
      write_tie_segment(k4, ga, gb, t, s.tie_need, base, first_id, out, k);
    else
      write_segment(k4, ga, gb, s.seg_thr[warp], base, base + s.seg_sel[warp], first_id, out, k);
    for (uint32_t i = s.written + threadIdx.x; i < k; i += kT) out[i] = -1;
    // The next row's bulk copies overwrite the keys written here.
    sm90::fence_proxy_async_smem();
    __syncthreads();
  }
}

template <int kT>
void launch_row(const TokenTopKParams& p, int64_t rows, int64_t grid, int64_t smem,
                cudaStream_t stream) {
  allow_dynamic_smem(token_topk_row_kernel<kT>, size_t(smem), "token_topk");
  token_topk_row_kernel<kT><<<unsigned(grid), kT, size_t(smem), stream>>>(p, rows);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void token_topk(const TokenTopKArgs& a, cudaStream_t stream, int64_t report_base) {
  const int64_t rows = a.logits.shape[0], cols = a.logits.shape[1];
  if (rows == 0) return;
  TokenTopKParams p{};
  p.report_base = report_base;
  p.logits = a.logits.ptr<float>();
  p.ks = a.ks.defined() ? a.ks.ptr<int32_t>() : nullptr;
  p.ke = a.ke.defined() ? a.ke.ptr<int32_t>() : nullptr;
  p.ids = a.ids.ptr<int32_t>();
  p.status = a.status.ptr<int32_t>();
  p.ld = a.logits.strides[0];
  p.cols = int32_t(cols);
  p.topk = a.topk;
  int device = 0, sms = 0, optin = 0, per_sm = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  // Rows that fit in shared memory (the longest row deciding, padded to 32 groups of 4 keys) take
  // the whole-row kernel, persistent: 512 threads a CTA where two CTAs fit an SM, else 1024.
  const int64_t groups = (cols + 6) / 4;
  const int64_t whole = int64_t(offsetof(RowSmem, keys)) + 16 * ((groups + 31) / 32 * 32);
  if (whole <= int64_t(optin)) {
    const int64_t fit = int64_t(per_sm) / (whole + 1024);
    if (fit >= 2) {
      const int64_t grid = std::min<int64_t>(rows, int64_t(sms) * std::min<int64_t>(fit, 4));
      return launch_row<kThreads>(p, rows, grid, whole, stream);
    }
    return launch_row<1024>(p, rows, std::min<int64_t>(rows, sms), whole, stream);
  }
  int64_t cache = rows <= sms ? kMaxCacheKeysAlone : kMaxCacheKeys;
  cache = std::min<int64_t>(cache, (int64_t(optin) - int64_t(offsetof(Smem, cache))) / 4);
  // Rows no longer than topk never reach the cache.
  p.cache_keys = cols > a.topk ? int32_t(std::min<int64_t>(cols, cache)) : 0;
  const size_t smem = offsetof(Smem, cache) + size_t(p.cache_keys > 0 ? p.cache_keys : 1) * 4;
  allow_dynamic_smem(token_topk_kernel, smem, "token_topk");
  token_topk_kernel<<<unsigned(rows), kThreads, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
