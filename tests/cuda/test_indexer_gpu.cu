// GPU indexer (src/cuda/sm90/block_scores) against the CPU reference: block scores within 1e-3
// relative with identical -inf positions on random bf16/f16 inputs; the fused top-K equal to
// select_topk on the same scores (fused == unfused) and, on integer-valued inputs whose dot
// products are exact, identical ids to the CPU reference, exact ties included.
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "common/codecs.h"
#include "cpu/host_tensor.h"
#include "gpu_test_util.h"

namespace msa::test {
namespace {

struct IdxCase {
  std::vector<int32_t> lq, lk;
  int64_t hkv = 2, group = 4;
  bool causal = true;
  bool integer_values = false;  // q, k in {-2..2}: exact dot products, many ties
  DType dtype = DType::bf16;     // bf16 | f16 | fp8_e4m3
  int q_scale_kind = 0, k_scale_kind = 0;  // fp8: 0 none, 1 per tensor, 2 per token, 3 per token-head
  int topk = 8, sink = 1, local = 1;
  unsigned seed = 1;
};

constexpr int64_t kD = 128;

HostTensor random_tokens(int64_t tokens, int64_t heads, DType dt, bool integer, std::mt19937& rng) {
  HostTensor t(dt, {tokens, heads, kD});
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < tokens * heads * kD; ++i) {
    const float v = integer ? float(int(rng() % 5) - 2) : nd(rng);
    if (dt == DType::fp8_e4m3) t.data<uint8_t>()[i] = codec::float_to_e4m3(v);
    else t.data<uint16_t>()[i] = dt == DType::bf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
  }
  return t;
}

// FP8 scales of a kind (see IdxCase); powers of two when `exact`, so that scaled integer dot
// products stay exact on both sides.
std::optional<HostTensor> random_scale(int kind, int64_t tokens, int64_t heads, bool exact,
                                       std::mt19937& rng) {
  if (kind == 0) return std::nullopt;
  std::vector<int64_t> shape = kind == 1 ? std::vector<int64_t>{1}
                               : kind == 2 ? std::vector<int64_t>{tokens}
                                           : std::vector<int64_t>{tokens, heads};
  HostTensor s(DType::f32, shape);
  std::uniform_real_distribution<float> u(0.25f, 2.f);
  for (int64_t i = 0; i < s.t.numel(); ++i) s.data<float>()[i] = exact ? std::ldexp(1.f, int(rng() % 4) - 2) : u(rng);
  return s;
}

Tensor to_gpu(const HostTensor& h, DeviceBuffer& d, cudaStream_t s) {
  d = DeviceBuffer(h.bytes() + 16);
  d.upload(std::vector<uint8_t>(h.data<uint8_t>(), h.data<uint8_t>() + h.bytes()), s);
  Tensor t = h.t;
  t.data = d.get();
  t.device = gpu0();
  return t;
}

void run_case(const IdxCase& c) {
  std::mt19937 rng(c.seed);
  const int64_t total_q = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  const int64_t total_k = std::accumulate(c.lk.begin(), c.lk.end(), int64_t(0));
  const int64_t hq = c.hkv * c.group;
  int64_t nblk = 1;
  for (int32_t k : c.lk) nblk = std::max<int64_t>(nblk, (k + 127) / 128);
  nblk += 1;  // a column past every batch: must be -inf everywhere
  const HostTensor q = random_tokens(total_q, hq, c.dtype, c.integer_values, rng);
  const HostTensor k = random_tokens(total_k, c.hkv, c.dtype, c.integer_values, rng);
  const auto q_scale = random_scale(c.q_scale_kind, total_q, hq, c.integer_values, rng);
  const auto k_scale = random_scale(c.k_scale_kind, total_k, c.hkv, c.integer_values, rng);
  const HostTensor cu_q = i32_tensor(cumulative(c.lq)), cu_k = i32_tensor(cumulative(c.lk));

  // CPU reference: scores and ids.
  HostTensor ref(DType::f32, {hq, nblk, total_q});
  BlockScoresArgs a;
  a.q = q_scale ? QTensor(q.t, q_scale->t) : QTensor(q.t);
  a.kv.k = k_scale ? QTensor(k.t, k_scale->t) : QTensor(k.t);
  a.kv.cu_seqlens_k = cu_k.t;
  a.cu_seqlens_q = cu_q.t;
  a.scores = ref.t;
  a.causal = c.causal;
  block_scores(a);

  TestStream stream;
  DeviceBuffer dq, dk, dcq, dck, dqs, dks, dscores(ref.bytes()), dst(16), dids, dids2;
  BlockScoresArgs g = a;
  g.q = q_scale ? QTensor(to_gpu(q, dq, stream), to_gpu(*q_scale, dqs, stream)) : QTensor(to_gpu(q, dq, stream));
  g.kv.k = k_scale ? QTensor(to_gpu(k, dk, stream), to_gpu(*k_scale, dks, stream)) : QTensor(to_gpu(k, dk, stream));
  g.kv.cu_seqlens_k = to_gpu(cu_k, dck, stream);
  g.cu_seqlens_q = to_gpu(cu_q, dcq, stream);
  g.scores = ref.t;
  g.scores.data = dscores.get();
  g.scores.device = gpu0();
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  clear_status(g.status, stream);
  dscores.poison(stream);
  block_scores(g, stream);
  check_status(g.status, stream);
  const auto got = dscores.download<float>(size_t(ref.t.numel()), stream);

  double num = 0, den = 0;
  int64_t bad_inf = 0, nan = 0;
  for (int64_t i = 0; i < ref.t.numel(); ++i) {
    const float r = ref.data<float>()[i], x = got[i];
    if (std::isnan(x)) ++nan;
    if (std::isinf(r) || std::isinf(x)) {
      bad_inf += (r != x);
      continue;
    }
    num += (double(x) - r) * (double(x) - r);
    den += double(r) * r;
  }
  EXPECT_EQ(nan, 0) << "NaN (or unwritten) scores";
  EXPECT_EQ(bad_inf, 0) << "-inf positions differ";
  if (den > 0) EXPECT_LE(std::sqrt(num / den), 1e-3);
  if (c.integer_values) {
    EXPECT_EQ(0, std::memcmp(got.data(), ref.data<float>(), got.size() * 4)) << "exact scores differ";
  }

  // Fused top-K vs select_topk on the GPU's own scores (exact), and vs the CPU ids when exact.
  HostTensor gpu_scores(DType::f32, {hq, nblk, total_q});
  std::memcpy(gpu_scores.data<float>(), got.data(), got.size() * 4);
  HostTensor want(DType::i32, {c.hkv, total_q, c.topk});
  TopKArgs ta;
  ta.scores = gpu_scores.t;
  ta.cu_seqlens_q = cu_q.t;
  ta.kv.cu_seqlens_k = cu_k.t;
  ta.num_kv_heads = int(c.hkv);
  ta.topk = c.topk;
  ta.sink_blocks = c.sink;
  ta.local_blocks = c.local;
  ta.causal = c.causal;
  ta.q2k = want.t;
  select_topk(ta);

  BlockTopKArgs f;
  f.q = g.q;
  f.kv = g.kv;
  f.cu_seqlens_q = g.cu_seqlens_q;
  f.causal = c.causal;
  f.topk = c.topk;
  f.sink_blocks = c.sink;
  f.local_blocks = c.local;
  f.status = g.status;
  dids = DeviceBuffer(want.bytes() + 16);
  dids.poison(stream);
  f.q2k = want.t;
  f.q2k.data = dids.get();
  f.q2k.device = gpu0();
  block_topk(f, stream);
  check_status(f.status, stream);
  const auto ids = dids.download<int32_t>(size_t(want.t.numel()), stream);
  int64_t mismatch = 0;
  for (int64_t i = 0; i < want.t.numel(); ++i)
    if (ids[i] != want.data<int32_t>()[i] && mismatch++ < 5)
      ADD_FAILURE() << "fused id " << i << ": " << ids[i] << " vs unfused " << want.data<int32_t>()[i];
  EXPECT_EQ(mismatch, 0);

  if (c.integer_values) {  // scores are exact, so the CPU's own fused path must agree too
    HostTensor cpu_ids(DType::i32, {c.hkv, total_q, c.topk});
    BlockTopKArgs cf = f;
    cf.q = a.q;
    cf.kv = a.kv;
    cf.cu_seqlens_q = cu_q.t;
    cf.q2k = cpu_ids.t;
    cf.status = Tensor();
    block_topk(cf);
    EXPECT_EQ(0, std::memcmp(ids.data(), cpu_ids.data<int32_t>(), ids.size() * 4)) << "ids differ from CPU";
  }
}

TEST(IndexerGpu, RandomVarlenSweep) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int64_t groups[] = {1, 2, 4, 8, 16};
  for (int trial = 0; trial < 15; ++trial) {
    IdxCase c;
    const int b = 1 + int(rng() % 3);
    for (int i = 0; i < b; ++i) {
      c.lq.push_back(int32_t(rng() % 400));
      c.lk.push_back(int32_t(c.lq.back() + rng() % 900));
    }
    c.group = groups[trial % 5];
    c.hkv = 1 + trial % 2;
    c.causal = trial % 3 != 2;
    c.integer_values = trial % 2 == 1;
    c.dtype = trial % 4 == 3 ? DType::f16 : DType::bf16;
    c.topk = 1 + int(rng() % 20);
    c.sink = c.topk >= 2 ? 1 : 0;
    c.local = c.topk >= 2 ? 1 : 0;
    c.seed = 200 + trial;
    SCOPED_TRACE("trial " + std::to_string(trial));
    run_case(c);
  }
}

