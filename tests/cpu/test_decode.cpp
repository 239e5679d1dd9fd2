// CPU decode (docs/semantics.md, Decode; include/msa/decode.h): plan once, run with 1..16 queries
// per request over paged KV (dense and sparse) against the brute-force reference, lengths changed
// between runs within the plan, and the checks that tie run() to its planned shape.
#include <gtest/gtest.h>

#include "support/attention_problem.h"

namespace msa::test {
namespace {

DecodeShape shape_of(const Problem& p, const PagedKV& paged, int64_t max_q, int topk) {
  DecodeShape s;
  s.batch = int(p.batch());
  s.max_queries_per_request = int(max_q);
  s.num_q_heads = int(p.hq);
  s.num_kv_heads = int(p.hkv);
  s.head_dim = int(p.dim);
  s.layout = paged.layout;
  s.page_size = int(paged.layout == KVLayout::paged_nhd ? paged.k.t.shape[1] : paged.k.t.shape[2]);
  s.max_pages = int(paged.page_table.t.shape[1]);
  s.kv_dtype = paged.k.t.dtype;
  s.topk = topk;
  return s;
}

TEST(Decode, DenseAndSparseMatchBruteForce) {
  unsigned seed = 1;
  for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
    for (int topk : {0, 4}) {
      SCOPED_TRACE(std::string(kv_layout_name(layout)) + (topk ? " sparse" : " dense"));
      // 1..16 queries per request over contexts of several lengths.
      const Problem p = make_problem({1, 16, 5, 2}, {700, 300, 33, 129}, 8, 2, 64, seed++);
      const PagedKV paged = make_paged(p, layout, 32, seed++);
      DecodePlan plan;
      plan.plan(shape_of(p, paged, 16, topk), paged.seqused_k.data<int32_t>(), Tensor());
      ASSERT_TRUE(plan.planned());
      EXPECT_EQ(DecodePlan::workspace_bytes(plan.shape()), 0u);
      AttentionParams prm;
      prm.kv_block_size = 128;
      std::vector<int32_t> ids;
      std::optional<HostTensor> q2k;
      if (topk) {
        ids = random_q2k(p, topk, 128, seed++);
        q2k.emplace(q2k_tensor(ids, p.hkv, p.total_q(), topk));
      }
      Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
      plan.run(make_args(p, paged.cache(), o, q2k ? &*q2k : nullptr, prm));
      expect_matches(o, reference_attention(p, topk ? &ids : nullptr, topk, prm));
    }
}

// Dense decode takes any GQA group up to 128 (DESIGN.md section 1): groups 3, 5, 12 and 48 against
// the brute force; a sparse plan keeps the sparse path's groups.
TEST(Decode, DenseAnyGroup) {
  unsigned seed = 300;
  for (const auto& [hq, hkv] : {std::pair{6, 2}, std::pair{10, 2}, std::pair{12, 1},
                                std::pair{96, 2}}) {
    SCOPED_TRACE("Hq " + std::to_string(hq) + ", Hkv " + std::to_string(hkv));
    const Problem p = make_problem({1, 3, 2}, {200, 65, 1}, hq, hkv, 32, seed++);
    const PagedKV paged = make_paged(p, KVLayout::paged_hnd, 16, seed++);
    DecodePlan plan;
    plan.plan(shape_of(p, paged, 3, 0), paged.seqused_k.data<int32_t>(), Tensor());
    AttentionParams prm;
    Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
    plan.run(make_args(p, paged.cache(), o, nullptr, prm));
    expect_matches(o, reference_attention(p, nullptr, 0, prm));
  }
  const Problem p = make_problem({1}, {100}, 10, 2, 32, 320);
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 321);
  DecodeShape s = shape_of(p, paged, 1, 2);
  expect_error([&] { DecodePlan::workspace_bytes(s); },
               "decode shape (topk > 0): a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or 16 "
               "(or one kv head for up to 128 query heads), got 5");
  s = shape_of(p, paged, 1, 0);
  s.num_q_heads = 129 * 2;
  expect_error([&] { DecodePlan::workspace_bytes(s); },
               "decode shape: GQA group num_q_heads / num_kv_heads must be at most 128, got 129");
}

// NVFP4 and MXFP4 page pools (fp4x2 values, scale pools of the values' layout), dense and sparse,
// both layouts, against the brute force on the exact dequantized values.
TEST(Decode, Fp4PoolsMatchBruteForce) {
  unsigned seed = 60;
  for (bool nvfp4 : {true, false})
    for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
      for (int topk : {0, 3}) {
        SCOPED_TRACE(std::string(nvfp4 ? "nvfp4 " : "mxfp4 ") + kv_layout_name(layout) +
                     (topk ? " sparse" : " dense"));
        Problem p = make_problem({1, 4, 2}, {300, 129, 40}, 8, 2, 64, seed++);
        quantize_kv_fp4(p, nvfp4);
        const PagedKV paged = make_paged(p, layout, 32, seed++);
        DecodePlan plan;
        plan.plan(shape_of(p, paged, 4, topk), paged.seqused_k.data<int32_t>(), Tensor());
        AttentionParams prm;
        prm.kv_block_size = 64;
        std::vector<int32_t> ids;
        std::optional<HostTensor> q2k;
        if (topk) {
          ids = random_q2k(p, topk, 64, seed++);
          q2k.emplace(q2k_tensor(ids, p.hkv, p.total_q(), topk));
        }
        DecodeShape sh = plan.shape();
        sh.kv_block_size = 64;
        plan.plan(sh, paged.seqused_k.data<int32_t>(), Tensor());
        Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
        plan.run(make_args(p, paged.cache(), o, q2k ? &*q2k : nullptr, prm));
        expect_matches(o, reference_attention(p, topk ? &ids : nullptr, topk, prm));
      }
}

// Decode reads FP4 pool scales in the public layout only (the preordered one is the indexer's).
TEST(Decode, Fp4PreorderedScalesRefused) {
  Problem p = make_problem({1, 4}, {300, 129}, 8, 2, 64, 70);
  quantize_kv_fp4(p, true);
  const PagedKV paged = make_paged(p, KVLayout::paged_hnd, 128, 71);
  DecodePlan plan;
  plan.plan(shape_of(p, paged, 4, 0), paged.seqused_k.data<int32_t>(), Tensor());
  KVCache kv = paged.cache();
  const HostTensor pre(DType::fp8_e4m3, {paged.k.t.shape[0] * 2, 1, 1, 32, 4, 4});
  kv.k.scale = pre.t;
  AttentionParams prm;
  prm.kv_block_size = 128;
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  expect_error([&] { plan.run(make_args(p, kv, o, nullptr, prm)); },
               "k.scale: the preordered (6-D) FP4 scale layout is read by the indexer only");
}

// Token-sparse decode on the CPU: kv_block_size 1 (key ids) and MQA with 64 query heads on one
// kv head, against the brute force.
TEST(Decode, TokenSparseAndMqa) {
  const Problem p = make_problem({2, 1, 3}, {300, 17, 129}, 64, 1, 32, 740);
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 741);
  DecodeShape sh = shape_of(p, paged, 3, 40);
  sh.kv_block_size = 1;
  DecodePlan plan;
  plan.plan(sh, paged.seqused_k.data<int32_t>(), Tensor());
  const std::vector<int32_t> ids = random_q2k(p, 40, 1, 742);
  const HostTensor q2k = q2k_tensor(ids, 1, p.total_q(), 40);
  AttentionParams prm;
  prm.kv_block_size = 1;
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  plan.run(make_args(p, paged.cache(), o, &q2k, prm));
  expect_matches(o, reference_attention(p, &ids, 40, prm));
  // CUDA decode takes token ids with this group too: the shape checks pass the group and stop at
  // this test's head dim (32), which the CUDA kernels do not take.
  sh.device = {DeviceType::cuda, 0};
  expect_error([&] { DecodePlan::workspace_bytes(sh); },
               "decode shape: CUDA decode takes head_dim 64, 128 or 256, got 32");
  // The sparse GQA rule holds on either device: 32 query heads a kv head over two kv heads.
  sh.num_kv_heads = 2;
  sh.num_q_heads = 64;
  for (DeviceType dev : {DeviceType::cpu, DeviceType::cuda}) {
    sh.device = {dev, 0};
    expect_error([&] { DecodePlan::workspace_bytes(sh); },
                 "decode shape (topk > 0): a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or "
                 "16 (or one kv head for up to 128 query heads), got 32");
  }
}

