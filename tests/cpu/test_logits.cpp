// CPU mqa_logits and token_topk (include/msa/logits.h; docs/semantics.md, Indexer logits)
// against hand-computed values and brute forces written from the definitions, plus their
// argument rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/codecs.h"
#include "msa/msa.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_logits.h"

namespace msa::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A problem's tensors on the host; the arguments view them.
struct Logits {
  HostTensor q, k, k_scale, w, ks, ke, out;
  MqaLogitsArgs args(bool with_scale) const {
    MqaLogitsArgs a;
    a.q = q.t;
    a.k = with_scale ? QTensor(k.t, k_scale.t) : QTensor(k.t);
    a.weights = w.t;
    a.ks = ks.t;
    a.ke = ke.t;
    a.logits = out.t;
    return a;
  }
};

Logits make(DType dt, int64_t t, int64_t h, int64_t d, int64_t s) {
  return Logits{HostTensor(dt, {t, h, d}), HostTensor(dt, {s, d}), HostTensor(DType::f32, {s}),
                HostTensor(DType::f32, {t, h}), HostTensor(DType::i32, {t}),
                HostTensor(DType::i32, {t}), HostTensor(DType::f32, {t, s})};
}

void set_bf16(HostTensor& x, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) x.data<uint16_t>()[i] = codec::float_to_bf16(v[i]);
}

TEST(MqaLogits, HandComputedReluWeightsAndScaleAfterRelu) {
  Logits p = make(DType::bf16, 1, 2, 2, 3);
  set_bf16(p.q, {1, 0, 0, 1});           // head 0 (1, 0), head 1 (0, 1)
  set_bf16(p.k, {1, 1, -1, 2, 2, -3});   // keys (1, 1), (-1, 2), (2, -3)
  p.w.data<float>()[0] = 0.5f;
  p.w.data<float>()[1] = -1.f;
  p.ks.data<int32_t>()[0] = 0;
  p.ke.data<int32_t>()[0] = 2;
  mqa_logits(p.args(false));
  // key 0: 0.5 * relu(1) - relu(1) = -0.5; key 1: 0.5 * relu(-1) - relu(2) = -2; key 2: outside.
  EXPECT_EQ(p.out.data<float>()[0], -0.5f);
  EXPECT_EQ(p.out.data<float>()[1], -2.f);
  EXPECT_EQ(p.out.data<float>()[2], kNegInf);
}

TEST(MqaLogits, Fp8ScaleMultipliesAfterTheRelu) {
  Logits p = make(DType::fp8_e4m3, 1, 1, 2, 2);
  const uint8_t one = codec::float_to_e4m3(1.f), minus_one = codec::float_to_e4m3(-1.f);
  uint8_t* q = p.q.data<uint8_t>();
  q[0] = one;
  q[1] = one;
  uint8_t* k = p.k.data<uint8_t>();
  k[0] = one;        // key 0: (1, 1), dot 2
  k[1] = one;
  k[2] = minus_one;  // key 1: (-1, -1), dot -2
  k[3] = minus_one;
  p.k_scale.data<float>()[0] = -2.f;  // negative: -2 * relu(2), not relu(-4)
  p.k_scale.data<float>()[1] = -2.f;
  p.w.data<float>()[0] = 1.f;
  p.ks.data<int32_t>()[0] = 0;
  p.ke.data<int32_t>()[0] = 2;
  mqa_logits(p.args(true));
  EXPECT_EQ(p.out.data<float>()[0], -4.f);
  EXPECT_EQ(p.out.data<float>()[1], 0.f);
}