TEST(IndexerGpu, Fp8EachScaleKind) {
  MSA_REQUIRE_GPU();
  const int64_t groups[] = {16, 4, 1, 8, 2};
  int trial = 0;
  for (int qk = 0; qk < 4; ++qk)
    for (int kk = 0; kk < 4; ++kk, ++trial) {
      IdxCase c;
      c.lq = {int32_t(50 + 40 * (trial % 3)), int32_t(trial % 5 == 0 ? 0 : 130)};
      c.lk = {int32_t(c.lq[0] + 300), int32_t(c.lq[1] + 700)};
      c.dtype = DType::fp8_e4m3;
      c.q_scale_kind = qk;
      c.k_scale_kind = kk;
      c.group = groups[trial % 5];
      c.integer_values = trial % 2 == 0;  // exact: ids must equal the CPU's
      c.causal = trial % 4 != 3;
      c.topk = 6;
      c.seed = 300 + trial;
      SCOPED_TRACE("fp8 q scale kind " + std::to_string(qk) + ", k scale kind " + std::to_string(kk));
      run_case(c);
    }
}

TEST(IndexerGpu, EdgeShapes) {
  MSA_REQUIRE_GPU();
  IdxCase c;
  c.lq = {0, 3, 300, 1};
  c.lk = {50, 0, 130, 1};  // empty q batch, empty k batch, Lq > Lk, a single key
  c.group = 16;
  run_case(c);
  c.integer_values = true;
  c.topk = 64;  // far above the visible blocks
  run_case(c);
}

TEST(IndexerGpu, RejectsWhatItDoesNotSupport) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  DeviceBuffer buf(1 << 16);
  BlockScoresArgs a;
  a.q = Tensor(buf.get(), DType::bf16, {4, 2, 64}, gpu0());
  a.kv.k = Tensor(buf.get(), DType::bf16, {4, 1, 64}, gpu0());
  DeviceBuffer cu(8);
  cu.upload(std::vector<int32_t>{0, 4}, stream);
  a.cu_seqlens_q = Tensor(cu.get(), DType::i32, {2}, gpu0());
  a.kv.cu_seqlens_k = a.cu_seqlens_q;
  a.scores = Tensor(buf.get(), DType::f32, {2, 1, 4}, gpu0());
  a.status = Tensor(buf.get(), DType::i32, {4}, gpu0());
  EXPECT_THROW(
      {
        try {
          block_scores(a, stream);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("head_dim must be 128 on CUDA, got 64"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace msa::test