TEST(Decode, NewLengthsWithinThePlan) {
  // Plan for full contexts, then run with other seqused_k values: keys past each new length stay
  // in the pages and must be ignored.
  const Problem full = make_problem({3, 1}, {256, 200}, 4, 4, 32, 10);
  const PagedKV paged = make_paged(full, KVLayout::paged_nhd, 64, 11);
  DecodePlan plan;
  plan.plan(shape_of(full, paged, 4, 0), nullptr, Tensor());
  for (std::vector<int32_t> lk : {std::vector<int32_t>{256, 200}, {10, 0}, {129, 64}}) {
    std::copy(lk.begin(), lk.end(), paged.seqused_k.data<int32_t>());
    // The reference: the same keys, truncated to the new lengths.
    Problem cut = make_problem({3, 1}, lk, 4, 4, 32, 10);
    cut.q_val = full.q_val;
    std::memcpy(cut.q.data<uint8_t>(), full.q.data<uint8_t>(), full.q.bytes());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < lk[b]; ++j)
        for (int64_t x = 0; x < 4 * 32; ++x) {
          cut.k_val[(cut.k_start(b) + j) * 128 + x] = full.k_val[(full.k_start(b) + j) * 128 + x];
          cut.v_val[(cut.k_start(b) + j) * 128 + x] = full.v_val[(full.k_start(b) + j) * 128 + x];
        }
    Outputs o(DType::bf16, 4, 4, 32);
    plan.run(make_args(full, paged.cache(), o, nullptr, {}));
    expect_matches(o, reference_attention(cut, nullptr, 0, {}));
  }
}