// Random FP8 problems with scales against the definition, key by key; rows with empty and full
// ranges; with clean_logits false the columns outside the range keep their contents.
TEST(MqaLogits, RandomFp8MatchesDefinition) {
  std::mt19937 rng(11);
  for (const bool clean : {true, false}) {
    const int64_t t_rows = 9, heads = 6, dim = 64, s_keys = 150;
    Logits p = make(DType::fp8_e4m3, t_rows, heads, dim, s_keys);
    std::uniform_int_distribution<int> byte(0, 255);
    auto fill = [&](HostTensor& x) {
      for (int64_t i = 0; i < x.t.numel(); ++i) {
        uint8_t b;
        do b = uint8_t(byte(rng)); while ((b & 0x7f) == 0x7f || (b & 0x78) > 0x50);  // |v| < 2^3
        x.data<uint8_t>()[i] = b;
      }
    };
    fill(p.q);
    fill(p.k);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t s = 0; s < s_keys; ++s) p.k_scale.data<float>()[s] = 0.25f + std::fabs(u(rng));
    for (int64_t i = 0; i < p.w.t.numel(); ++i) p.w.data<float>()[i] = u(rng);
    for (int64_t t = 0; t < t_rows; ++t) {
      int32_t a = int32_t(rng() % (s_keys + 1)), b = int32_t(rng() % (s_keys + 1));
      if (t == 0) a = b = 17;                        // empty range
      if (t == 1) a = 0, b = int32_t(s_keys);        // every key
      p.ks.data<int32_t>()[t] = std::min(a, b);
      p.ke.data<int32_t>()[t] = std::max(a, b);
    }
    std::fill(p.out.data<float>(), p.out.data<float>() + p.out.t.numel(), 123.f);
    MqaLogitsArgs args = p.args(true);
    args.clean_logits = clean;
    mqa_logits(args);
    for (int64_t t = 0; t < t_rows; ++t)
      for (int64_t s = 0; s < s_keys; ++s) {
        const float got = p.out.data<float>()[t * s_keys + s];
        if (s < p.ks.data<int32_t>()[t] || s >= p.ke.data<int32_t>()[t]) {
          EXPECT_EQ(got, clean ? kNegInf : 123.f) << t << ", " << s;
          continue;
        }
        double sum = 0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d)
            dot += double(codec::e4m3_to_float(p.q.data<uint8_t>()[(t * heads + h) * dim + d])) *
                   codec::e4m3_to_float(p.k.data<uint8_t>()[s * dim + d]);
          sum += double(p.w.data<float>()[t * heads + h]) * std::max(dot, 0.0);
        }
        EXPECT_EQ(got, float(double(p.k_scale.data<float>()[s]) * sum)) << t << ", " << s;
      }
  }
}

TEST(MqaLogits, NanPropagatesInsideTheRangeOnly) {
  Logits p = make(DType::bf16, 1, 1, 2, 3);
  set_bf16(p.q, {std::nanf(""), 1});
  set_bf16(p.k, {1, 1, 1, 1, 1, 1});
  p.w.data<float>()[0] = 1.f;
  p.ks.data<int32_t>()[0] = 1;
  p.ke.data<int32_t>()[0] = 2;
  mqa_logits(p.args(false));
  EXPECT_EQ(p.out.data<float>()[0], kNegInf);
  EXPECT_TRUE(std::isnan(p.out.data<float>()[1]));
  EXPECT_EQ(p.out.data<float>()[2], kNegInf);
}

TEST(MqaLogits, EmptyProblems) {
  Logits rows = make(DType::bf16, 0, 2, 8, 5);  // no query rows
  EXPECT_NO_THROW(mqa_logits(rows.args(false)));
  Logits keys = make(DType::bf16, 2, 2, 8, 0);  // no keys: ranges [0, 0)
  for (int t = 0; t < 2; ++t) keys.ks.data<int32_t>()[t] = keys.ke.data<int32_t>()[t] = 0;
  EXPECT_NO_THROW(mqa_logits(keys.args(false)));
}

TEST(MqaLogitsRules, MessagesNameArgumentAndRule) {
  Logits p = make(DType::fp8_e4m3, 2, 2, 16, 10);
  for (int t = 0; t < 2; ++t) p.ks.data<int32_t>()[t] = 0, p.ke.data<int32_t>()[t] = 10;
  const MqaLogitsArgs valid = p.args(true);
  ASSERT_NO_THROW(mqa_logits(valid));
  const auto run = [](const MqaLogitsArgs& a) { mqa_logits(a); };
  HostTensor bad_ranges(DType::i32, {2});
  bad_ranges.data<int32_t>()[0] = 3;
  bad_ranges.data<int32_t>()[1] = 11;
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.ke = bad_ranges.t; },
                   "ks, ke: row 1 must satisfy 0 <= ks <= ke <= S (10), got [0, 11)");
  HostTensor late_start(DType::i32, {2});
  late_start.data<int32_t>()[0] = 5;
  late_start.data<int32_t>()[1] = 0;
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.ks = late_start.t; a.ke = bad_ranges.t; },
                   "ks, ke: row 0 must satisfy 0 <= ks <= ke <= S (10), got [5, 3)");
  HostTensor w3(DType::f32, {2, 3});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.weights = w3.t; }, "weights:");
  HostTensor k8(DType::fp8_e4m3, {10, 8});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.k = QTensor(k8.t); },
                   "k: must be [S, 16] (q's head dim)");
  HostTensor kbf(DType::bf16, {10, 16});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.k = QTensor(kbf.t); }, "k: dtype");
  HostTensor qs(DType::f32, {1});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.q = QTensor(p.q.t, qs.t); },
                   "q.scale: must be absent");
  HostTensor short_scale(DType::f32, {9});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.k = QTensor(p.k.t, short_scale.t); },
                   "k.scale:");
  HostTensor narrow(DType::f32, {2, 9});
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.logits = narrow.t; }, "logits:");
  expect_arg_error(run, valid, [&](MqaLogitsArgs& a) { a.q.values.device = {DeviceType::cuda, 0}; },
                   "mqa_logits: k is on cpu, but q on cuda:0; all on one device");
}

