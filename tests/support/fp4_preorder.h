// The preordered FP4 scale layout written from its definition in include/msa/quant.h, apart from
// src/common/fp4_scale_layout.h, so the tests check the library's reorder and the indexer's reads
// against a second implementation. Used by test_quant, test_block_scores_fp4 and test_indexer_gpu.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/host_tensor.h"

namespace msa::test {

// Where the scale of (matrix l, row m, group g) sits in [L, rest_m, rest_g, 32, 4, 4].
inline int64_t preordered_index(int64_t l, int64_t m, int64_t g, int64_t rest_m, int64_t rest_g) {
  return l * 512 * rest_m * rest_g + (m / 128) * 512 * rest_g + (g / 4) * 512 + (m % 32) * 16 +
         ((m / 32) % 4) * 4 + g % 4;
}

// Public scales preordered by a loop over every public element, padding zero: flat [T, H, G] ->
// [H, ceil(T / 128), ceil(G / 4), 32, 4, 4] (l = h, m = t); a pool [P, 128, H, G] (paged_nhd) or
// [P, H, 128, G] (paged_hnd) -> [P * H, 1, ceil(G / 4), 32, 4, 4] (l = page * H + h, m = slot).
inline HostTensor preorder(const HostTensor& pub, KVLayout layout) {
  const Tensor& t = pub.t;
  const int64_t G = t.shape[t.ndim - 1], rest_g = (G + 3) / 4;
  const uint8_t* src = pub.data<uint8_t>();
  if (layout == KVLayout::flat) {
    const int64_t T = t.shape[0], H = t.shape[1], rest_m = (T + 127) / 128;
    HostTensor out(t.dtype, {H, rest_m, rest_g, 32, 4, 4});
    std::memset(out.data<uint8_t>(), 0, out.bytes());
    for (int64_t tok = 0; tok < T; ++tok)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t g = 0; g < G; ++g)
          out.data<uint8_t>()[preordered_index(h, tok, g, rest_m, rest_g)] =
              src[pub.offset({tok, h, g})];
    return out;
  }
  const bool nhd = layout == KVLayout::paged_nhd;
  const int64_t P = t.shape[0], S = nhd ? t.shape[1] : t.shape[2];
  const int64_t H = nhd ? t.shape[2] : t.shape[1];
  HostTensor out(t.dtype, {P * H, 1, rest_g, 32, 4, 4});
  std::memset(out.data<uint8_t>(), 0, out.bytes());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t g = 0; g < G; ++g)
          out.data<uint8_t>()[preordered_index(p * H + h, s, g, 1, rest_g)] =
              src[nhd ? pub.offset({p, s, h, g}) : pub.offset({p, h, s, g})];
  return out;
}

// The preordered shape of a public scale tensor of `layout`.
inline std::vector<int64_t> preordered_shape(const Tensor& pub, KVLayout layout) {
  const int64_t rest_g = (pub.shape[pub.ndim - 1] + 3) / 4;
  if (layout == KVLayout::flat) return {pub.shape[1], (pub.shape[0] + 127) / 128, rest_g, 32, 4, 4};
  const int64_t heads = pub.shape[layout == KVLayout::paged_nhd ? 2 : 1];
  return {pub.shape[0] * heads, 1, rest_g, 32, 4, 4};
}

// A public scale tensor of `shape` holding random nonzero bytes (zero is the padding's value), its
// rows padded by 3 bytes when `strided` (the last dim stays contiguous).
inline HostTensor random_scales(DType dtype, const std::vector<int64_t>& shape, bool strided,
                                std::mt19937& rng) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1] + (d == int(shape.size()) - 2 && strided ? 3 : 0);
  HostTensor s(dtype, shape, strides);
  std::uniform_int_distribution<int> byte(1, 0xfe);
  for (size_t i = 0; i < s.bytes(); ++i) s.data<uint8_t>()[i] = uint8_t(byte(rng));
  return s;
}

}  // namespace msa::test
