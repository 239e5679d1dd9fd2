// Walk order of the uniform kernel's units (uniform_scheduler.cuh): the (kv head, query block)
// pairs in windows of `window` query blocks, latest window first; inside a window each kv head's
// pairs in turn, latest query block first. Plain constexpr C++, shared by the prep kernels and the
// host (prep.cu's choice of the window, tests/cuda/test_sparse_walk.cpp).
//
// Latest query blocks first is longest-processing-time-first under causal masking: the CTAs'
// round-robin takes the long units first and ends on the short ones. The window makes the units
// in flight at once those of one kv head, so that their selected K/V blocks meet in L2: under
// BSR-108K's selections (each 64-query row its own random blocks, 2 units a pair at G = 4),
// window 1 (o = (qblock_cap - 1 - g) * Hkv + h: 8 kv heads in flight) read 20.3 GB from DRAM
// and the window of one SM's worth of units 7.1 GB (L2 hits 43 -> 74%).
#pragma once

#include <cstdint>

namespace msa::cuda::sparse_fwd {

struct WalkPair {
  int64_t h, g;  // kv head, global query block
};

// The pair at walk position o in [0, hkv * qblock_cap).
constexpr WalkPair pair_at(int64_t o, int64_t hkv, int64_t qblock_cap, int64_t window) {
  const int64_t span = window * hkv, wi = o / span, rem = o - wi * span;
  const int64_t rest = qblock_cap - wi * window;
  const int64_t width = window < rest ? window : rest;  // the last window may be short
  return {rem / width, qblock_cap - 1 - (wi * window + rem % width)};
}

// The window for `ctas` persistent CTAs and units_per_qblock units a full pair: as many query
// blocks as the CTAs take units of at once, so that those in flight are one kv head's; 1 when the
// K/V the call can select (kv_bytes, every kv head) fit the L2 (l2_bytes). Then every order
// already finds its K/V in L2, and a window only narrows Q and out to one head's slice of each
// token row: P16K-blk-D64 (33.5 MB of K/V, H100 L2 50 MB) measured 1.2% slower with it.
constexpr int64_t walk_window(int64_t ctas, int64_t units_per_qblock, int64_t kv_bytes,
                              int64_t l2_bytes) {
  if (kv_bytes <= l2_bytes) return 1;
  const int64_t w = (ctas + units_per_qblock - 1) / units_per_qblock;
  return w > 1 ? w : 1;
}

}  // namespace msa::cuda::sparse_fwd
