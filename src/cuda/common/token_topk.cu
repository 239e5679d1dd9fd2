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
// Two kernels share this select. The whole-row kernel (below) keeps the row's keys in shared
// memory and reads them 4 to a thread in every later pass; it takes rows that fit when two CTAs
// fit an SM, or when there are no more rows than SMs (then 1024 threads a CTA: TOPK2048-B64, 128
// rows of 32K keys, 34.5 -> 23.9 us). The streaming kernel caches the row's first 16K keys (48K
// with no more rows than SMs) and reads the rest from L2 again in each pass; it takes the other
// calls. At TOPK2048-32K (rows up to 32K keys, so one whole-row CTA an SM) the whole-row kernel
// ran at 3.22 ms with 1024 threads and 3.61 ms with 512, the streaming one at 2.73 ms.
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

__device__ __forceinline__ uint32_t topk_key(float x) {
  return x == -__int_as_float(0x7f800000) ? 0u : score_key(x);
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
      if (threadIdx.x == 0) flag_status(p.status, int32_t(StatusCode::key_range_invalid), r, lo, hi);
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


// The whole-row kernel, for rows that fit in shared memory: the row is read from global memory
// once into shared memory (as keys), and every later pass reads it from there 4 keys a thread at a
// time (16-byte shared loads). A thread's 4 keys are consecutive positions, so the output slots
// come from a warp scan of per-thread counts.
struct WholeRowSmem {
  uint32_t hist0[kBins0];  // level 0; then the candidate buffer (kBufKeys keys)
  uint32_t hist1[kBins];   // levels 1 and 2
  uint32_t warp_sums[32];
  uint32_t warp_gt[32], warp_eq[32];
  Pick pick;
  uint32_t buf_count;
  alignas(16) uint32_t keys[4];  // the row's keys: key i at keys[mis + i], 0 around them (dynamic)
};
static_assert(kBufKeys <= kBins0, "the candidate buffer reuses the level-0 histogram");
static_assert(offsetof(WholeRowSmem, keys) % 16 == 0, "16-byte shared loads of the keys");

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

// hist[key >> shift] += 1 unless key is 0 (-inf), as a predicated shared reduction: no branch.
__device__ __forceinline__ void count_key(const uint32_t* hist, uint32_t key, int shift) {
  const uint32_t at = uint32_t(__cvta_generic_to_shared(hist + (key >> shift)));
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t@p red.shared.add.u32 [%0], 1;\n\t}"
               ::"r"(at), "r"(key) : "memory");
}

__device__ __forceinline__ uint32_t count_gt(const uint4& v, uint32_t t) {
  return uint32_t(v.x > t) + uint32_t(v.y > t) + uint32_t(v.z > t) + uint32_t(v.w > t);
}
__device__ __forceinline__ uint32_t count_eq(const uint4& v, uint32_t t) {
  return uint32_t(v.x == t) + uint32_t(v.y == t) + uint32_t(v.z == t) + uint32_t(v.w == t);
}

// The output over the row's keys (groups of 4: [0, groups)): ids of the keys > t and of the first
// `need` keys == t (t = 0: every candidate; keys 0 are never taken), ascending, then -1 to topk.
// Each warp takes a contiguous range of groups: it counts, the block adds up the warps before it,
// and it walks its range again writing each taken key to its slot.
template <int kT>
__device__ __forceinline__ void whole_row_write(WholeRowSmem& s, int groups, int32_t first_id,
                                                uint32_t t, uint32_t need, int32_t* out,
                                                int topk) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4* k4 = reinterpret_cast<const uint4*>(s.keys);
  const int per = (groups + (kT / 32) - 1) / (kT / 32);
  const int ga = min(groups, warp * per), gb = min(groups, ga + per);
  uint32_t gt = 0, eq = 0;
  for (int g = ga + lane; g < gb; g += 32) {
    const uint4 v = k4[g];
    gt += count_gt(v, t);
    if (t != 0) eq += count_eq(v, t);
  }
  gt = __reduce_add_sync(0xffffffffu, gt);
  eq = __reduce_add_sync(0xffffffffu, eq);
  if (lane == 0) {
    s.warp_gt[warp] = gt;
    s.warp_eq[warp] = eq;
  }
  __syncthreads();
  // The warps before this one and all of them, by two lane reductions (lane w reads warp w's).
  constexpr int kW = kT / 32;
  const uint32_t wg = lane < kW ? s.warp_gt[lane] : 0u, we = lane < kW ? s.warp_eq[lane] : 0u;
  uint32_t sel = __reduce_add_sync(0xffffffffu, lane < warp ? wg : 0u);
  uint32_t tie = __reduce_add_sync(0xffffffffu, lane < warp ? we : 0u);
  const uint32_t all_gt = __reduce_add_sync(0xffffffffu, wg);
  const uint32_t all_eq = __reduce_add_sync(0xffffffffu, we);
  const uint32_t above_t = uint32_t(topk) - need;
  for (int base = ga; base < gb; base += 32) {
    if (t != 0 && sel >= above_t && tie >= need) break;  // the rest takes nothing (warp-uniform)
    const int g = base + lane;
    const uint4 v = g < gb ? k4[g] : make_uint4(0u, 0u, 0u, 0u);
    const uint32_t key[4] = {v.x, v.y, v.z, v.w};
    uint32_t gm = 0, em = 0;  // this thread's keys above t and equal to t, a bit each
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      gm |= key[e] > t ? 1u << e : 0u;
      em |= t != 0 && key[e] == t ? 1u << e : 0u;
    }
    const uint32_t c = (uint32_t(__popc(gm)) << 16) | uint32_t(__popc(em));
    uint32_t total;
    const uint32_t excl = warp_exclusive_scan(c, total);
    uint32_t ls = sel + (excl >> 16), lt = tie + (excl & 0xffffu);
    const int32_t id0 = first_id + 4 * g;
    if (__any_sync(0xffffffffu, em != 0)) {  // ties in this step: key by key
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (gm & (1u << e)) {
          const uint32_t slot = ls + min(lt, need);
          if (slot < uint32_t(topk)) out[slot] = id0 + e;
          ++ls;
        } else if (em & (1u << e)) {
          if (lt < need && ls + lt < uint32_t(topk)) out[ls + lt] = id0 + e;
          ++lt;
        }
      }
    } else {  // no ties: this thread's keys above t take consecutive slots
      // (The counts by a ballot per key slot instead of the warp scan: 22.4 -> 23.1 us.)
      uint32_t slot = ls + min(lt, need);
      while (gm != 0) {
        const int e = __ffs(gm) - 1;
        gm &= gm - 1;
        if (slot < uint32_t(topk)) out[slot] = id0 + e;
        ++slot;
      }
    }
    sel += total >> 16;
    tie += total & 0xffffu;
  }
  const uint32_t written = min(all_gt + min(all_eq, need), uint32_t(topk));
  for (uint32_t i = written + threadIdx.x; i < uint32_t(topk); i += kT) out[i] = -1;
}