TEST(Decode, EmptyBatchAndEmptyContexts) {
  const Problem p = make_problem({2, 1}, {0, 0}, 2, 1, 32, 20);
  const PagedKV paged = make_paged(p, KVLayout::paged_hnd, 16, 21);
  DecodePlan plan;
  plan.plan(shape_of(p, paged, 2, 0), paged.seqused_k.data<int32_t>(), Tensor());
  Outputs o(DType::bf16, 3, 2, 32);
  plan.run(make_args(p, paged.cache(), o, nullptr, {}));
  expect_matches(o, reference_attention(p, nullptr, 0, {}));  // out 0, lse -inf everywhere
  const Problem none = make_problem({}, {}, 2, 1, 32, 22);
  const PagedKV no_pages = make_paged(none, KVLayout::paged_nhd, 16, 23);
  DecodePlan empty;
  empty.plan(shape_of(none, no_pages, 1, 0), nullptr, Tensor());
  Outputs eo(DType::bf16, 0, 2, 32);
  EXPECT_NO_THROW(empty.run(make_args(none, no_pages.cache(), eo, nullptr, {})));
}

TEST(Decode, RunMustMatchThePlan) {
  const Problem p = make_problem({2, 3}, {100, 60}, 4, 2, 32, 30);
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 31);
  const DecodeShape shape = shape_of(p, paged, 3, 0);
  Outputs o(DType::bf16, 5, 4, 32);
  const AttentionArgs args = make_args(p, paged.cache(), o, nullptr, {});
  DecodePlan plan;
  expect_error([&] { plan.run(args); }, "decode: run() called before a successful plan()");
  plan.plan(shape, nullptr, Tensor());
  EXPECT_NO_THROW(plan.run(args));

  auto planned_with = [&](auto edit) {
    DecodeShape s = shape;
    edit(s);
    DecodePlan pl;
    pl.plan(s, nullptr, Tensor());
    return pl;
  };
  expect_error([&] { planned_with([](DecodeShape& s) { s.max_queries_per_request = 2; }).run(args); },
               "cu_seqlens_q: request 1 has 3 queries, more than the planned max_queries_per_request = 2");
  expect_error([&] { planned_with([](DecodeShape& s) { s.num_q_heads = 8; }).run(args); },
               "q: shape must be [*, 8, 32] as planned");
  expect_error([&] { planned_with([](DecodeShape& s) { s.page_size = 32; }).run(args); },
               "k: page size, kv heads and head dim must be 32, 2, 32 as planned");
  expect_error([&] { planned_with([](DecodeShape& s) { s.layout = KVLayout::paged_hnd; }).run(args); },
               "kv.layout: planned paged_hnd, got paged_nhd");
  expect_error([&] { planned_with([](DecodeShape& s) { s.kv_dtype = DType::fp8_e4m3; }).run(args); },
               "k: dtype must be fp8_e4m3 as planned, got bf16");
  expect_error([&] { planned_with([](DecodeShape& s) { s.batch = 3; }).run(args); },
               "page_table: shape must be [3, ");
  expect_error([&] { planned_with([](DecodeShape& s) { s.topk = 2; }).run(args); },
               "q2k: must be given (planned sparse, topk > 0)");
  const HostTensor q2k = q2k_tensor(random_q2k(p, 2, 128, 32), 2, 5, 2);
  expect_error([&] { plan.run(make_args(p, paged.cache(), o, &q2k, {})); },
               "q2k: must be absent (planned dense, topk = 0)");
}