// Hand-made row: ties toward the lower position, NaN below every finite value, -inf never, the
// range respected, -1 padding when fewer candidates than topk exist.
TEST(TokenTopK, TiesNanInfRangesAndPadding) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  HostTensor logits(DType::f32, {3, 8});
  const float rows[3][8] = {{1, 3, 3, 2, nan, -inf, 3, 0},
                            {nan, nan, -inf, -inf, 5, nan, -inf, -inf},
                            {9, 9, 9, 9, 9, 9, 9, 9}};
  std::copy(&rows[0][0], &rows[0][0] + 24, logits.data<float>());
  HostTensor ks(DType::i32, {3}), ke(DType::i32, {3}), ids(DType::i32, {3, 4});
  const int32_t lo[3] = {0, 0, 6}, hi[3] = {8, 8, 8};
  std::copy(lo, lo + 3, ks.data<int32_t>());
  std::copy(hi, hi + 3, ke.data<int32_t>());
  TokenTopKArgs a;
  a.logits = logits.t;
  a.ks = ks.t;
  a.ke = ke.t;
  a.topk = 4;
  a.ids = ids.t;
  token_topk(a);
  // row 0: 3 at 1, 2, 6, then 2 at 3 (not 1 at 0); row 1: 5 at 4, then the NaN at 0, 1, 5;
  // row 2: only keys 6 and 7 are candidates.
  const std::vector<int32_t> want = {1, 2, 3, 6, 0, 1, 4, 5, 6, 7, -1, -1};
  EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + 12), want);
}

// Random rows (with repeated values, NaN and -inf) against picking the best candidate topk times.
TEST(TokenTopK, RandomMatchesRepeatedSelection) {
  std::mt19937 rng(5);
  const int64_t rows = 12, s_keys = 300;
  for (const int topk : {1, 7, 64, 400}) {
    HostTensor logits(DType::f32, {rows, s_keys}), ids(DType::i32, {rows, topk});
    for (int64_t i = 0; i < logits.t.numel(); ++i) {
      const int kind = int(rng() % 20);
      logits.data<float>()[i] = kind == 0   ? std::nanf("")
                                : kind == 1 ? -std::numeric_limits<float>::infinity()
                                            : float(int(rng() % 50)) * 0.25f;
    }
    TokenTopKArgs a;
    a.logits = logits.t;
    a.topk = topk;
    a.ids = ids.t;
    token_topk(a);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data<float>() + r * s_keys;
      std::vector<char> used(s_keys, 0);
      std::vector<int32_t> want;
      for (int pick = 0; pick < topk; ++pick) {
        int best = -1;
        for (int s = 0; s < s_keys; ++s) {
          if (used[s] || row[s] == -std::numeric_limits<float>::infinity()) continue;
          if (best < 0) { best = s; continue; }
          const bool sn = std::isnan(row[s]), bn = std::isnan(row[best]);
          if ((bn && !sn) || (!sn && !bn && row[s] > row[best])) best = s;
        }
        if (best < 0) break;
        used[best] = 1;
        want.push_back(best);
      }
      std::sort(want.begin(), want.end());
      want.resize(topk, -1);
      EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>() + r * topk, ids.data<int32_t>() + (r + 1) * topk),
                want) << "row " << r << " topk " << topk;
    }
  }
}

