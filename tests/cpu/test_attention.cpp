// CPU attention forward (docs/semantics.md: Attention, Paged KV; include/msa/attention.h):
// hand-computed cases, a brute-force reference over a curated matrix, exact properties (sparse with
// every block == dense, paged == flat, tlse at T = 1 == lse), NaN never leaking from unused KV
// slots, edge shapes, the k2q / schedule inputs, one test per input rule, and a page table
// written during the call.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <limits>
#include <thread>

#include "common/schedule.h"
#include "support/attention_problem.h"

namespace msa::test {
namespace {

AttentionParams hand_params(bool causal) {
  AttentionParams p;
  p.softmax_scale = 1.f;
  p.causal = causal;
  return p;
}

// ---------------------------------- hand-computed ----------------------------------

TEST(Attention, HandComputedOneQueryTwoKeys) {
  const Outputs o = HandCase(1).run(hand_params(true));  // Lq = 1, Lk = 2: sees both keys
  const double e0 = std::exp(0.5), e1 = std::exp(1.0);
  EXPECT_NEAR(o.lse.data<float>()[0], std::log(e0 + e1), 1e-6);
  for (int d = 0; d < 8; ++d) {
    const double want = (e0 * (d + 1) - e1 * (d + 1) / 2) / (e0 + e1);
    EXPECT_NEAR(load(o.out.t, d), want, std::fabs(want) / 256) << "d = " << d;
  }
}

TEST(Attention, HandComputedCausalBottomRight) {
  // Lq = Lk = 2: query 0 sees key 0 only (out = v0 exactly, lse = s0); query 1 sees both.
  const Outputs causal = HandCase(2).run(hand_params(true));
  EXPECT_NEAR(causal.lse.data<float>()[0], 0.5, 1e-7);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(load(causal.out.t, d), d + 1);
  EXPECT_NEAR(causal.lse.data<float>()[1], std::log(std::exp(0.5) + std::exp(1.0)), 1e-6);
  const Outputs full = HandCase(2).run(hand_params(false));  // non-causal: both queries see both keys
  EXPECT_EQ(full.lse.data<float>()[0], causal.lse.data<float>()[1]);
}

// ---------------------------------- brute force ----------------------------------

struct Case {
  const char* name;
  std::vector<int32_t> lq, lk;
  int64_t hq, hkv, dim;
  int64_t topk;  // 0 = dense
  int blk;
  bool causal, sorted;
  DType dtype;
  float temperature;
};

TEST(Attention, MatchesBruteForce) {
  const std::vector<Case> cases = {
      {"dense causal varlen", {37, 64, 1}, {300, 64, 129}, 4, 2, 64, 0, 128, true, true, DType::bf16, 0},
      {"sparse causal", {37, 64, 1}, {300, 64, 129}, 4, 2, 64, 3, 128, true, true, DType::bf16, 0.7f},
      {"sparse non-causal, ids in random slots, f16", {20, 9}, {500, 70}, 8, 2, 32, 4, 64, false, false, DType::f16, 0},
      {"dense Lq > Lk causal", {20, 3}, {7, 1}, 2, 2, 16, 0, 128, true, true, DType::bf16, 2.f},
      {"sparse G = 16, topk above block count", {12}, {700}, 16, 1, 8, 16, 64, true, false, DType::bf16, 0},
      {"Lq = 0 and Lk = 0 batches", {0, 5, 4}, {100, 0, 40}, 2, 1, 16, 2, 64, true, true, DType::f16, 0},
  };
  unsigned seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c.lq, c.lk, c.hq, c.hkv, c.dim, seed++, c.dtype);
    AttentionParams prm;
    prm.causal = c.causal;
    prm.kv_block_size = c.blk;
    prm.temperature = c.temperature;
    std::vector<int32_t> ids;
    std::optional<HostTensor> q2k;
    if (c.topk > 0) {
      ids = random_q2k(p, c.topk, c.blk, seed++, c.sorted);
      q2k.emplace(q2k_tensor(ids, c.hkv, p.total_q(), c.topk));
    }
    const Outputs o = run_attention(p, p.flat_kv(), q2k ? &*q2k : nullptr, prm);
    expect_matches(o, reference_attention(p, c.topk ? &ids : nullptr, c.topk, prm), c.temperature > 0);
  }
}

TEST(Attention, Fp8KvMatchesBruteForce) {
  unsigned seed = 200;
  for (Fp8Scale sc : {Fp8Scale::none, Fp8Scale::per_tensor, Fp8Scale::per_token, Fp8Scale::per_token_head}) {
    for (DType qt : {DType::bf16, DType::f16}) {
      const Problem p = make_problem({9, 30}, {200, 45}, 4, 2, 32, seed++, qt, DType::fp8_e4m3, sc);
      AttentionParams prm;
      const std::vector<int32_t> ids = random_q2k(p, 2, 128, seed++);
      const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), 2);
      expect_matches(run_attention(p, p.flat_kv(), &q2k, prm), reference_attention(p, &ids, 2, prm));
      expect_matches(run_attention(p, p.flat_kv(), nullptr, prm), reference_attention(p, nullptr, 0, prm));
    }
  }
  // Paged fp8: every scale kind, per-token scales indexed by pool slot (NaN in the unused ones).
  for (Fp8Scale sc : {Fp8Scale::per_tensor, Fp8Scale::per_token, Fp8Scale::per_token_head})
    for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
      const Problem p = make_problem({5, 16}, {100, 300}, 2, 1, 64, seed++, DType::bf16,
                                     DType::fp8_e4m3, sc);
      const PagedKV paged = make_paged(p, layout, 32, seed++);
      expect_matches(run_attention(p, paged.cache(), nullptr, {}),
                     reference_attention(p, nullptr, 0, {}));
    }
}

