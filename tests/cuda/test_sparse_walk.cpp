// The uniform kernel's walk order (src/cuda/sm90/sparse_fwd/walk.h), host code that needs no
// device: pair_at is a bijection onto the (kv head, query block) pairs for every window, latest
// query blocks first within each kv head, windows in turn; window 1 is the plain order
// o = (qblock_cap - 1 - g) * Hkv + h; and walk_window on the benchmark shapes (window 1 where
// their K/V fit the L2).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/sm90/sparse_fwd/walk.h"

namespace msa::cuda::sparse_fwd {
namespace {

TEST(SparseWalk, PairAtVisitsEveryPairOnceLatestFirst) {
  for (int64_t hkv : {1, 2, 3, 8}) {
    for (int64_t cap : {1, 2, 5, 64, 67, 1728}) {
      for (int64_t window : {1, 2, 7, 64, 66, 2000}) {
        SCOPED_TRACE(testing::Message() << "hkv " << hkv << " cap " << cap << " window " << window);
        std::vector<int> seen(static_cast<size_t>(hkv * cap), 0);
        std::vector<int64_t> last_g(static_cast<size_t>(hkv), cap);
        int64_t prev_window = 0;
        for (int64_t o = 0; o < hkv * cap; ++o) {
          const WalkPair p = pair_at(o, hkv, cap, window);
          ASSERT_GE(p.h, 0);
          ASSERT_LT(p.h, hkv);
          ASSERT_GE(p.g, 0);
          ASSERT_LT(p.g, cap);
          ++seen[static_cast<size_t>(p.h * cap + p.g)];
          // Within a kv head the query blocks descend; windows never go back.
          EXPECT_LT(p.g, last_g[static_cast<size_t>(p.h)]);
          last_g[static_cast<size_t>(p.h)] = p.g;
          const int64_t w = (cap - 1 - p.g) / window;
          EXPECT_GE(w, prev_window);
          prev_window = w;
          if (window == 1) {
            EXPECT_EQ(p.h, o % hkv);
            EXPECT_EQ(p.g, cap - 1 - o / hkv);
          }
        }
        for (int n : seen) ASSERT_EQ(n, 1);
      }
    }
  }
}

TEST(SparseWalk, WindowSpansTheCtasOfOneKvHead) {
  constexpr int64_t kL2 = 50 << 20;  // H100
  constexpr int64_t kMB = 1 << 20;
  EXPECT_EQ(walk_window(132, 2, 453 * kMB, kL2), 66);  // BSR-108K: 64-query blocks, G = 4
  EXPECT_EQ(walk_window(132, 16, 67 * kMB, kL2), 9);   // P32K-blk: 128-query blocks, G = 16
  EXPECT_EQ(walk_window(132, 3, 33 * kMB, kL2), 1);    // P16K-blk-D64: its K/V fit the L2
  EXPECT_EQ(walk_window(132, 200, 453 * kMB, kL2), 1); // a pair with more units than CTAs
  EXPECT_EQ(walk_window(1, 1, 453 * kMB, kL2), 1);
  EXPECT_EQ(walk_window(132, 2, 453 * kMB, 0), 66);    // no L2 reported
}

}  // namespace
}  // namespace msa::cuda::sparse_fwd