TEST(TokenTopKRules, MessagesNameArgumentAndRule) {
  HostTensor logits(DType::f32, {2, 10}), ids(DType::i32, {2, 3}), ks(DType::i32, {2}),
      ke(DType::i32, {2});
  std::fill(logits.data<float>(), logits.data<float>() + 20, 1.f);
  TokenTopKArgs valid;
  valid.logits = logits.t;
  valid.topk = 3;
  valid.ids = ids.t;
  ASSERT_NO_THROW(token_topk(valid));
  const auto run = [](const TokenTopKArgs& a) { token_topk(a); };
  expect_arg_error(run, valid, [](TokenTopKArgs& a) { a.topk = 0; }, "topk: must be >= 1");
  expect_arg_error(run, valid, [](TokenTopKArgs& a) { a.topk = 4; }, "ids:");
  expect_arg_error(run, valid, [&](TokenTopKArgs& a) { a.ks = ks.t; }, "ks, ke: give both");
  ks.data<int32_t>()[0] = 4;
  ke.data<int32_t>()[0] = 2;
  expect_arg_error(run, valid, [&](TokenTopKArgs& a) { a.ks = ks.t; a.ke = ke.t; },
                   "ks, ke: row 0 must satisfy 0 <= ks <= ke <= S (10), got [4, 2)");
  expect_arg_error(run, valid, [](TokenTopKArgs& a) { a.ids.device = {DeviceType::cuda, 0}; },
                   "token_topk: ids is on cuda:0, but logits on cpu; all on one device");
  expect_arg_error(run, valid, [](TokenTopKArgs& a) {
    a.logits.device = a.ids.device = {DeviceType::cuda, 0};
  }, "token_topk: status (int32[4] on the GPU) is required for CUDA tensors");
}


// Paged rows equal the ragged logits of each request's own keys with its slots' limits (the
// same formula, bitwise); -inf from the limit to max_seq_len; padding columns untouched.
TEST(PagedMqaLogits, EqualsRaggedPerRequest) {
  std::mt19937 rng(21);
  const int64_t next_n = 3, heads = 4, dim = 32, bs = 16;
  const std::vector<int32_t> lens = {37, 0, 2, 16, 100};
  const int64_t batch = int64_t(lens.size()), max_len = 112, width = 8;
  int64_t blocks = 2;
  for (int32_t l : lens) blocks += (l + bs - 1) / bs;
  PagedLogits p{HostTensor(DType::fp8_e4m3, {batch, next_n, heads, dim}),
              HostTensor(DType::u8, {blocks, bs, 1, dim + 4}), HostTensor(DType::f32, {batch * next_n, heads}),
              HostTensor(DType::i32, {batch, width}), HostTensor(DType::i32, {batch}),
              HostTensor(DType::f32, {batch * next_n, max_len + 5}), max_len};
  auto byte = [&] {
    uint8_t b;
    do b = uint8_t(rng() % 256); while ((b & 0x7f) == 0x7f || (b & 0x78) > 0x50);
    return b;
  };
  for (int64_t i = 0; i < p.q.t.numel(); ++i) p.q.data<uint8_t>()[i] = byte();
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < p.w.t.numel(); ++i) p.w.data<float>()[i] = u(rng);
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::fill(p.tables.data<int32_t>(), p.tables.data<int32_t>() + batch * width, -1);
  // Flat keys and scales per request, scattered into the pool.
  std::vector<HostTensor> keys, scales;
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    p.lens.data<int32_t>()[b] = lens[b];
    keys.emplace_back(DType::fp8_e4m3, std::vector<int64_t>{lens[b], dim});
    scales.emplace_back(DType::f32, std::vector<int64_t>{lens[b]});
    for (int64_t j = 0; j < lens[b]; ++j) {
      if (j % bs == 0) p.tables.data<int32_t>()[b * width + j / bs] = order[next++];
      uint8_t* base = p.kv.data<uint8_t>() + p.tables.data<int32_t>()[b * width + j / bs] * bs * (dim + 4);
      for (int64_t d = 0; d < dim; ++d)
        base[(j % bs) * dim + d] = keys[b].data<uint8_t>()[j * dim + d] = byte();
      const float sc = 0.5f + std::fabs(u(rng));
      scales[b].data<float>()[j] = sc;
      std::memcpy(base + bs * dim + 4 * (j % bs), &sc, 4);
    }
  }
  std::fill(p.out.data<float>(), p.out.data<float>() + p.out.t.numel(), 7.f);
  paged_mqa_logits(p.args());
  for (int64_t b = 0; b < batch; ++b) {
    // The request's slots as ragged rows over its own keys.
    HostTensor q(DType::fp8_e4m3, {next_n, heads, dim}), w(DType::f32, {next_n, heads}),
        ks(DType::i32, {next_n}), ke(DType::i32, {next_n}), want(DType::f32, {next_n, lens[b]});
    std::memcpy(q.data<uint8_t>(), p.q.data<uint8_t>() + b * next_n * heads * dim, q.bytes());
    std::memcpy(w.data<float>(), p.w.data<float>() + b * next_n * heads, w.bytes());
    for (int64_t t = 0; t < next_n; ++t) {
      ks.data<int32_t>()[t] = 0;
      ke.data<int32_t>()[t] = lens[b] > 0 ? int32_t(std::max<int64_t>(0, lens[b] - next_n + t + 1)) : 0;
    }
    MqaLogitsArgs r;
    r.q = q.t;
    r.k = QTensor(keys[b].t, scales[b].t);
    r.weights = w.t;
    r.ks = ks.t;
    r.ke = ke.t;
    r.logits = want.t;
    mqa_logits(r);
    for (int64_t t = 0; t < next_n; ++t) {
      const float* got = p.out.data<float>() + (b * next_n + t) * (max_len + 5);
      for (int64_t c = 0; c < max_len + 5; ++c) {
        const float expect = c >= max_len ? 7.f : c < lens[b] ? want.data<float>()[t * lens[b] + c] : kNegInf;
        EXPECT_EQ(got[c], expect) << "batch " << b << " slot " << t << " column " << c;
      }
    }
  }
}