// NVFP4 (global scale 0.75) and MXFP4 K/V, flat and paged, against the brute force on their
// exact dequantization.
TEST(Attention, Fp4KvMatchesBruteForce) {
  unsigned seed = 300;
  for (const bool nvfp4 : {true, false})
    for (DType qt : {DType::bf16, DType::f16}) {
      Problem p = make_problem({9, 30}, {200, 45}, 4, 2, 64, seed++, qt, qt);
      quantize_kv_fp4(p, nvfp4);
      const std::vector<int32_t> ids = random_q2k(p, 2, 128, seed++);
      const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), 2);
      expect_matches(run_attention(p, p.flat_kv(), &q2k, {}), reference_attention(p, &ids, 2, {}));
    }
  // FP4 page pools: scales in a pool of the values' layout (NaN bytes in the unused slots).
  for (const bool nvfp4 : {true, false})
    for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
      Problem p = make_problem({5, 16}, {100, 300}, 2, 1, 64, seed++, DType::bf16, DType::bf16);
      quantize_kv_fp4(p, nvfp4);
      const PagedKV paged = make_paged(p, layout, 32, seed++);
      expect_matches(run_attention(p, paged.cache(), nullptr, {}),
                     reference_attention(p, nullptr, 0, {}));
    }
}

// Attention reads FP4 scales in the public layout only: a preordered (6-D) one, which the indexer
// takes, is an error naming it, for flat K and for a page pool's V.
TEST(Attention, Fp4PreorderedScalesRefused) {
  Problem p = make_problem({5, 16}, {100, 300}, 2, 1, 64, 340, DType::bf16, DType::bf16);
  quantize_kv_fp4(p, true);
  const std::string rule = ".scale: the preordered (6-D) FP4 scale layout is read by the indexer "
                           "only (block_scores, block_topk); this op takes the public layout ";
  KVCache kv = p.flat_kv();
  const HostTensor flat_pre(DType::fp8_e4m3, {1, 4, 1, 32, 4, 4});  // Hkv 1, 400 keys, G 4
  kv.k.scale = flat_pre.t;
  expect_error([&] { run_attention(p, kv, nullptr, {}); }, "k" + rule + "[T, H, D / group]");
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 128, 341);
  kv = paged.cache();
  const HostTensor pool_pre(DType::fp8_e4m3, {paged.k.t.shape[0], 1, 1, 32, 4, 4});
  kv.v.scale = pool_pre.t;
  expect_error([&] { run_attention(p, kv, nullptr, {}); },
               "v" + rule + "[num_pages, page_size, Hkv, D / group] (or hnd)");
}

// An FP4 pool's scales seen through a negative page stride (the pool stored page-reversed) give
// the same bits. Found by fuzzing: a scale row at a negative offset was taken for "no pool row"
// and looked up as a flat per-token scale, out of bounds.
TEST(Attention, Fp4PoolScalesThroughNegativeStrides) {
  Problem p = make_problem({5, 16}, {100, 300}, 2, 1, 64, 330, DType::bf16, DType::bf16);
  quantize_kv_fp4(p, true);
  for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
    const PagedKV paged = make_paged(p, layout, 32, 331);
    // The pool's pages in reverse order, and a view of it that reads them back in order.
    const auto reversed = [](const HostTensor& pool) {
      const Tensor& t = pool.t;
      HostTensor r(t.dtype, std::vector<int64_t>(t.shape, t.shape + 4),
                   std::vector<int64_t>(t.strides, t.strides + 4));
      const int64_t pages = t.shape[0], page_bytes = t.strides[0] * int64_t(dtype_size(t.dtype));
      for (int64_t pg = 0; pg < pages; ++pg)
        std::memcpy(r.data<uint8_t>() + (pages - 1 - pg) * page_bytes,
                    pool.data<uint8_t>() + pg * page_bytes, size_t(page_bytes));
      return r;
    };
    const auto backwards = [](const HostTensor& r) {
      Tensor t = r.t;
      t.data = r.data<uint8_t>() + (t.shape[0] - 1) * t.strides[0] * int64_t(dtype_size(t.dtype));
      t.strides[0] = -t.strides[0];
      return t;
    };
    const HostTensor k_rev = reversed(*paged.k_scale), v_rev = reversed(*paged.v_scale);
    KVCache kv = paged.cache();
    kv.k.scale = backwards(k_rev);
    kv.v.scale = backwards(v_rev);
    expect_same_bits(run_attention(p, kv, nullptr, {}), run_attention(p, paged.cache(), nullptr, {}));
  }
}

