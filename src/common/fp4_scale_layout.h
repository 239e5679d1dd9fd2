// The preordered FP4 scale layout (docs/semantics.md, Quantized formats): where the scale of
// (matrix l, row m, group g) sits, and how a public scale tensor maps onto (l, m, g). Host and
// device: the CPU indexer reads it, the CPU and CUDA reorder functions write it.
#pragma once

#include <cstdint>

#include "common/codecs.h"  // MSA_HD
#include "msa/common.h"

namespace msa::fp4_layout {

// One tile holds 128 rows x 4 groups = 512 bytes, stored [32][4][4]: row m of the tile at
// (m % 32, m / 32), group g at g % 4. This is the order in which an MMA fragment wants a tile's
// scales, so a kernel loads one contiguous 512-byte tile per 128 rows and 4 groups.
inline constexpr int64_t kTileRows = 128;
inline constexpr int64_t kTileGroups = 4;
inline constexpr int64_t kTileBytes = 512;

// Tiles that hold `rows` rows / `groups` groups (never forms rows + 127: a view's claimed sizes may
// be near 2^63).
MSA_HD int64_t rest_rows(int64_t rows) { return rows <= 0 ? 0 : (rows - 1) / kTileRows + 1; }
MSA_HD int64_t rest_groups(int64_t groups) {
  return groups <= 0 ? 0 : (groups - 1) / kTileGroups + 1;
}

// The offset of group 0 of (l, m) in a [L, rest_m, rest_g, 32, 4, 4] contiguous tensor.
MSA_HD int64_t row_offset(int64_t l, int64_t m, int64_t rest_m, int64_t rest_g) {
  return ((l * rest_m + m / kTileRows) * rest_g) * kTileBytes + (m % 32) * 16 + ((m / 32) % 4) * 4;
}
// What group g adds to row_offset.
MSA_HD int64_t group_offset(int64_t g) { return (g / kTileGroups) * kTileBytes + g % kTileGroups; }

// The inverse: the (l, m, g) that element i of a [L, rest_m, rest_g, 32, 4, 4] tensor holds.
struct Coord {
  int64_t l, m, g;
};
MSA_HD Coord coord_of(int64_t i, int64_t rest_m, int64_t rest_g) {
  const int64_t g_in = i % 4, m_hi = (i / 4) % 4, m_lo = (i / 16) % 32, tile = i / kTileBytes;
  const int64_t gt = tile % rest_g, mt = (tile / rest_g) % rest_m, l = tile / (rest_g * rest_m);
  return {l, mt * kTileRows + m_hi * 32 + m_lo, gt * kTileGroups + g_in};
}

// A public FP4 scale tensor seen as L matrices of `rows` x `groups` scales: [T, H, G] (flat: l = h,
// m = t) or a page pool [P, 128, H, G] / [P, H, 128, G] (l = page * H + h, m = slot).
struct PublicScales {
  int64_t heads = 0;   // H
  int64_t rows = 0;    // T (flat) or 128 (a page's slots)
  int64_t groups = 0;  // G = D / 16 (NVFP4) or D / 32 (MXFP4)
  int64_t matrices = 0;  // L = H (flat) or P * H (pools)
  int64_t page_stride = 0, head_stride = 0, row_stride = 0;  // elements; groups are contiguous

  MSA_HD int64_t rest_m() const { return rest_rows(rows); }
  MSA_HD int64_t rest_g() const { return rest_groups(groups); }
  MSA_HD int64_t offset(int64_t l, int64_t m, int64_t g) const {
    return (l / heads) * page_stride + (l % heads) * head_stride + m * row_stride + g;
  }
};

// The view of a validated public scale: 3-D for `flat`, 4-D for the pool layouts.
inline PublicScales public_scales(const Tensor& s, KVLayout layout) {
  PublicScales p;
  p.groups = s.shape[s.ndim - 1];
  if (layout == KVLayout::flat) {
    p.heads = s.shape[1];
    p.rows = s.shape[0];
    p.matrices = p.heads;
    p.head_stride = s.strides[1];
    p.row_stride = s.strides[0];
    return p;
  }
  const bool nhd = layout == KVLayout::paged_nhd;
  p.heads = nhd ? s.shape[2] : s.shape[1];
  p.rows = nhd ? s.shape[1] : s.shape[2];
  p.matrices = s.shape[0] * p.heads;
  p.page_stride = s.strides[0];
  p.head_stride = nhd ? s.strides[2] : s.strides[1];
  p.row_stride = nhd ? s.strides[1] : s.strides[2];
  return p;
}

}  // namespace msa::fp4_layout