// FP4 (MXFP4): q with q_sf, the pool's values then its UE8M0 scales per block (token-major), no
// per-token factor; against the formula written out here.
TEST(PagedMqaLogits, Fp4MatchesDefinition) {
  std::mt19937 rng(31);
  const int64_t next_n = 2, heads = 4, dim = 64, bs = 32, groups = dim / 32;
  const std::vector<int32_t> lens = {45, 3};
  const int64_t batch = 2, width = 2, max_len = 64, blocks = 4;
  const int64_t token_bytes = dim / 2 + groups;
  PagedLogits p{HostTensor(DType::fp4x2, {batch, next_n, heads, dim / 2}),
              HostTensor(DType::u8, {blocks, bs, 1, token_bytes}),
              HostTensor(DType::f32, {batch * next_n, heads}), HostTensor(DType::i32, {batch, width}),
              HostTensor(DType::i32, {batch}), HostTensor(DType::f32, {batch * next_n, max_len}), max_len};
  HostTensor q_sf(DType::e8m0, {batch, next_n, heads, groups});
  for (int64_t i = 0; i < p.q.t.numel(); ++i) p.q.data<uint8_t>()[i] = uint8_t(rng());
  for (int64_t i = 0; i < q_sf.t.numel(); ++i) q_sf.data<uint8_t>()[i] = uint8_t(124 + rng() % 6);
  for (int64_t i = 0; i < p.kv.t.numel(); ++i) p.kv.data<uint8_t>()[i] = uint8_t(rng());
  for (int64_t blk = 0; blk < blocks; ++blk)  // the scale region: moderate exponents
    for (int64_t j = 0; j < bs * groups; ++j)
      p.kv.data<uint8_t>()[blk * bs * token_bytes + bs * dim / 2 + j] = uint8_t(122 + rng() % 8);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < p.w.t.numel(); ++i) p.w.data<float>()[i] = u(rng);
  const int32_t table[4] = {2, 0, 3, 1};
  std::copy(table, table + 4, p.tables.data<int32_t>());
  std::copy(lens.begin(), lens.end(), p.lens.data<int32_t>());
  PagedMqaLogitsArgs a = p.args();
  a.q_sf = q_sf.t;
  paged_mqa_logits(a);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < next_n; ++t) {
      const int64_t limit = lens[b] - next_n + t + 1;
      for (int64_t pos = 0; pos < max_len; ++pos) {
        const float got = p.out.data<float>()[(b * next_n + t) * max_len + pos];
        if (pos >= limit) {
          EXPECT_EQ(got, kNegInf);
          continue;
        }
        const uint8_t* blk = p.kv.data<uint8_t>() + table[b * width + pos / bs] * bs * token_bytes;
        const uint8_t* kv_vals = blk + (pos % bs) * dim / 2;
        const uint8_t* kv_sf = blk + bs * dim / 2 + (pos % bs) * groups;
        double sum = 0;
        for (int64_t h = 0; h < heads; ++h) {
          const uint8_t* qv = p.q.data<uint8_t>() + ((b * next_n + t) * heads + h) * dim / 2;
          const uint8_t* qs = q_sf.data<uint8_t>() + ((b * next_n + t) * heads + h) * groups;
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d)
            dot += double(codec::fp4x2_get(qv, d)) * codec::e8m0_to_float(qs[d / 32]) *
                   double(codec::fp4x2_get(kv_vals, d)) * codec::e8m0_to_float(kv_sf[d / 32]);
          sum += double(p.w.data<float>()[(b * next_n + t) * heads + h]) * std::max(dot, 0.0);
        }
        EXPECT_EQ(got, float(sum)) << b << ", " << t << ", " << pos;
      }
    }
}