// FP8 queries (per-token-and-head q scales) over bf16, FP8 and FP4 K/V; bf16 out.
TEST(Attention, Fp8QueriesMatchBruteForce) {
  unsigned seed = 400;
  for (DType kt : {DType::bf16, DType::fp8_e4m3}) {
    const Problem p = make_problem({9, 30}, {200, 45}, 4, 2, 64, seed++, DType::fp8_e4m3, kt,
                                   Fp8Scale::per_token_head);
    const std::vector<int32_t> ids = random_q2k(p, 2, 128, seed++);
    const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), 2);
    const Outputs o = run_attention(p, p.flat_kv(), &q2k, {});
    EXPECT_EQ(o.out.t.dtype, DType::bf16);
    expect_matches(o, reference_attention(p, &ids, 2, {}));
  }
  Problem p = make_problem({5, 16}, {100, 300}, 2, 1, 64, seed++, DType::fp8_e4m3);
  quantize_kv_fp4(p, true);
  expect_matches(run_attention(p, p.flat_kv(), nullptr, {}), reference_attention(p, nullptr, 0, {}));
}

TEST(Attention, Fp8QueryRulesChecked) {
  const Problem p = make_problem({5}, {100}, 2, 1, 64, 420, DType::fp8_e4m3);
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  AttentionArgs a = make_args(p, p.flat_kv(), o, nullptr, {});
  const HostTensor f16_out(DType::f16, {p.total_q(), p.hq, p.dim});
  a.out = f16_out.t;
  expect_error([&] { attention_forward(a); }, "out: dtype must be bf16 for fp8_e4m3 q");
  a = make_args(p, p.flat_kv(), o, nullptr, {});
  const HostTensor wrong(DType::f32, {p.total_q(), p.hq + 1});
  a.q_scale = wrong.t;
  expect_error([&] { attention_forward(a); }, "q.scale: fp8 scales must be [1]");
  // f16 K/V under FP8 queries: not a pairing attention takes.
  const Problem h = make_problem({5}, {100}, 2, 1, 64, 421, DType::f16);
  AttentionArgs b = make_args(p, h.flat_kv(), o, nullptr, {});
  expect_error([&] { attention_forward(b); }, "k: FP8 queries take bf16, fp8_e4m3 or fp4x2 keys");
  // bf16 q takes no q scale.
  const Problem bq = make_problem({5}, {100}, 2, 1, 64, 422);
  AttentionArgs c = make_args(bq, bq.flat_kv(), o, nullptr, {});
  c.q_scale = p.q_scale->t;
  expect_error([&] { attention_forward(c); }, "q.scale: must be absent for bf16 values");
}

// FP8 scale values: negative, NaN or infinite q, k or v scales are errors (they passed and gave
// NaN outputs); a page pool's slots that hold no key may hold anything (make_paged leaves NaN).
TEST(Attention, Fp8ScaleValuesChecked) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const float bad : {-1.f, nan, inf}) {
    Problem p = make_problem({5}, {100}, 2, 1, 64, 260, DType::bf16, DType::fp8_e4m3,
                             Fp8Scale::per_token);
    p.v_scale->data<float>()[17] = bad;
    expect_error([&] { run_attention(p, p.flat_kv(), nullptr, {}); },
                 "v.scale: FP8 scales must be finite and >= 0, got ");
    Problem q8 = make_problem({5}, {100}, 2, 1, 64, 261, DType::fp8_e4m3);
    q8.q_scale->data<float>()[3] = bad;
    expect_error([&] { run_attention(q8, q8.flat_kv(), nullptr, {}); },
                 "q.scale: FP8 scales must be finite and >= 0, got ");
    Problem pg = make_problem({5}, {100}, 2, 1, 64, 262, DType::bf16, DType::fp8_e4m3,
                              Fp8Scale::per_token);
    PagedKV paged = make_paged(pg, KVLayout::paged_nhd, 32, 263);
    const int32_t page = paged.page_table.data<int32_t>()[1];  // keys 32..63 of batch 0
    paged.k_scale->data<float>()[page * 32 + 5] = bad;
    expect_error([&] { run_attention(pg, paged.cache(), nullptr, {}); },
                 "k.scale: FP8 scales must be finite and >= 0, got ");
  }
}

TEST(Attention, PagedFp8ScaleShapesChecked) {
  const Problem p = make_problem({5}, {100}, 2, 1, 64, 250, DType::bf16, DType::fp8_e4m3,
                                 Fp8Scale::per_token);
  PagedKV paged = make_paged(p, KVLayout::paged_nhd, 32, 251);
  // A flat-sized [total_k] scale is not the pool's [num_pages * page_size].
  paged.k_scale.emplace(DType::f32, std::vector<int64_t>{p.total_k()});
  expect_error([&] { run_attention(p, paged.cache(), nullptr, {}); },
               "k.scale: fp8 scales must be [1], [" + std::to_string(paged.k.t.shape[0] * 32) + "]");
}

// A K or V scale on another device than its values (found by fuzzing: the CPU backend read a
// CUDA scale tensor on the host; the indexer checked k.scale's device, attention did not).
TEST(Attention, KvScaleDeviceChecked) {
  const Problem p = make_problem({5}, {100}, 2, 1, 64, 252, DType::bf16, DType::fp8_e4m3,
                                 Fp8Scale::per_token);
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  for (const char* part : {"k", "v"}) {
    AttentionArgs a = make_args(p, p.flat_kv(), o, nullptr, {});
    QTensor& x = part[0] == 'k' ? a.kv.k : a.kv.v;
    x.scale.device = {DeviceType::cuda, 0};
    expect_error([&] { attention_forward(a); }, std::string(part) +
                 ".scale: must be on the same device as " + part + " (cpu), got cuda:0");
  }
}