// The keys of groups [0, groups) whose bits above `shift` equal `prefix`, appended to the
// candidate buffer (the caller made sure that they fit).
template <int kT>
__device__ __forceinline__ void whole_row_collect(WholeRowSmem& s, int groups, uint32_t prefix,
                                                  int shift) {
  const uint4* k4 = reinterpret_cast<const uint4*>(s.keys);
  uint32_t* buf = s.hist0;
  for (int g = threadIdx.x; g < groups; g += kT) {
    const uint4 v = k4[g];
    const uint32_t key[4] = {v.x, v.y, v.z, v.w};
    bool take[4];
    uint32_t c = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      take[e] = key[e] != 0 && (key[e] >> shift) == prefix;
      c += take[e] ? 1u : 0u;
    }
    if (c == 0) continue;
    uint32_t at = atomicAdd(&s.buf_count, c);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (take[e]) {
        if (at < kBufKeys) buf[at] = key[e];
        ++at;
      }
  }
  __syncthreads();
}

// Histogram of the digit below `shift` (10 bits) of the keys whose bits above `shift` equal
// `prefix`, into hist1: from the candidate buffer, or from the whole row.
template <int kT>
__device__ __forceinline__ void whole_row_refine(WholeRowSmem& s, int groups, bool buffered,
                                                 uint32_t prefix, int shift) {
  for (int i = threadIdx.x; i < kBins; i += kT) s.hist1[i] = 0;
  __syncthreads();
  const int dshift = shift - 10;
  const auto add = [&](uint32_t k) {
    if (k != 0 && (k >> shift) == prefix) atomicAdd(&s.hist1[(k >> dshift) & (kBins - 1)], 1u);
  };
  if (buffered) {
    const int nbuf = int(min(s.buf_count, uint32_t(kBufKeys)));
    for (int i = threadIdx.x; i < nbuf; i += kT) add(s.hist0[i]);
  } else {
    const uint4* k4 = reinterpret_cast<const uint4*>(s.keys);
    for (int g = threadIdx.x; g < groups; g += kT) {
      const uint4 v = k4[g];
      add(v.x);
      add(v.y);
      add(v.z);
      add(v.w);
    }
  }
  __syncthreads();
}

