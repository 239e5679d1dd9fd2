// Inputs of the token-sparse builders' tests (tests/cpu/test_token_sparse.cpp,
// tests/cuda/test_token_sparse_gpu.cu): rows of distinct key positions in any order with -1
// anywhere, and int32 host tensors filled from and read into vectors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "support/host_tensor.h"

namespace msa::test {

inline std::vector<int32_t> values(const HostTensor& h) {
  return {h.data<int32_t>(), h.data<int32_t>() + h.t.numel()};
}

inline void fill(HostTensor& h, const std::vector<int32_t>& v) {
  ASSERT_EQ(int64_t(v.size()), h.t.numel());
  if (!v.empty()) std::memcpy(h.data<int32_t>(), v.data(), v.size() * 4);
}

// [heads, rows, k]: each row up to k distinct positions below its length (row_len), shuffled
// with the -1 entries (-1 anywhere, empty rows too).
inline std::vector<int32_t> random_positions(std::mt19937& rng, const std::vector<int32_t>& row_len,
                                             int64_t heads, int64_t k) {
  const int64_t rows = int64_t(row_len.size());
  std::vector<int32_t> out(size_t(heads * rows * k), -1);
  for (int64_t r = 0; r < heads * rows; ++r) {
    const int32_t n = row_len[r % rows];
    std::vector<int32_t> all(n);
    for (int32_t i = 0; i < n; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t take = std::min<int64_t>(k, n) ? int64_t(rng() % (std::min<int64_t>(k, n) + 1)) : 0;
    std::copy(all.begin(), all.begin() + take, out.begin() + r * k);
    std::shuffle(out.begin() + r * k, out.begin() + (r + 1) * k, rng);
  }
  return out;
}

}  // namespace msa::test