// The NVFP4 global scales of K and V are host floats, checked whatever the tensors' device
// (they were checked with the host scale values only, so a NaN one passed the CUDA prefill's
// validation). The CUDA views below are never read: the check comes first.
TEST(Attention, Fp4GlobalScaleCheckedOnEveryDevice) {
  Problem p = make_problem({5}, {100}, 2, 1, 64, 253, DType::bf16, DType::bf16);
  quantize_kv_fp4(p, true);
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  const HostTensor q2k = q2k_tensor(random_q2k(p, 1, 128, 254), 1, p.total_q(), 1);
  const Device cuda{DeviceType::cuda, 0};
  for (const bool on_cuda : {false, true})
    for (const char* part : {"k", "v"}) {
      SCOPED_TRACE(on_cuda ? "cuda" : "cpu");
      AttentionArgs a = make_args(p, p.flat_kv(), o, &q2k, {});
      (part[0] == 'k' ? a.kv.k : a.kv.v).global_scale = std::numeric_limits<float>::quiet_NaN();
      if (on_cuda)
        for (Tensor* t : {&a.q, &a.kv.k.values, &a.kv.k.scale, &a.kv.v.values, &a.kv.v.scale,
                          &a.kv.cu_seqlens_k, &a.cu_seqlens_q, &a.q2k, &a.out, &a.lse})
          t->device = cuda;
      expect_error([&] { attention_forward(a); },
                   std::string(part) + ": NVFP4 global scale must be finite and > 0");
    }
}

// Token-sparse attention (docs/semantics.md, Token-sparse attention): kv_block_size 1, so q2k
// holds key ids (up to 2048 per row); GQA and MQA (one kv head, 128 query heads), flat and paged,
// FP8 KV, against the brute force over the same ids.
TEST(Attention, TokenSparseMatchesBruteForce) {
  struct Case {
    const char* name;
    std::vector<int32_t> lq, lk;
    int64_t hq, hkv, topk;
    DType kv;
    bool paged, causal;
  };
  const std::vector<Case> cases = {
      {"GQA, causal, ids beyond the visible ones", {9, 30}, {200, 600}, 4, 2, 150, DType::bf16, false, true},
      {"MQA 128 query heads on one kv head", {3, 4}, {90, 300}, 128, 1, 64, DType::bf16, false, true},
      {"paged, FP8 KV, non-causal", {5, 7}, {257, 40}, 8, 2, 33, DType::fp8_e4m3, true, false},
      {"2048 ids per row", {2}, {3000}, 2, 1, 2048, DType::bf16, false, true},
  };
  unsigned seed = 700;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c.lq, c.lk, c.hq, c.hkv, 32, seed++, DType::bf16, c.kv,
                                   Fp8Scale::per_token);
    AttentionParams prm;
    prm.causal = c.causal;
    prm.kv_block_size = 1;
    const std::vector<int32_t> ids = random_q2k(p, c.topk, 1, seed++);
    const HostTensor q2k = q2k_tensor(ids, c.hkv, p.total_q(), c.topk);
    if (c.paged) {
      const PagedKV paged = make_paged(p, KVLayout::paged_hnd, 32, seed++);
      expect_matches(run_attention(p, paged.cache(), &q2k, prm), reference_attention(p, &ids, c.topk, prm));
    } else {
      expect_matches(run_attention(p, p.flat_kv(), &q2k, prm), reference_attention(p, &ids, c.topk, prm));
    }
  }
}

// The q2k rules of section 4 hold for key ids: out of range and repeated ids are errors; the k2q
// CSR is not for token ids.
TEST(Attention, TokenSparseRules) {
  const Problem p = make_problem({4}, {50}, 2, 1, 32, 720);
  AttentionParams prm;
  prm.kv_block_size = 1;
  std::vector<int32_t> ids = random_q2k(p, 8, 1, 721);
  ids[0] = 50;  // one past the last key
  HostTensor q2k = q2k_tensor(ids, 1, p.total_q(), 8);
  expect_error([&] { run_attention(p, p.flat_kv(), &q2k, prm); }, "q2k:");
  const HostTensor repeated =  // token 0 names key 3 twice
      q2k_tensor({3, 3, -1, -1, 0, 1, -1, -1, 0, -1, -1, -1, 5, -1, -1, -1}, 1, 4, 4);
  expect_error([&] { run_attention(p, p.flat_kv(), &repeated, prm); }, "q2k:");
}

// A page table written by another thread during the call (the bindings release the GIL): every
// id is checked again where it is read, so a call either completes, or fails with an msa::Error
// (at validation, or after its loops for an id that changed in between), and never reads out of
// bounds (this test crashed before the re-check, and ASan sees any such read).
TEST(Attention, PageTableWrittenDuringTheCallNeverReadsOutOfBounds) {
  const Problem p = make_problem({64, 64}, {2048, 2048}, 4, 2, 64, 640);
  PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 641);
  int32_t* ids = paged.page_table.data<int32_t>();
  const int64_t n = paged.page_table.t.numel();
  const std::vector<int32_t> before(ids, ids + n);  // the valid ids
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint32_t i = 0; !stop.load(); ++i) {
      const int64_t at = int64_t(i * 2654435761u % uint32_t(n));
      std::atomic_ref<int32_t>(ids[at]).store(i % 2 ? 1 << 28 : before[at],
                                              std::memory_order_relaxed);
    }
  });
  int completed = 0, rejected = 0;
  for (int run = 0; run < 20; ++run) {
    try {
      run_attention(p, paged.cache(), nullptr, {});
      ++completed;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("page_table:") != std::string::npos) << m;
      ++rejected;
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(completed + rejected, 20);
}