// One CTA per row; the row's keys fit in its shared memory (token_topk sizes it).
template <int kT>
__global__ void __launch_bounds__(kT) token_topk_whole_row_kernel(TokenTopKParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  WholeRowSmem& s = *reinterpret_cast<WholeRowSmem*>(smem_raw);
  const int64_t r = blockIdx.x;
  int32_t lo, hi;
  row_range(p, r, lo, hi);
  int32_t* out = p.ids + r * p.topk;
  const float* x = p.logits + r * p.ld + lo;
  const int n = hi - lo;
  const uint32_t k = uint32_t(p.topk);
  const bool select = uint32_t(n) > k;
  // keys[mis + i] holds key i, so that the 16-byte global loads land on 16-byte shared stores;
  // keys[0, mis) and the padding to a multiple of 4 are 0 (never taken).
  const int mis = int((reinterpret_cast<uintptr_t>(x) >> 2) & 3);
  const int groups = (mis + n + 3) >> 2;
  if (int(threadIdx.x) < mis) s.keys[threadIdx.x] = 0u;
  if (mis + n + int(threadIdx.x) < 4 * groups) s.keys[mis + n + threadIdx.x] = 0u;
  if (select) {
    for (int i = threadIdx.x; i < kBins0; i += kT) s.hist0[i] = 0;
    if (threadIdx.x == 0) s.buf_count = 0;
    __syncthreads();
  }
  // Pass 1: the row into shared memory as keys, with the level-0 histogram when selecting.
  const auto visit = [&s, mis, select](int i, float v) {
    const uint32_t key = topk_key(v);
    s.keys[mis + i] = key;
    if (select && key != 0) atomicAdd(&s.hist0[key >> kShift0], 1u);
  };
  const int head = min(n, (4 - mis) & 3);
  if (int(threadIdx.x) < head) visit(threadIdx.x, __ldg(x + threadIdx.x));
  const int nvec = (n - head) >> 2;
  const float4* vec = reinterpret_cast<const float4*>(x + head);
  uint4* k4 = reinterpret_cast<uint4*>(s.keys + mis + head);  // 16-byte aligned
  // 4 16-byte loads in flight a thread: 8 took TOPK2048-B64 from 22.5 to 23.8 us.
  for (int j0 = threadIdx.x; j0 < nvec; j0 += 4 * kT) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * kT;
      if (j < nvec) v[u] = __ldg(vec + j);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u * kT;
      if (j < nvec) {
        const uint4 key = make_uint4(topk_key(v[u].x), topk_key(v[u].y), topk_key(v[u].z),
                                     topk_key(v[u].w));
        k4[j] = key;
        if (select) {
          count_key(s.hist0, key.x, kShift0);
          count_key(s.hist0, key.y, kShift0);
          count_key(s.hist0, key.z, kShift0);
          count_key(s.hist0, key.w, kShift0);
        }
      }
    }
  }
  const int tail = head + 4 * nvec + int(threadIdx.x);
  if (tail < n) visit(tail, __ldg(x + tail));
  __syncthreads();
  const int32_t first_id = lo - mis;  // the id of keys[i] is first_id + i
  if (!select) {  // every candidate is taken
    whole_row_write<kT>(s, groups, first_id, 0u, 0u, out, p.topk);
    return;
  }
  find_bucket_in<kT>(s.hist0, kBins0, k, s.pick, s.warp_sums);
  if (s.pick.total <= k) {  // at most topk candidates (the rest is -inf)
    whole_row_write<kT>(s, groups, first_id, 0u, 0u, out, p.topk);
    return;
  }
  uint32_t remaining = k - s.pick.above, prefix = s.pick.bucket;
  bool buffered = false;
  if (s.pick.count <= uint32_t(kBufKeys)) {  // hist0 is free from here: the buffer
    whole_row_collect<kT>(s, groups, prefix, kShift0);
    buffered = true;
  }
  whole_row_refine<kT>(s, groups, buffered, prefix, kShift0);
  find_bucket_in<kT>(s.hist1, kBins, remaining, s.pick, s.warp_sums);
  remaining -= s.pick.above;
  prefix = (prefix << 10) | s.pick.bucket;
  if (!buffered && s.pick.count <= uint32_t(kBufKeys)) {
    whole_row_collect<kT>(s, groups, prefix, kShift1);
    buffered = true;
  }
  whole_row_refine<kT>(s, groups, buffered, prefix, kShift1);
  find_bucket_in<kT>(s.hist1, kBins, remaining, s.pick, s.warp_sums);
  remaining -= s.pick.above;
  const uint32_t t = (prefix << 10) | s.pick.bucket;
  whole_row_write<kT>(s, groups, first_id, t, remaining, out, p.topk);
}

template <int kT>
void launch_whole_row(const TokenTopKParams& p, int64_t rows, int64_t smem, cudaStream_t stream) {
  allow_dynamic_smem(token_topk_whole_row_kernel<kT>, size_t(smem), "token_topk");
  token_topk_whole_row_kernel<kT><<<unsigned(rows), kT, size_t(smem), stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void token_topk(const TokenTopKArgs& a, cudaStream_t stream) {
  const int64_t rows = a.logits.shape[0], cols = a.logits.shape[1];
  if (rows == 0) return;
  TokenTopKParams p{};
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
  // Rows that fit in shared memory take the whole-row kernel (the longest row deciding) when two
  // CTAs fit an SM, or when there are no more rows than SMs (then with 1024 threads).
  const int64_t whole = int64_t(offsetof(WholeRowSmem, keys)) + 4 * (cols + 8);
  const int64_t per = int64_t(per_sm) / (whole + 1024);
  if (whole <= int64_t(optin) && (per >= 2 || rows <= sms)) {
    if (per >= 2) return launch_whole_row<kThreads>(p, rows, whole, stream);
    return launch_whole_row<1024>(p, rows, whole, stream);
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