TEST(PagedMqaLogitsRules, WhatTheSeedLeavesUndefinedIsAnError) {
  const int64_t dim = 32, bs = 16;
  PagedLogits p{HostTensor(DType::fp8_e4m3, {2, 1, 4, dim}), HostTensor(DType::u8, {4, bs, 1, dim + 4}),
              HostTensor(DType::f32, {2, 4}), HostTensor(DType::i32, {2, 2}),
              HostTensor(DType::i32, {2}), HostTensor(DType::f32, {2, 32}), 32};
  std::fill(p.q.data<uint8_t>(), p.q.data<uint8_t>() + p.q.bytes(), uint8_t(0x38));
  std::fill(p.kv.data<uint8_t>(), p.kv.data<uint8_t>() + p.kv.bytes(), uint8_t(0));
  std::fill(p.w.data<float>(), p.w.data<float>() + 8, 1.f);
  const int32_t table[4] = {0, 1, 2, 3};
  std::copy(table, table + 4, p.tables.data<int32_t>());
  p.lens.data<int32_t>()[0] = 20;
  p.lens.data<int32_t>()[1] = 32;
  const PagedMqaLogitsArgs valid = p.args();
  ASSERT_NO_THROW(paged_mqa_logits(valid));
  const auto run = [](const PagedMqaLogitsArgs& a) { paged_mqa_logits(a); };
  expect_arg_error(run, valid, [](PagedMqaLogitsArgs& a) { a.max_seq_len = 31; },
                   "seq_lens: entry 1 must be in [0, max_seq_len = 31], got 32");
  HostTensor narrow(DType::i32, {2, 1});
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.block_tables = narrow.t; },
                   "block_tables: 1 columns cannot hold batch 0's 20 keys");
  HostTensor bad(DType::i32, {2, 2});
  const int32_t bad_ids[4] = {0, 1, 2, 4};
  std::copy(bad_ids, bad_ids + 4, bad.data<int32_t>());
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.block_tables = bad.t; },
                   "block_tables: block id 4 out of range [0, 4) at (batch 1, column 1)");
  HostTensor short_out(DType::f32, {2, 31});
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.logits = short_out.t; }, "logits:");
  HostTensor kv_wide(DType::u8, {4, bs, 1, dim + 8});
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.kv_fused = kv_wide.t; },
                   "kv_fused: must be [num_blocks, block_size, 1, D + 4 = 36]");
  // An empty q may claim any head dim; D + 4 overflowed int64 before this rule (found by
  // fuzzing, a UBSan report in test-asan).
  const Tensor q_huge(p.q.data<uint8_t>(), DType::fp8_e4m3, {0, 1, 4, INT64_MAX});
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.q = q_huge; },
                   "q: head dim 9223372036854775807 is too large for a kv_fused row");
  // A pool of no block may claim any block size; len + block_size - 1 overflowed int64 (found by
  // fuzzing, a UBSan report in test-asan).
  const Tensor kv_empty(p.kv.data<uint8_t>(), DType::u8, {0, INT64_MAX, 1, dim + 4});
  expect_arg_error(run, valid, [&](PagedMqaLogitsArgs& a) { a.kv_fused = kv_empty; },
                   "block_tables: block id 0 out of range [0, 0) at (batch 0, column 0)");
}