TEST(Attention, ExplicitAndDefaultScale) {
  const Problem p = make_problem({17}, {90}, 2, 2, 64, 300);
  AttentionParams prm;
  prm.softmax_scale = 0.3f;
  expect_matches(run_attention(p, p.flat_kv(), nullptr, prm), reference_attention(p, nullptr, 0, prm));
  AttentionParams dflt, explicit_scale;
  explicit_scale.softmax_scale = float(1.0 / std::sqrt(64.0));
  expect_same_bits(run_attention(p, p.flat_kv(), nullptr, dflt),
                   run_attention(p, p.flat_kv(), nullptr, explicit_scale));
}

// ---------------------------------- exact properties ----------------------------------

TEST(Attention, SparseWithEveryBlockEqualsDense) {
  for (int blk : {64, 128}) {
    const Problem p = make_problem({40, 3, 70}, {513, 64, 70}, 4, 1, 32, 400 + blk);
    const int64_t topk = 11;  // nblk_max = 9 at blk 64: ascending ids, then -1
    std::vector<int32_t> ids(p.hkv * p.total_q() * topk, -1);
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int64_t t = p.q_start(b); t < p.q_start(b + 1); ++t)
        for (int64_t kb = 0; kb < (p.lk[b] + blk - 1) / blk; ++kb) ids[t * topk + kb] = int32_t(kb);
    const HostTensor q2k = q2k_tensor(ids, 1, p.total_q(), topk);
    AttentionParams prm;
    prm.kv_block_size = blk;
    for (bool causal : {true, false}) {
      prm.causal = causal;
      expect_same_bits(run_attention(p, p.flat_kv(), &q2k, prm), run_attention(p, p.flat_kv(), nullptr, prm));
    }
  }
}

// Paged pools hold the same keys as the flat KV; unused page slots, spare pages and spare page
// table columns are NaN / garbage, and must not change a single bit.
TEST(Attention, PagedEqualsFlat) {
  const Problem p = make_problem({33, 1, 50}, {301, 16, 50}, 4, 2, 64, 500);
  const std::vector<int32_t> ids = random_q2k(p, 3, 64, 501);
  const HostTensor q2k = q2k_tensor(ids, 2, p.total_q(), 3);
  AttentionParams prm;
  prm.kv_block_size = 64;
  const Outputs flat_dense = run_attention(p, p.flat_kv(), nullptr, prm);
  const Outputs flat_sparse = run_attention(p, p.flat_kv(), &q2k, prm);
  unsigned seed = 502;
  for (KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd})
    for (int64_t page_size : {16, 64, 256}) {
      SCOPED_TRACE(std::string(kv_layout_name(layout)) + " page " + std::to_string(page_size));
      const PagedKV paged = make_paged(p, layout, page_size, seed++, /*row_pad=*/page_size == 64 ? 8 : 0);
      // Batch 0's last page ends in empty slots (301 keys): they hold NaN.
      const int64_t last = paged.page_table.data<int32_t>()[300 / page_size];
      const int64_t tail = layout == KVLayout::paged_nhd ? paged.v.offset({last, page_size - 1, 0, 0})
                                                         : paged.v.offset({last, 0, page_size - 1, 0});
      ASSERT_TRUE(std::isnan(load(paged.v.t, tail)));
      expect_same_bits(run_attention(p, paged.cache(), nullptr, prm), flat_dense);
      expect_same_bits(run_attention(p, paged.cache(), &q2k, prm), flat_sparse);
    }
}

TEST(Attention, PagedWithoutSequsedUsesFullPages) {
  // Lk_b = max_pages * page_size when seqused_k is absent: every column must be a real page.
  const Problem p = make_problem({10, 64}, {64, 64}, 2, 1, 32, 600);
  const PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 601, 0, 2, /*extra_columns=*/0);
  expect_same_bits(run_attention(p, paged.cache(/*with_seqused=*/false), nullptr, {}),
                   run_attention(p, p.flat_kv(), nullptr, {}));
}

TEST(Attention, UnitTemperatureLseEqualsLse) {
  const Problem p = make_problem({30, 8}, {120, 300}, 4, 4, 32, 700);
  AttentionParams prm;
  prm.temperature = 1.f;
  const Outputs o = run_attention(p, p.flat_kv(), nullptr, prm);
  EXPECT_EQ(std::memcmp(o.lse.data<float>(), o.tlse.data<float>(), o.lse.bytes()), 0);
}

// ------------------------------- unused slots and edges -------------------------------

void fill_nan_rows(const Problem& p, int64_t b, int64_t j_begin, int64_t j_end) {
  for (int64_t j = j_begin; j < j_end; ++j)
    for (int64_t h = 0; h < p.hkv; ++h)
      for (int64_t d = 0; d < p.dim; ++d) {
        p.k.data<uint16_t>()[p.k.offset({p.k_start(b) + j, h, d})] = 0x7fc0;  // bf16 NaN
        p.v.data<uint16_t>()[p.v.offset({p.k_start(b) + j, h, d})] = 0x7fc0;
      }
}