// CPU decode runs attention_forward, so dense attention's visibility and soft-cap hold there too
// (docs/semantics.md, Dense attention), for head dims of the dense family.
TEST(Decode, SoftCapOffsetsAndMasks) {
  unsigned seed = 50;
  for (int64_t dim : {32, 256, 12}) {
    SCOPED_TRACE("D " + std::to_string(dim));
    const Problem p = make_problem({1, 3, 2}, {200, 70, 33}, 4, 2, dim, seed++);
    const PagedKV paged = make_paged(p, KVLayout::paged_hnd, 32, seed++);
    DecodePlan plan;
    plan.plan(shape_of(p, paged, 4, 0), paged.seqused_k.data<int32_t>(), Tensor());
    AttentionParams prm;
    prm.soft_cap = 4.f;
    Visibility vis;
    vis.causal_offset = {150, 69, -1};
    vis.lk_max = 200;
    vis.mask.assign(size_t(p.batch() * vis.lk_max), 1);
    for (int64_t j = 0; j < vis.lk_max; j += 3) vis.mask[size_t(j)] = 0;  // batch 0: every third key
    const HostTensor offset = i32_tensor(vis.causal_offset);
    HostTensor mask(DType::boolean, {p.batch(), vis.lk_max});
    std::copy(vis.mask.begin(), vis.mask.end(), mask.data<uint8_t>());
    Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
    AttentionArgs a = make_args(p, paged.cache(), o, nullptr, prm);
    a.causal_offset = offset.t;
    a.key_mask = mask.t;
    plan.run(a);
    expect_matches(o, reference_attention(p, nullptr, 0, prm, vis));
  }
}

TEST(Decode, PlanRules) {
  const Problem p = make_problem({1}, {100}, 4, 2, 32, 40);
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 41);
  DecodeShape s = shape_of(p, paged, 1, 0);
  DecodePlan plan;
  s.page_size = 48;
  expect_error([&] { plan.plan(s, nullptr, Tensor()); }, "decode shape: page_size must be 16, 32, 64, 128 or 256, got 48");
  s = shape_of(p, paged, 1, 0);
  s.layout = KVLayout::flat;
  expect_error([&] { plan.plan(s, nullptr, Tensor()); }, "decode shape: layout must be paged_nhd or paged_hnd, got flat");
  s = shape_of(p, paged, 1, 0);
  const int32_t too_long = s.max_pages * 16 + 1;
  expect_error([&] { plan.plan(s, &too_long, Tensor()); }, "seqused_k_host: entry 0 = ");
  EXPECT_FALSE(plan.planned());
  s.device = Device{DeviceType::cuda, 0};
  const char* dims = "decode shape: CUDA decode takes head_dim 64, 128 or 256, got 32";
  expect_error([&] { plan.plan(s, nullptr, Tensor()); }, dims);
  expect_error([&] { DecodePlan::workspace_bytes(s); }, dims);
  // FP8 KV at D = 64 and NVFP4 KV away from D = 128 are refused by name.
  s.head_dim = 64;
  s.kv_dtype = DType::fp8_e4m3;
  expect_error([&] { DecodePlan::workspace_bytes(s); },
               "decode shape: CUDA decode takes fp8_e4m3 KV at head_dim 128 or 256, got "
               "head_dim 64");
  for (int d : {64, 256}) {
    s.head_dim = d;
    s.kv_dtype = DType::fp4x2;
    expect_error([&] { DecodePlan::workspace_bytes(s); },
                 "decode shape: CUDA decode takes fp4x2 (NVFP4) KV at head_dim 128 only, got "
                 "head_dim " + std::to_string(d));
  }
  s.kv_dtype = DType::bf16;
  if (!built_with_cuda())  // the shape checks pass at every head dim the CUDA decode takes
    for (int d : {64, 128, 256}) {
      s.head_dim = d;
      expect_error([&] { DecodePlan::workspace_bytes(s); },
                   "decode: CUDA tensors given, but msa was built without CUDA");
    }
}

}  // namespace
}  // namespace msa::test