// mqa_logits_topk: the ids of token_topk over mqa_logits' rows, for every chunking the workspace
// gives (one row, a few, all of them, none: the CPU's own), topk below, at and past the rows'
// lengths, empty and full ranges, repeated values (ties across chunk boundaries are row-local).
TEST(MqaLogitsTopK, EqualsTokenTopKOfTheLogits) {
  std::mt19937 rng(31);
  const int64_t t_rows = 23, heads = 3, dim = 32, s_keys = 90;
  Logits p = make(DType::fp8_e4m3, t_rows, heads, dim, s_keys);
  for (int64_t i = 0; i < p.q.t.numel(); ++i) p.q.data<uint8_t>()[i] = uint8_t(0x30 + rng() % 24);
  for (int64_t i = 0; i < p.k.t.numel(); ++i) p.k.data<uint8_t>()[i] = uint8_t(rng() % 2 ? 0x38 : 0xb8);
  for (int64_t s = 0; s < s_keys; ++s) p.k_scale.data<float>()[s] = 0.5f + float(rng() % 4) * 0.25f;
  for (int64_t i = 0; i < p.w.t.numel(); ++i) p.w.data<float>()[i] = float(int(rng() % 7) - 3);
  for (int64_t t = 0; t < t_rows; ++t) {
    int32_t a = int32_t(rng() % (s_keys + 1)), b = int32_t(rng() % (s_keys + 1));
    if (t == 3) a = b = 40;                  // empty
    if (t == 4) a = 0, b = int32_t(s_keys);  // all
    p.ks.data<int32_t>()[t] = std::min(a, b);
    p.ke.data<int32_t>()[t] = std::max(a, b);
  }
  MqaLogitsArgs la = p.args(true);
  mqa_logits(la);
  const int64_t row_bytes = (s_keys * 4 + 15) / 16 * 16;
  for (const int topk : {1, 9, 90, 200}) {
    HostTensor want(DType::i32, {t_rows, topk});
    TokenTopKArgs ta;
    ta.logits = p.out.t;
    ta.ks = p.ks.t;
    ta.ke = p.ke.t;
    ta.topk = topk;
    ta.ids = want.t;
    token_topk(ta);
    for (const int64_t ws_rows : {0, 1, 5, 23, 100}) {
      HostTensor ids(DType::i32, {t_rows, topk}), ws(DType::u8, {std::max<int64_t>(1, ws_rows * row_bytes)});
      std::fill(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel(), 77);
      mqa_logits_topk(logits_topk_args(la, topk, ids.t, ws_rows > 0 ? ws.t : Tensor()));
      EXPECT_EQ(0, std::memcmp(ids.t.data, want.t.data, want.bytes()))
          << "topk " << topk << ", workspace of " << ws_rows << " rows";
    }
  }
  EXPECT_EQ(mqa_logits_topk_workspace_bytes(23, 90), 23 * row_bytes);
  EXPECT_EQ(mqa_logits_topk_workspace_bytes(100000, 90), 2048 * row_bytes);
  EXPECT_EQ(mqa_logits_topk_workspace_bytes(0, 0), 16);
}

TEST(MqaLogitsTopKRules, MessagesNameArgumentAndRule) {
  Logits p = make(DType::fp8_e4m3, 6, 2, 16, 10);
  std::fill(p.q.data<uint8_t>(), p.q.data<uint8_t>() + p.q.bytes(), uint8_t(0x38));
  std::fill(p.k.data<uint8_t>(), p.k.data<uint8_t>() + p.k.bytes(), uint8_t(0x38));
  std::fill(p.w.data<float>(), p.w.data<float>() + p.w.t.numel(), 1.f);
  for (int t = 0; t < 6; ++t) p.ks.data<int32_t>()[t] = 0, p.ke.data<int32_t>()[t] = 10;
  HostTensor ids(DType::i32, {6, 3}), ws(DType::u8, {48}), small(DType::u8, {47}), ws_f32(DType::f32, {12});
  const MqaLogitsTopKArgs valid = logits_topk_args(p.args(false), 3, ids.t, ws.t);
  ASSERT_NO_THROW(mqa_logits_topk(valid));
  const auto run = [](const MqaLogitsTopKArgs& a) { mqa_logits_topk(a); };
  expect_arg_error(run, valid, [](MqaLogitsTopKArgs& a) { a.topk = 0; }, "topk: must be >= 1");
  expect_arg_error(run, valid, [](MqaLogitsTopKArgs& a) { a.topk = 4; }, "ids:");
  expect_arg_error(run, valid, [&](MqaLogitsTopKArgs& a) { a.workspace = small.t; },
                   "workspace: mqa_logits_topk needs at least 48 bytes (1 row(s) of 10 f32 logits");
  expect_arg_error(run, valid, [&](MqaLogitsTopKArgs& a) { a.workspace = ws_f32.t; }, "workspace:");
  // A bad range names the call's row, wherever the chunks fall.
  p.ks.data<int32_t>()[5] = 7;
  p.ke.data<int32_t>()[5] = 3;
  expect_arg_error(run, valid, [](MqaLogitsTopKArgs&) {},
                   "ks, ke: row 5 must satisfy 0 <= ks <= ke <= S (10), got [7, 3)");
  p.ks.data<int32_t>()[5] = 0;
  p.ke.data<int32_t>()[5] = 10;
  expect_arg_error(run, valid, [](MqaLogitsTopKArgs& a) { a.ids.device = {DeviceType::cuda, 0}; },
                   "mqa_logits_topk: ids is on cuda:0, but q on cpu; all on one device");
  HostTensor q3(DType::fp8_e4m3, {6, 2, 8});
  expect_arg_error(run, valid, [&](MqaLogitsTopKArgs& a) { a.q = q3.t; }, "k: must be [S, 8]");
}