TEST(Attention, NanInUnselectedBlocksNeverReachesOutputs) {
  Problem p = make_problem({20, 6}, {400, 200}, 2, 1, 16, 800);
  // No token selects block 1 of batch 0; its K and V are NaN.
  std::vector<int32_t> ids = random_q2k(p, 2, 128, 801);
  for (int64_t t = 0; t < p.q_start(1); ++t)
    for (int64_t s = 0; s < 2; ++s)
      if (ids[t * 2 + s] == 1) ids[t * 2 + s] = -1;
  const HostTensor q2k = q2k_tensor(ids, 1, p.total_q(), 2);
  const Reference ref = reference_attention(p, &ids, 2, {});
  fill_nan_rows(p, 0, 128, 256);
  expect_matches(run_attention(p, p.flat_kv(), &q2k, {}), ref);
}

TEST(Attention, NanInSelectedButInvisibleKeysNeverReachesOutputs) {
  // Lq = Lk = 256, causal: block 1 (keys 128..255) is invisible to queries 0..127, which select
  // it anyway; later queries do not. Its K and V rows are NaN: every output stays finite.
  Problem p = make_problem({256}, {256}, 1, 1, 8, 900);
  std::vector<int32_t> ids(256 * 2);
  for (int64_t t = 0; t < 256; ++t) {
    ids[t * 2] = 0;
    ids[t * 2 + 1] = t < 128 ? 1 : -1;
  }
  const HostTensor q2k = q2k_tensor(ids, 1, 256, 2);
  const Reference ref = reference_attention(p, &ids, 2, {});
  fill_nan_rows(p, 0, 128, 256);
  expect_matches(run_attention(p, p.flat_kv(), &q2k, {}), ref);
}

TEST(Attention, EmptyRowsGiveZeroAndMinusInf) {
  // Rows all -1, a batch with no keys, and causal queries before the first visible key.
  const Problem p = make_problem({3, 2, 6}, {50, 0, 2}, 2, 2, 8, 1000);
  const std::vector<int32_t> none(2 * 11 * 3, -1);
  const HostTensor q2k = q2k_tensor(none, 2, 11, 3);
  AttentionParams prm;
  prm.temperature = 0.5f;
  for (bool sparse : {true, false}) {
    const Outputs o = run_attention(p, p.flat_kv(), sparse ? &q2k : nullptr, prm);
    for (int64_t hq = 0; hq < 2; ++hq)
      for (int64_t t = 0; t < 11; ++t) {
        // Dense: batch 1 (tokens 3, 4) has no keys; batch 2 (Lq 6, Lk 2) queries 0..3 see none.
        if (!sparse && !(t >= 3 && t < 9)) continue;
        EXPECT_EQ(o.lse.data<float>()[hq * 11 + t], -INFINITY) << "t " << t;
        EXPECT_EQ(o.tlse.data<float>()[hq * 11 + t], -INFINITY) << "t " << t;
        for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(load(o.out.t, (t * 2 + hq) * 8 + d), 0.0);
      }
    expect_matches(o, reference_attention(p, sparse ? &none : nullptr, 3, prm), true);
  }
}

TEST(Attention, SingleKeyAndEmptyBatch) {
  const Problem one = make_problem({1}, {1}, 1, 1, 8, 1100);
  const Outputs o = run_attention(one, one.flat_kv(), nullptr, {});
  for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(load(o.out.t, d), one.v_val[d]);  // softmax of one key = 1
  expect_matches(o, reference_attention(one, nullptr, 0, {}));
  // B = 0: nothing to do, nothing read.
  const Problem none = make_problem({}, {}, 2, 1, 8, 1101);
  EXPECT_NO_THROW(run_attention(none, none.flat_kv(), nullptr, {}));
  const HostTensor q2k(DType::i32, {1, 0, 4});
  EXPECT_NO_THROW(run_attention(none, none.flat_kv(), &q2k, {}));
}

TEST(Attention, StridedQAndOut) {
  const Problem p = make_problem({12, 5}, {60, 200}, 4, 2, 32, 1200);
  const Outputs want = run_attention(p, p.flat_kv(), nullptr, {});
  // q and out with padded token and head strides (rows stay 16-byte aligned).
  HostTensor q(DType::bf16, {17, 4, 32}, {4 * 48 + 16, 48, 1});
  HostTensor out(DType::bf16, {17, 4, 32}, {4 * 40, 40, 1});
  for (int64_t t = 0; t < 17; ++t)
    for (int64_t h = 0; h < 4; ++h)
      std::memcpy(q.data<uint16_t>() + q.offset({t, h, 0}), p.q.data<uint16_t>() + p.q.offset({t, h, 0}), 64);
  Outputs o(DType::bf16, 17, 4, 32);
  AttentionArgs a = make_args(p, p.flat_kv(), o, nullptr, {});
  a.q = q.t;
  a.out = out.t;
  attention_forward(a);
  for (int64_t t = 0; t < 17; ++t)
    for (int64_t h = 0; h < 4; ++h)
      EXPECT_EQ(std::memcmp(out.data<uint16_t>() + out.offset({t, h, 0}),
                            want.out.data<uint16_t>() + want.out.offset({t, h, 0}), 64), 0);
  EXPECT_EQ(std::memcmp(o.lse.data<float>(), want.lse.data<float>(), want.lse.bytes()), 0);
}

// ---------------------------------- k2q and schedule ----------------------------------

struct WithCsr {
  HostTensor q2k, row_ptr, q_idx, schedule;
};

