// The CPU indexer (block_scores, block_topk) over FP4 keys in a page pool and over FP4 scales in
// the preordered layout (docs/semantics.md, Block scores and Quantized formats): each must give
// the bits of the same keys in a flat cache with public scales; and the argument rules of both.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "support/attention_problem.h"
#include "support/fp4_preorder.h"

namespace msa::test {
namespace {

// A varlen problem with FP4 q and K (values quantized on the host from random bf16 ones): NVFP4
// (global scales 0.5 for q, 0.75 for K) or MXFP4.
struct Fp4Problem {
  Problem p;
  HostTensor q, q_scale;
  float q_global;

  Fp4Problem(std::vector<int32_t> lq, std::vector<int32_t> lk, int64_t dim, bool nvfp4, unsigned seed)
      : p(make_problem(std::move(lq), std::move(lk), 8, 2, dim, seed)),
        q(DType::fp4x2, {p.total_q(), p.hq, dim / 2}),
        q_scale(nvfp4 ? DType::fp8_e4m3 : DType::e8m0, {p.total_q(), p.hq, dim / (nvfp4 ? 16 : 32)}),
        q_global(nvfp4 ? 0.5f : 1.f) {
    quantize(p.q.t, nvfp4 ? QuantFormat::nvfp4 : QuantFormat::mxfp4, qtensor());
    quantize_kv_fp4(p, nvfp4);
  }
  QTensor qtensor() const { return QTensor(q.t, q_scale.t, q_global); }
  int64_t nblk(int blk) const {
    int64_t m = 0;
    for (int32_t l : p.lk) m = std::max<int64_t>(m, (l + blk - 1) / blk);
    return m;
  }
};

HostTensor run_scores(const Fp4Problem& f, const QTensor& q, const KVCache& kv, int blk) {
  HostTensor scores(DType::f32, {f.p.hq, f.nblk(blk), f.p.total_q()});  // poisoned: NaN
  BlockScoresArgs a;
  a.q = q;
  a.kv = kv;
  a.cu_seqlens_q = f.p.cu_q.t;
  a.scores = scores.t;
  a.kv_block_size = blk;
  block_scores(a);
  return scores;
}

BlockTopKArgs topk_args(const Fp4Problem& f, const QTensor& q, const KVCache& kv, int blk,
                        const HostTensor& q2k) {
  BlockTopKArgs a;
  a.q = q;
  a.kv = kv;
  a.cu_seqlens_q = f.p.cu_q.t;
  a.kv_block_size = blk;
  a.topk = int(q2k.t.shape[2]);
  a.q2k = q2k.t;
  return a;
}

HostTensor run_topk(const Fp4Problem& f, const QTensor& q, const KVCache& kv, int blk, int topk) {
  HostTensor q2k(DType::i32, {f.p.hkv, f.p.total_q(), topk});
  block_topk(topk_args(f, q, kv, blk, q2k));
  return q2k;
}

// Bitwise equal, and the reference was written everywhere (the quantized inputs are finite, so
// no score is NaN: a NaN left is the output's poison).
::testing::AssertionResult same_bits(const HostTensor& got, const HostTensor& want) {
  if (got.bytes() != want.bytes() || std::memcmp(got.t.data, want.t.data, got.bytes()) != 0)
    return ::testing::AssertionFailure() << "outputs differ";
  if (want.t.dtype == DType::f32)
    for (int64_t i = 0; i < want.t.numel(); ++i)
      if (std::isnan(want.data<float>()[i])) return ::testing::AssertionFailure() << "entry " << i << " unwritten";
  return ::testing::AssertionSuccess();
}

std::string fmt_name(bool nvfp4) { return nvfp4 ? "nvfp4" : "mxfp4"; }

// ------------------------------- FP4 page pools -------------------------------

// Scales a pool of the values' layout (NaN bytes in the slots that hold no key), pages shuffled,
// page-table columns past each request's pages invalid (never read with seqused_k).
TEST(BlockScoresFp4, PagedEqualsFlat) {
  unsigned seed = 1;
  for (bool nvfp4 : {true, false}) {
    const Fp4Problem f({5, 33, 1}, {40, 300, 129}, 96, nvfp4, seed++);
    for (int blk : {64, 128}) {
      const HostTensor flat = run_scores(f, f.qtensor(), f.p.flat_kv(), blk);
      const HostTensor flat_ids = run_topk(f, f.qtensor(), f.p.flat_kv(), blk, 3);
      for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
        for (int64_t ps : {16, 64, 128}) {
          SCOPED_TRACE(fmt_name(nvfp4) + " " + kv_layout_name(layout) + " page " +
                       std::to_string(ps) + " blk " + std::to_string(blk));
          const PagedKV paged = make_paged(f.p, layout, ps, seed++);
          EXPECT_TRUE(same_bits(run_scores(f, f.qtensor(), paged.cache(), blk), flat));
          EXPECT_TRUE(same_bits(run_topk(f, f.qtensor(), paged.cache(), blk, 3), flat_ids));
        }
    }
  }
}

// Without seqused_k every request holds max_pages * page_size keys: requests of whole pages.
TEST(BlockScoresFp4, PagedWithoutSequsedK) {
  unsigned seed = 40;
  for (bool nvfp4 : {true, false})
    for (int64_t ps : {64, 128}) {
      SCOPED_TRACE(fmt_name(nvfp4) + " page " + std::to_string(ps));
      const Fp4Problem f({7, 40}, {256, 256}, 64, nvfp4, seed++);
      const PagedKV paged = make_paged(f.p, KVLayout::paged_hnd, ps, seed++, 0, 2, /*extra_columns=*/0);
      EXPECT_TRUE(same_bits(run_scores(f, f.qtensor(), paged.cache(false), 128),
                            run_scores(f, f.qtensor(), f.p.flat_kv(), 128)));
      EXPECT_TRUE(same_bits(run_topk(f, f.qtensor(), paged.cache(false), 128, 2),
                            run_topk(f, f.qtensor(), f.p.flat_kv(), 128, 2)));
    }
}

// ------------------------------- preordered scales -------------------------------

// q's scales, K's or both preordered give the public layout's bits: flat K, and 128-slot pools
// in both layouts. D = 96 leaves padding groups in the last tile (NVFP4 6 of 8, MXFP4 3 of 4),
// D = 128 fills them; 170 queries and 429 keys leave padding rows in the last row tile.
TEST(BlockScoresFp4, PreorderedScalesEqualPublic) {
  unsigned seed = 80;
  for (bool nvfp4 : {true, false})
    for (int64_t dim : {96, 128}) {
      const Fp4Problem f({100, 70}, {300, 129}, dim, nvfp4, seed++);
      const HostTensor q_pre = preorder(f.q_scale, KVLayout::flat);
      const HostTensor k_pre = preorder(*f.p.k_scale, KVLayout::flat);
      const QTensor q_public = f.qtensor(), q_preordered(f.q.t, q_pre.t, f.q_global);
      KVCache k_preordered = f.p.flat_kv();
      k_preordered.k.scale = k_pre.t;
      const HostTensor want = run_scores(f, q_public, f.p.flat_kv(), 128);
      const HostTensor want_ids = run_topk(f, q_public, f.p.flat_kv(), 128, 3);
      struct Variant {
        const char* name;
        QTensor q;
        KVCache kv;
      };
      std::vector<Variant> variants = {{"q preordered", q_preordered, f.p.flat_kv()},
                                       {"k preordered", q_public, k_preordered},
                                       {"both preordered", q_preordered, k_preordered}};
      std::vector<PagedKV> pools;
      std::vector<HostTensor> pool_scales;
      for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
        pools.push_back(make_paged(f.p, layout, 128, seed++));
        pool_scales.push_back(preorder(*pools.back().k_scale, layout));
      }
      for (size_t i = 0; i < pools.size(); ++i) {
        KVCache kv = pools[i].cache();
        kv.k.scale = pool_scales[i].t;
        variants.push_back({i == 0 ? "paged_nhd pool preordered" : "paged_hnd pool preordered",
                            q_preordered, kv});
      }
      for (const Variant& v : variants) {
        SCOPED_TRACE(fmt_name(nvfp4) + " D " + std::to_string(dim) + ": " + v.name);
        EXPECT_TRUE(same_bits(run_scores(f, v.q, v.kv, 128), want));
        EXPECT_TRUE(same_bits(run_topk(f, v.q, v.kv, 128, 3), want_ids));
      }
    }
}

// ------------------------------- argument errors -------------------------------

TEST(BlockScoresFp4Errors, PagedAndPreorderedRules) {
  const Fp4Problem f({100, 70}, {300, 129}, 96, true, 120);  // Hq 8, Hkv 2, G 6: restG 2
  const int64_t T = f.p.total_q();                            // 170: restM 2
  const auto scores = [&](const QTensor& q, const KVCache& kv) { run_scores(f, q, kv, 128); };
  const auto with_q_scale = [&](const Tensor& s) { return QTensor(f.q.t, s, f.q_global); };

  HostTensor short_m(DType::fp8_e4m3, {8, 1, 2, 32, 4, 4});
  expect_error([&] { scores(with_q_scale(short_m.t), f.p.flat_kv()); },
               "q.scale: preordered FP4 scales must be [8, 2, 2, 32, 4, 4] ([H, ceil(T / 128), "
               "ceil(G / 4), 32, 4, 4] with G = D / group), got fp8_e4m3[8, 1, 2, 32, 4, 4]");
  HostTensor strided(DType::fp8_e4m3, {8, 2, 2, 32, 4, 4}, {2 * 2 * 512, 2 * 512, 512, 16, 4, 2});
  expect_error([&] { scores(with_q_scale(strided.t), f.p.flat_kv()); }, "q.scale: must be contiguous");
  HostTensor u8(DType::u8, {8, 2, 2, 32, 4, 4});
  expect_error([&] { scores(with_q_scale(u8.t), f.p.flat_kv()); },
               "q.scale: dtype must be fp8_e4m3 or e8m0, got u8");
  HostTensor five_d(DType::fp8_e4m3, {8, 2, 2, 32, 16});
  expect_error([&] { scores(with_q_scale(five_d.t), f.p.flat_kv()); },
               "q.scale: shape must be [" + std::to_string(T) + ", 8, 6]");

  // Flat keys: L = Hkv = 2, restM = ceil(429 / 128) = 4.
  KVCache kv = f.p.flat_kv();
  HostTensor k_wrong(DType::fp8_e4m3, {2, 3, 2, 32, 4, 4});
  kv.k.scale = k_wrong.t;
  expect_error([&] { scores(f.qtensor(), kv); },
               "k.scale: preordered FP4 scales must be [2, 4, 2, 32, 4, 4]");

  // Pools: page size 128 only; L = num_pages * Hkv.
  const PagedKV p64 = make_paged(f.p, KVLayout::paged_nhd, 64, 121);
  kv = p64.cache();
  const int64_t pages64 = p64.k.t.shape[0];
  HostTensor pre64(DType::fp8_e4m3, {pages64 * 2, 1, 2, 32, 4, 4});
  kv.k.scale = pre64.t;
  expect_error([&] { scores(f.qtensor(), kv); },
               "k.scale: preordered FP4 scales of a page pool need page_size 128 (each page is one "
               "128-row tile), got page_size 64");
  const PagedKV p128 = make_paged(f.p, KVLayout::paged_hnd, 128, 122);
  kv = p128.cache();
  const int64_t pages = p128.k.t.shape[0];
  HostTensor pre_l(DType::fp8_e4m3, {pages, 1, 2, 32, 4, 4});
  kv.k.scale = pre_l.t;
  expect_error([&] { scores(f.qtensor(), kv); },
               "k.scale: preordered FP4 scales must be [" + std::to_string(pages * 2) +
                   ", 1, 2, 32, 4, 4] ([num_pages * Hkv, 1, ceil(G / 4), 32, 4, 4] with G = D / group)");
  HostTensor pre_e8m0(DType::e8m0, {pages * 2, 1, 2, 32, 4, 4});
  kv.k.scale = pre_e8m0.t;  // an MXFP4 scale of D = 96 has G = 3: restG 1
  expect_error([&] { scores(f.qtensor(), kv); }, "k.scale: preordered FP4 scales must be [" +
                                                     std::to_string(pages * 2) + ", 1, 1, 32, 4, 4]");
  // A public pool scale of the wrong shape, and an FP4 pool under bf16 queries.
  HostTensor pool_wrong(DType::fp8_e4m3, {pages, 2, 128, 5});
  kv.k.scale = pool_wrong.t;
  expect_error([&] { scores(f.qtensor(), kv); },
               "k.scale: shape must be [" + std::to_string(pages) + ", 2, 128, 6]");
  expect_error([&] { scores(QTensor(f.p.q.t), p128.cache()); },
               "k: dtype must equal q's (bf16), got fp4x2");

  // block_topk shares the rules.
  HostTensor q2k(DType::i32, {2, T, 3});
  expect_error([&] { block_topk(topk_args(f, with_q_scale(short_m.t), f.p.flat_kv(), 128, q2k)); },
               "q.scale: preordered FP4 scales must be [8, 2, 2, 32, 4, 4]");
}

}  // namespace
}  // namespace msa::test