// paged_mqa_logits_topk: the ids of token_topk over paged_mqa_logits' clean rows, for chunks of
// one batch, a few and all of them, and the CPU's own.
TEST(PagedMqaLogitsTopK, EqualsTokenTopKOfTheCleanLogits) {
  std::mt19937 rng(41);
  const int64_t next_n = 2, heads = 4, dim = 32, bs = 16, max_len = 70, width = 5;
  const std::vector<int32_t> lens = {37, 0, 1, 16, 70, 45, 2};
  const int64_t batch = int64_t(lens.size()), blocks = batch * width;
  PagedLogits p{HostTensor(DType::fp8_e4m3, {batch, next_n, heads, dim}),
                HostTensor(DType::u8, {blocks, bs, 1, dim + 4}), HostTensor(DType::f32, {batch * next_n, heads}),
                HostTensor(DType::i32, {batch, width}), HostTensor(DType::i32, {batch}),
                HostTensor(DType::f32, {batch * next_n, max_len}), max_len};
  for (int64_t i = 0; i < p.q.t.numel(); ++i) p.q.data<uint8_t>()[i] = uint8_t(0x30 + rng() % 24);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* base = p.kv.data<uint8_t>() + b * bs * (dim + 4);
    for (int64_t i = 0; i < bs * dim; ++i) base[i] = uint8_t(rng() % 2 ? 0x38 : 0xb8);
    for (int64_t j = 0; j < bs; ++j) {
      const float sc = 0.5f + float(rng() % 4) * 0.25f;
      std::memcpy(base + bs * dim + 4 * j, &sc, 4);
    }
  }
  for (int64_t i = 0; i < p.w.t.numel(); ++i) p.w.data<float>()[i] = float(int(rng() % 7) - 3);
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::copy(order.begin(), order.end(), p.tables.data<int32_t>());
  std::copy(lens.begin(), lens.end(), p.lens.data<int32_t>());
  paged_mqa_logits(p.args());
  const int64_t rows = batch * next_n, row_bytes = (max_len * 4 + 15) / 16 * 16;
  for (const int topk : {1, 12, 80}) {
    HostTensor want(DType::i32, {rows, topk});
    TokenTopKArgs ta;
    ta.logits = p.out.t;
    ta.topk = topk;
    ta.ids = want.t;
    token_topk(ta);
    for (const int64_t ws_batches : {0, 1, 3, 7}) {
      HostTensor ids(DType::i32, {rows, topk}),
          ws(DType::u8, {std::max<int64_t>(1, ws_batches * next_n * row_bytes + (ws_batches ? 17 : 0))});
      std::fill(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel(), 77);
      paged_mqa_logits_topk(logits_topk_args(p.args(), topk, ids.t, ws_batches > 0 ? ws.t : Tensor()));
      EXPECT_EQ(0, std::memcmp(ids.t.data, want.t.data, want.bytes()))
          << "topk " << topk << ", workspace of " << ws_batches << " batches";
    }
  }
  EXPECT_EQ(paged_mqa_logits_topk_workspace_bytes(7, 2, 70), 14 * row_bytes);
  EXPECT_EQ(paged_mqa_logits_topk_workspace_bytes(5000, 3, 70), 683 * 3 * row_bytes);
  // A workspace short of one batch's rows is refused by name.
  HostTensor ids(DType::i32, {rows, 4}), one_row(DType::u8, {row_bytes});
  PagedMqaLogitsTopKArgs a = logits_topk_args(p.args(), 4, ids.t, one_row.t);
  expect_error([&] { paged_mqa_logits_topk(a); },
               "workspace: paged_mqa_logits_topk needs at least 576 bytes (2 row(s) of 70 f32 logits");
  a.workspace = Tensor();
  a.max_seq_len = 44;  // below batches 4's and 5's lengths: the first is named
  expect_error([&] { paged_mqa_logits_topk(a); }, "seq_lens: entry 4 must be in [0, max_seq_len = 44], got 70");
}

}  // namespace
}  // namespace msa::test