WithCsr build_csr(const Problem& p, const std::vector<int32_t>& ids, int64_t topk, int64_t rows) {
  WithCsr w{q2k_tensor(ids, p.hkv, p.total_q(), topk), HostTensor(DType::i32, {p.hkv, rows + 1}),
            HostTensor(DType::i32, {p.hkv, p.total_q() * topk}),
            HostTensor(DType::i32, {k2q_schedule_size(p.hkv, rows, p.total_q(), topk)})};
  CsrBuildArgs a;
  a.q2k = w.q2k.t;
  a.cu_seqlens_q = p.cu_q.t;
  a.kv = p.flat_kv();
  a.out = {w.row_ptr.t, w.q_idx.t, w.schedule.t};
  build_k2q_csr(a);
  return w;
}

TEST(Attention, K2QAndScheduleAreChecked) {
  const Problem p = make_problem({9, 14}, {300, 150}, 2, 2, 16, 1300);
  const std::vector<int32_t> ids = random_q2k(p, 2, 128, 1301);
  const WithCsr w = build_csr(p, ids, 2, 5);
  const Outputs want = run_attention(p, p.flat_kv(), &w.q2k, {});
  Outputs o(DType::bf16, p.total_q(), 2, 16);
  AttentionArgs a = make_args(p, p.flat_kv(), o, &w.q2k, {});
  a.k2q = {w.row_ptr.t, w.q_idx.t, w.schedule.t};
  attention_forward(a);
  expect_same_bits(o, want);

  int32_t* s = w.schedule.data<int32_t>();
  const int32_t n = s[1];
  ASSERT_GT(n, 1);
  s[1] = n - 1;  // the last item dropped
  expect_error([&] { attention_forward(a); },
               "schedule: incomplete, " + std::to_string(n - 1) + " of " + std::to_string(n) +
                   " work items present");
  std::memcpy(s + 2 + 4 * (n - 1), s + 2, 16);  // the last item replaced by a copy of the first
  s[1] = n;
  expect_error([&] { attention_forward(a); }, "covered twice");
  s[0] = 0;
  expect_error([&] { attention_forward(a); }, "schedule: not written by build_k2q_csr");

  a.k2q.schedule = Tensor();
  std::vector<int32_t> other = ids;
  other[0] = other[0] == 0 ? 1 : 0;  // a different q2k than the CSR was built from
  other[1] = -1;
  const HostTensor q2k2 = q2k_tensor(other, 2, p.total_q(), 2);
  a.q2k = q2k2.t;
  expect_error([&] { attention_forward(a); }, "k2q: does not match q2k at (head 0, row ");
  a.q2k = Tensor();
  expect_error([&] { attention_forward(a); }, "k2q: given without q2k");
}

// ---------------------------------- input rules ----------------------------------

struct RuleFixture {
  Problem p = make_problem({3, 4}, {200, 100}, 4, 2, 64, 1400);
  HostTensor q2k = q2k_tensor(random_q2k(p, 2, 128, 1401), 2, 7, 2);
  Outputs o{DType::bf16, 7, 4, 64};
  AttentionArgs args() const { return make_args(p, p.flat_kv(), o, &q2k, {}); }
};

// attention_forward as expect_arg_error's op.
void forward(const AttentionArgs& a) { attention_forward(a); }

TEST(AttentionRules, DtypeAndShape) {
  RuleFixture f;
  EXPECT_NO_THROW(attention_forward(f.args()));
  const AttentionArgs valid = f.args();
  HostTensor q32(DType::f32, {7, 4, 64});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.q = q32.t; }, "q: dtype must be bf16, f16 or fp8_e4m3, got f32");
  HostTensor k16(DType::f16, {300, 2, 64});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.kv.k = k16.t; },
                   "k: dtype must equal q's (bf16), got f16");
  HostTensor out_wide(DType::bf16, {7, 4, 72});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.out = out_wide.t; }, "out: shape must be [7, 4, 64]");
  HostTensor out16(DType::f16, {7, 4, 64});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.out = out16.t; },
                   "out: dtype must be bf16 for bf16 q, got f16");
  HostTensor lse_t(DType::f32, {7, 4});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.lse = lse_t.t; }, "lse: shape must be [4, 7]");
  HostTensor q2k_bad(DType::i32, {4, 7, 2});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.q2k = q2k_bad.t; },
                   "q2k: shape must be [Hkv, total_q, topk] = [2, 7, *]");
  HostTensor q3(DType::bf16, {7, 3, 64});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.q = q3.t; }, "kv heads (2) must divide q heads (3)");
}

TEST(AttentionRules, SeqlensAndAlignment) {
  RuleFixture f;
  const AttentionArgs valid = f.args();
  const HostTensor cu_bad = i32_tensor({0, 5, 4});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.cu_seqlens_q = cu_bad.t; },
                   "cu_seqlens_q: must be non-decreasing, but [2] = 4 < [1] = 5");
  const HostTensor cuk_bad = i32_tensor({0, 200, 299});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.kv.cu_seqlens_k = cuk_bad.t; },
                   "cu_seqlens_k: last entry must equal the token count 300");
  // Rows that are not 16-byte aligned are a CUDA rule only: test_attention_dense.cpp.
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.kv_block_size = 96; },
                   "kv_block_size: must be 1 (token ids), 64 or 128, got 96");
  // f32 and int32 views 2 bytes past an aligned address (numpy frombuffer at an odd offset): the
  // CPU backend wrote lse through a misaligned float pointer before this rule (found by fuzzing).
  HostTensor bytes(DType::u8, {4 * 7 * 4 + 4});
  const Tensor lse_odd(bytes.data<uint8_t>() + 2, DType::f32, {4, 7});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.lse = lse_odd; },
                   "lse: base pointer must be 4-byte aligned for f32 elements");
  const Tensor cu_odd(bytes.data<uint8_t>() + 2, DType::i32, {3});
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.cu_seqlens_q = cu_odd; },
                   "cu_seqlens_q: base pointer must be 4-byte aligned for i32 elements");
}

TEST(AttentionRules, BlockIds) {
  RuleFixture f;
  AttentionArgs a = f.args();
  int32_t* ids = f.q2k.data<int32_t>();
  // Token 3 is batch 1's first query (Lk 100: 1 block); (head 1, token 3, slot 1).
  for (int32_t bad : {INT_MIN, -123456, -2, 1, 1001, INT_MAX}) {
    const int32_t keep = ids[(7 + 3) * 2 + 1];
    ids[(7 + 3) * 2 + 1] = bad;
    expect_error([&] { attention_forward(a); }, "q2k: block id out of range at (head 1, token 3, slot 1)");
    ids[(7 + 3) * 2 + 1] = keep;
  }
  ids[(0 + 1) * 2 + 0] = 1;
  ids[(0 + 1) * 2 + 1] = 1;
  expect_error([&] { attention_forward(a); }, "q2k: block id repeated within a row at (head 0, token 1, slot 1)");
}

TEST(AttentionRules, PageIdsAndSeqused) {
  const Problem p = make_problem({4, 4}, {40, 40}, 2, 1, 32, 1500);
  PagedKV paged = make_paged(p, KVLayout::paged_nhd, 16, 1501);
  const int64_t pages = paged.k.t.shape[0], cols = paged.page_table.t.shape[1];
  Outputs o(DType::bf16, 8, 2, 32);
  for (int32_t bad : {-1, int32_t(pages), 99}) {
    paged.page_table.data<int32_t>()[1 * cols + 2] = bad;  // batch 1's third page (keys 32..39)
    expect_error([&] { attention_forward(make_args(p, paged.cache(), o, nullptr, {})); },
                 "page_table: page id " + std::to_string(bad) + " out of range [0, " +
                     std::to_string(pages) + ") at (batch 1, column 2)");
  }
  paged.page_table.data<int32_t>()[1 * cols + 2] = 0;
  paged.seqused_k.data<int32_t>()[0] = int32_t(cols * 16 + 1);
  expect_error([&] { attention_forward(make_args(p, paged.cache(), o, nullptr, {})); },
               "seqused_k: entry 0 = " + std::to_string(cols * 16 + 1) + " must be in [0, ");
  paged.seqused_k.data<int32_t>()[0] = 4;
  float scale = 2.f;
  KVCache scaled = paged.cache();
  scaled.k.scale = Tensor(&scale, DType::f32, {1});
  expect_error([&] { attention_forward(make_args(p, scaled, o, nullptr, {})); },
               "k.scale: must be absent for bf16 values");
}

TEST(AttentionRules, TemperatureAndTlse) {
  RuleFixture f;
  const AttentionArgs valid = f.args();
  expect_arg_error(forward, valid, [&](AttentionArgs& a) { a.tlse = f.o.tlse.t; },  // no temperature
                   "tlse: given, so params.temperature must be > 0, got 0");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.temperature = 2.f; },  // no tlse
                   "params.temperature: is 2 (> 0), so tlse [Hq, total_q] f32 must be given");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.temperature = -1.f; },
                   "params.temperature: must be finite and >= 0, got -1");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.softmax_scale = NAN; },
                   "params.softmax_scale: must be finite and >= 0");
  expect_arg_error(forward, valid, [](AttentionArgs& a) { a.params.partial_dtype = DType::f16; },
                   "params.partial_dtype: must be f32 or bf16 (or absent), got f16");
  EXPECT_EQ(attention_workspace_bytes(f.args()), 0u);
}

// A sparse call (q2k) keeps the sparse path's GQA groups (1, 2, 4, 8, 16, or MQA); the same
// shape runs dense, and groups past 128 are refused for both.
TEST(Attention, SparseCallsKeepTheirGroups) {
  const Problem p = make_problem({5, 3}, {100, 40}, 10, 2, 64, 430);
  Outputs o(DType::bf16, p.total_q(), p.hq, p.dim);
  const std::vector<int32_t> ids = random_q2k(p, 1, 128, 431);
  const HostTensor q2k = q2k_tensor(ids, p.hkv, p.total_q(), 1);
  AttentionArgs a = make_args(p, p.flat_kv(), o, &q2k, {});
  expect_error([&] { attention_forward(a); },
               "q2k: a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or 16 (or one kv head for "
               "up to 128 query heads), got 5");
  expect_matches(run_attention(p, p.flat_kv(), nullptr, {}), reference_attention(p, nullptr, 0, {}));
  const Problem wide = make_problem({2}, {30}, 129, 1, 16, 432);
  Outputs ow(DType::bf16, wide.total_q(), wide.hq, wide.dim);
  AttentionArgs b = make_args(wide, wide.flat_kv(), ow, nullptr, {});
  expect_error([&] { attention_forward(b); }, "q: GQA group Hq/Hkv must be at most 128, got 129");
}

}  // namespace
}  // namespace msa::test
