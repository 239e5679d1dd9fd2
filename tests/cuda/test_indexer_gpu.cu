// GPU indexer (src/cuda/sm90/block_scores) against the CPU reference: block scores within 1e-3
// relative with identical -inf positions on random bf16/f16 inputs; the fused top-K equal to
// select_topk on the same scores (fused == unfused) and, on integer-valued inputs whose dot
// products are exact, identical ids to the CPU reference, exact ties included. Paged K (page
// sizes 16-256, both pool layouts, NaN in every unused slot): the same checks, plus paged ==
// flat bitwise on the same logical K, and device-reported bad page ids / lengths. Blocks of 128
// keys and of 64 (IndexerGpu.Blk64*: two blocks per 128-key K tile of the kernel), whose scores
// tensors are also sized to exactly the largest block count (an odd one: a last tile's second
// block lies past it).
// MSA_TEST_SMALL=1 shortens the sweeps (compute-sanitizer runs).
#include <climits>
#include <limits>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "common/codecs.h"
#include "support/fp4_preorder.h"
#include "support/host_tensor.h"
#include "support/sparse_case.h"

namespace msa::test {
namespace {

struct IdxCase {
  std::vector<int32_t> lq, lk;
  int64_t hkv = 2, group = 4;
  bool causal = true;
  bool integer_values = false;  // q, k in {-2..2}: exact dot products, many ties
  DType dtype = DType::bf16;     // bf16 | f16 | fp8_e4m3 | fp4x2
  bool nvfp4 = true;             // fp4x2: NVFP4 (e4m3 scales per 16, global scales) or MXFP4
  int q_scale_kind = 0, k_scale_kind = 0;  // fp8: 0 none, 1 per tensor, 2 per token, 3 per token-head
  int topk = 8, sink = 1, local = 1;
  unsigned seed = 1;
  int blk = 128;            // kv_block_size: 128 or 64
  bool spare_block = true;  // the scores get a block past every batch (must stay -inf); false:
                            // nblk_max is exactly the largest block count
  int64_t lists = 1;        // q2k rows (selection heads) per kv head: each groups group / lists
                            // query heads (MiniMax-M3: 4 index heads on 1 key head, 4 rows)
  int64_t dim = 128;        // head dim: 64 (bf16 / f16) and 256 (FP8) besides 128
};

constexpr int64_t kD = 128;

HostTensor random_tokens(int64_t tokens, int64_t heads, DType dt, bool integer, std::mt19937& rng,
                         int64_t dim = kD) {
  HostTensor t(dt, {tokens, heads, dim});
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < tokens * heads * dim; ++i) {
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

// FP4 tokens: random packed e2m1 values (every code, signs and zeros included) and their block
// scales, [tokens, heads, 64] and [tokens, heads, 8] e4m3 (NVFP4) or [.., 4] e8m0 (MXFP4).
// Scales 2^-3 .. 2^3 (NVFP4 any mantissa), or, when `exact`, 2^-1 .. 2^1 with no mantissa: then
// every dot product (at most 128 * 144 in steps of 2^-4, 19 bits) is exact in fp32 too.
struct Fp4Tokens {
  HostTensor values, scale;
};
Fp4Tokens random_fp4(int64_t tokens, int64_t heads, bool nvfp4, bool exact, std::mt19937& rng) {
  const int64_t groups = nvfp4 ? kD / 16 : kD / 32;
  Fp4Tokens t{HostTensor(DType::fp4x2, {tokens, heads, kD / 2}),
              HostTensor(nvfp4 ? DType::fp8_e4m3 : DType::e8m0, {tokens, heads, groups})};
  for (int64_t i = 0; i < t.values.t.numel(); ++i) t.values.data<uint8_t>()[i] = uint8_t(rng());
  for (int64_t i = 0; i < t.scale.t.numel(); ++i) {
    const int e = exact ? int(rng() % 3) - 1 : int(rng() % 7) - 3;
    t.scale.data<uint8_t>()[i] =
        nvfp4 ? uint8_t(((e + 7) << 3) | (exact ? 0 : rng() % 8)) : uint8_t(127 + e);
  }
  return t;
}

// Runs `op` (block_scores or block_topk, device inputs in `args`) with its output `out` in a
// poisoned device buffer shaped like `like`, on a fresh status; throws msa::Error for an offence
// the device reported. Returns the output.
template <typename T, typename Args>
std::vector<T> run_gpu(void (*op)(const Args&, cudaStream_t), Args args, Tensor Args::*out,
                       const HostTensor& like, cudaStream_t s) {
  DeviceBuffer buf(like.bytes() + 16);
  args.*out = like.t;
  (args.*out).data = buf.get();
  (args.*out).device = gpu0();
  clear_status(args.status, s);
  buf.poison(s);
  op(args, s);
  check_status(args.status, s);
  return buf.download<T>(size_t(like.t.numel()), s);
}

std::vector<float> gpu_scores(const BlockScoresArgs& g, const HostTensor& like, cudaStream_t s) {
  return run_gpu<float>(&block_scores, g, &BlockScoresArgs::scores, like, s);
}

// The fused call on block_scores' inputs.
BlockTopKArgs topk_args(const BlockScoresArgs& g, int topk, int sink = 1, int local = 1) {
  return BlockTopKArgs{.q = g.q, .kv = g.kv, .cu_seqlens_q = g.cu_seqlens_q, .causal = g.causal,
                       .kv_block_size = g.kv_block_size, .topk = topk, .sink_blocks = sink,
                       .local_blocks = local, .q2k = Tensor(), .status = g.status};
}

// GPU scores against the CPU's: no NaN (or unwritten entry), -inf at the same positions,
// relative L2 within 1e-3, and bit-exact when `exact` (integer-valued inputs).
void expect_scores_match(const std::vector<float>& got, const HostTensor& ref, bool exact) {
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
  if (exact) EXPECT_EQ(0, std::memcmp(got.data(), ref.data<float>(), got.size() * 4)) << "exact scores differ";
}

// Fused ids (f, on the device) against select_topk on the GPU's own scores `got` [Hq, nblk,
// total_q] (host, flat key lengths cu_k): they must be identical. Returns the fused ids.
std::vector<int32_t> expect_fused_matches_unfused(const BlockTopKArgs& f, const std::vector<float>& got,
                                                  int64_t hq, int64_t nblk, const HostTensor& cu_q,
                                                  const HostTensor& cu_k, int64_t hkv, cudaStream_t s) {
  const int64_t total_q = cu_q.data<int32_t>()[cu_q.t.numel() - 1];
  HostTensor gpu_scores_h(DType::f32, {hq, nblk, total_q});
  std::memcpy(gpu_scores_h.data<float>(), got.data(), got.size() * 4);
  HostTensor want(DType::i32, {hkv, total_q, f.topk});
  KVCache lengths;
  lengths.cu_seqlens_k = cu_k.t;
  select_topk(TopKArgs{.scores = gpu_scores_h.t, .cu_seqlens_q = cu_q.t, .kv = lengths,
                       .num_kv_heads = int(hkv), .topk = f.topk, .sink_blocks = f.sink_blocks,
                       .local_blocks = f.local_blocks, .causal = f.causal,
                       .kv_block_size = f.kv_block_size, .q2k = want.t});
  const auto ids = run_gpu<int32_t>(&block_topk, f, &BlockTopKArgs::q2k, want, s);
  int64_t mismatch = 0;
  for (int64_t i = 0; i < want.t.numel(); ++i)
    if (ids[i] != want.data<int32_t>()[i] && mismatch++ < 5)
      ADD_FAILURE() << "fused id " << i << ": " << ids[i] << " vs unfused " << want.data<int32_t>()[i];
  EXPECT_EQ(mismatch, 0);
  return ids;
}

void run_case(const IdxCase& c) {
  std::mt19937 rng(c.seed);
  const int64_t total_q = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  const int64_t total_k = std::accumulate(c.lk.begin(), c.lk.end(), int64_t(0));
  const int64_t hq = c.hkv * c.group;
  int64_t nblk = 1;
  for (int32_t k : c.lk) nblk = std::max<int64_t>(nblk, (k + c.blk - 1) / c.blk);
  if (c.spare_block) nblk += 1;  // a column past every batch: must be -inf everywhere
  const bool fp4 = c.dtype == DType::fp4x2;
  std::optional<Fp4Tokens> fq, fk;
  if (fp4) {
    fq = random_fp4(total_q, hq, c.nvfp4, c.integer_values, rng);
    fk = random_fp4(total_k, c.hkv, c.nvfp4, c.integer_values, rng);
  }
  const HostTensor q = fp4 ? std::move(fq->values)
                           : random_tokens(total_q, hq, c.dtype, c.integer_values, rng, c.dim);
  const HostTensor k = fp4 ? std::move(fk->values)
                           : random_tokens(total_k, c.hkv, c.dtype, c.integer_values, rng, c.dim);
  const auto q_scale = fp4 ? std::optional<HostTensor>(std::move(fq->scale))
                           : random_scale(c.q_scale_kind, total_q, hq, c.integer_values, rng);
  const auto k_scale = fp4 ? std::optional<HostTensor>(std::move(fk->scale))
                           : random_scale(c.k_scale_kind, total_k, c.hkv, c.integer_values, rng);
  // NVFP4 global scales: powers of two when exact
  const float q_global = fp4 && c.nvfp4 ? (c.integer_values ? 0.5f : 0.37f) : 1.f;
  const float k_global = fp4 && c.nvfp4 ? (c.integer_values ? 4.f : 1.7f) : 1.f;
  const HostTensor cu_q = i32_tensor(cumulative(c.lq)), cu_k = i32_tensor(cumulative(c.lk));

  // CPU reference: scores and ids.
  HostTensor ref(DType::f32, {hq, nblk, total_q});
  BlockScoresArgs a;
  a.q = q_scale ? QTensor(q.t, q_scale->t, q_global) : QTensor(q.t);
  a.kv.k = k_scale ? QTensor(k.t, k_scale->t, k_global) : QTensor(k.t);
  a.kv.cu_seqlens_k = cu_k.t;
  a.cu_seqlens_q = cu_q.t;
  a.scores = ref.t;
  a.causal = c.causal;
  a.kv_block_size = c.blk;
  block_scores(a);

  TestStream stream;
  const DeviceQTensor dq = to_device(q, q_scale, stream), dk = to_device(k, k_scale, stream);
  const DeviceTensor dcq = to_device(cu_q, stream), dck = to_device(cu_k, stream);
  DeviceBuffer dst(16);
  BlockScoresArgs g = a;
  g.q = dq.view();
  g.kv.k = dk.view();
  g.q.global_scale = q_global;
  g.kv.k.global_scale = k_global;
  g.kv.cu_seqlens_k = dck.t;
  g.cu_seqlens_q = dcq.t;
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  const auto got = gpu_scores(g, ref, stream);
  expect_scores_match(got, ref, c.integer_values);

  // Fused top-K vs select_topk on the GPU's own scores (exact), and vs the CPU ids when exact.
  const int64_t rows = c.hkv * c.lists;
  const BlockTopKArgs f = topk_args(g, c.topk, c.sink, c.local);
  const auto ids = expect_fused_matches_unfused(f, got, hq, nblk, cu_q, cu_k, rows, stream);

  if (c.integer_values) {  // scores are exact, so the CPU's own fused path must agree too
    HostTensor cpu_ids(DType::i32, {rows, total_q, c.topk});
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

// Random varlen batches, every G, bf16 and f16, causal or not, integer-valued (exact: the CPU's
// ids too) or normal inputs. 64-key blocks (fresh seeds): every other case's scores sized
// exactly to the largest block count.
void random_varlen_sweep(int blk) {
  std::mt19937 rng(blk == 128 ? 5 : 6);
  const int64_t groups[] = {1, 2, 4, 8, 16};
  const int trials = small_tests() ? 5 : 15;
  for (int trial = 0; trial < trials; ++trial) {
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
    c.seed = (blk == 128 ? 200 : 1200) + trial;
    c.blk = blk;
    c.spare_block = blk == 128 || trial % 2 == 0;
    SCOPED_TRACE("blk " + std::to_string(blk) + " trial " + std::to_string(trial));
    run_case(c);
  }
}

TEST(IndexerGpu, RandomVarlenSweep) {
  MSA_REQUIRE_GPU();
  random_varlen_sweep(128);
}

TEST(IndexerGpu, Blk64RandomVarlenSweep) {
  MSA_REQUIRE_GPU();
  random_varlen_sweep(64);
}

// Head dims besides 128 (traits.h kHeadDimOk: bf16 / f16 at 64, FP8 e4m3 at 256 with each key
// scale kind): random varlen batches, both block sizes, every G, causal or not, integer-valued
// (exact: the CPU's ids too) or normal inputs, a list per index head; scores against the CPU and
// the fused ids against select_topk on the GPU's scores.
TEST(IndexerGpu, HeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(64256);
  const int64_t groups[] = {1, 2, 4, 8, 16};
  const int trials = small_tests() ? 6 : 16;
  for (int trial = 0; trial < trials; ++trial) {
    IdxCase c;
    const int b = 1 + int(rng() % 3);
    for (int i = 0; i < b; ++i) {
      c.lq.push_back(int32_t(rng() % 300));
      c.lk.push_back(int32_t(c.lq.back() + rng() % 700));
    }
    const bool fp8 = trial % 2 == 1;
    c.dim = fp8 ? 256 : 64;
    c.dtype = fp8 ? DType::fp8_e4m3 : trial % 4 == 2 ? DType::f16 : DType::bf16;
    if (fp8) {
      c.q_scale_kind = 2;
      c.k_scale_kind = 1 + (trial / 2) % 3;
    }
    c.group = groups[trial % 5];
    c.hkv = 1 + trial % 2;
    c.causal = trial % 3 != 2;
    c.integer_values = trial % 4 < 2;
    c.topk = 1 + int(rng() % 20);
    c.sink = c.topk >= 2 ? 1 : 0;
    c.local = c.topk >= 2 ? 1 : 0;
    c.blk = trial % 3 == 1 ? 64 : 128;
    c.lists = c.group >= 4 && trial % 5 == 4 ? 4 : 1;
    if (c.lists > 1) c.topk = std::min(c.topk, 16);
    c.seed = 6400 + trial;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": D " + std::to_string(c.dim) + " " +
                 dtype_name(c.dtype) + " G " + std::to_string(c.group) + " blk " + std::to_string(c.blk));
    run_case(c);
    if (::testing::Test::HasFailure()) break;
  }
}

// Decode-shaped batches: many requests of 0-2 queries over up to ~3000 keys, so that a token
// tile holds dozens of batches and launch.cu shares them among CTAs (segment groups; unfused,
// also item splits). Every G, one list a token or one per head, FP8 and bf16, causal or not.
void decode_batches(int blk) {
  std::mt19937 rng(blk == 128 ? 7 : 8);
  const int64_t groups[] = {4, 16, 1, 8, 2};
  const int trials = small_tests() ? 3 : 10;
  for (int trial = 0; trial < trials; ++trial) {
    IdxCase c;
    const int b = trial % 3 == 0 ? 150 : 40 + int(rng() % 40);
    for (int i = 0; i < b; ++i) {
      c.lq.push_back(int32_t(rng() % 8 == 0 ? rng() % 3 : 1));
      c.lk.push_back(int32_t(c.lq.back() + rng() % (small_tests() ? 600 : 3000)));
    }
    c.group = groups[trial % 5];
    c.lists = trial % 2 == 1 && c.group >= 2 ? c.group : 1;
    c.hkv = 1 + trial % 2;
    c.causal = trial % 4 != 3;
    c.integer_values = trial % 2 == 0;
    c.dtype = trial % 3 == 1 ? DType::bf16 : DType::fp8_e4m3;
    if (c.dtype == DType::fp8_e4m3) c.k_scale_kind = 2;
    c.topk = 1 + int(rng() % 12);
    c.sink = c.topk >= 2 ? 1 : 0;
    c.local = c.topk >= 2 ? 1 : 0;
    c.seed = (blk == 128 ? 3100 : 3200) + trial;
    c.blk = blk;
    SCOPED_TRACE("blk " + std::to_string(blk) + " trial " + std::to_string(trial) + " batches " +
                 std::to_string(b) + " G " + std::to_string(c.group) + " lists " + std::to_string(c.lists));
    run_case(c);
  }
}

TEST(IndexerGpu, DecodeBatchesMatchCpu) {
  MSA_REQUIRE_GPU();
  decode_batches(128);
}

TEST(IndexerGpu, Blk64DecodeBatchesMatchCpu) {
  MSA_REQUIRE_GPU();
  decode_batches(64);
}

// FP8 q and K with every pair of scale kinds (none, per tensor, per token, per token and head).
void fp8_each_scale_kind(int blk) {
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
      c.seed = (blk == 128 ? 300 : 1300) + trial;
      c.blk = blk;
      c.spare_block = blk == 128 || trial % 3 != 1;
      SCOPED_TRACE("fp8 q scale kind " + std::to_string(qk) + ", k scale kind " + std::to_string(kk));
      run_case(c);
    }
}

TEST(IndexerGpu, Fp8EachScaleKind) {
  MSA_REQUIRE_GPU();
  fp8_each_scale_kind(128);
}

TEST(IndexerGpu, Blk64Fp8EachScaleKind) {
  MSA_REQUIRE_GPU();
  fp8_each_scale_kind(64);
}

// FP4 q and K (fp4.cuh: converted to bf16 in shared memory, exact), NVFP4 with global scales and
// MXFP4, every GQA group, causal or not, varlen with empty batches: scores against the CPU's and,
// on exact inputs, bitwise with the CPU's ids.
void fp4_matches_cpu(int blk) {
  const int64_t groups[] = {16, 4, 1, 8, 2};
  const int trials = small_tests() ? 4 : 12;
  for (int trial = 0; trial < trials; ++trial) {
    IdxCase c;
    c.lq = {int32_t(37 + 60 * (trial % 4)), int32_t(trial % 5 == 0 ? 0 : 190), int32_t(1 + trial)};
    c.lk = {int32_t(c.lq[0] + 250), int32_t(c.lq[1] + 400 + 17 * trial), int32_t(c.lq[2] + 3)};
    c.dtype = DType::fp4x2;
    c.nvfp4 = trial % 2 == 0;
    c.group = groups[trial % 5];
    c.hkv = 1 + trial % 2;
    c.integer_values = trial % 3 != 2;
    c.causal = trial % 4 != 3;
    c.topk = 1 + trial % 9;
    c.sink = c.topk >= 2 ? 1 : 0;
    c.local = c.topk >= 2 ? 1 : 0;
    c.seed = (blk == 128 ? 700 : 1700) + trial;
    c.blk = blk;
    c.spare_block = blk == 128 || trial % 2 == 1;
    SCOPED_TRACE(std::string(c.nvfp4 ? "NVFP4" : "MXFP4") + " trial " + std::to_string(trial));
    run_case(c);
  }
}

TEST(IndexerGpu, Fp4MatchesCpu) {
  MSA_REQUIRE_GPU();
  fp4_matches_cpu(128);
}

TEST(IndexerGpu, Blk64Fp4MatchesCpu) {
  MSA_REQUIRE_GPU();
  fp4_matches_cpu(64);
}

// FP4 keys in page pools (both layouts, pages of 128 and 64, the pool scales in the values'
// layout, every unused slot 0xff: NaN scales, -6 values) and scales in the preordered layout (q, K
// or both; 128-slot pools): scores bitwise equal to the same keys in a flat cache with public
// scales on the GPU, which match the CPU's; the fused ids too. Blocks of 128 keys and of 64.
struct Fp4Pool {
  HostTensor values, scale, page_table;
};
// The flat k rows [total_k, Hkv, 64] and their scales [total_k, Hkv, G] of batches `lk` in a pool
// of `page`-slot pages, pages of each batch in reverse order after one spare page.
Fp4Pool fp4_pool(const Fp4Tokens& k, const std::vector<int32_t>& lk, int64_t page, bool hnd) {
  const int64_t hkv = k.values.t.shape[1], groups = k.scale.t.shape[2];
  int64_t pages = 1, max_pages = 1;
  for (const int32_t l : lk) pages += (l + page - 1) / page, max_pages = std::max<int64_t>(max_pages, (l + page - 1) / page);
  auto shape = [&](int64_t last) {
    return hnd ? std::vector<int64_t>{pages, hkv, page, last} : std::vector<int64_t>{pages, page, hkv, last};
  };
  Fp4Pool p{HostTensor(DType::fp4x2, shape(kD / 2)), HostTensor(k.scale.t.dtype, shape(groups)),
            HostTensor(DType::i32, {int64_t(lk.size()), max_pages})};  // all 0xff until written
  int64_t next = 1, k0 = 0;
  for (size_t b = 0; b < lk.size(); ++b) {
    const int64_t np = (lk[b] + page - 1) / page;
    for (int64_t c = 0; c < np; ++c) p.page_table.data<int32_t>()[b * max_pages + c] = int32_t(next + np - 1 - c);
    for (int64_t j = 0; j < lk[b]; ++j)
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t pg = p.page_table.data<int32_t>()[b * max_pages + j / page], slot = j % page;
        const int64_t vo = hnd ? p.values.offset({pg, h, slot, 0}) : p.values.offset({pg, slot, h, 0});
        const int64_t so = hnd ? p.scale.offset({pg, h, slot, 0}) : p.scale.offset({pg, slot, h, 0});
        std::memcpy(p.values.data<uint8_t>() + vo, k.values.data<uint8_t>() + k.values.offset({k0 + j, h, 0}), kD / 2);
        std::memcpy(p.scale.data<uint8_t>() + so, k.scale.data<uint8_t>() + k.scale.offset({k0 + j, h, 0}), size_t(groups));
      }
    next += np;
    k0 += lk[b];
  }
  return p;
}

void fp4_paged_and_preordered_match_flat(int blk) {
  for (const bool nv : {true, false}) {
    std::mt19937 rng((nv ? 41 : 42) + (blk == 128 ? 0 : 100));
    const std::vector<int32_t> lq = {150, 0, 37}, lk = {700, 90, 300};
    // ceil(700 / blk) blocks and a spare one
    const int64_t hkv = 2, hq = 16, total_q = 187, total_k = 1090, nblk = blk == 128 ? 7 : 12;
    const Fp4Tokens q = random_fp4(total_q, hq, nv, false, rng), k = random_fp4(total_k, hkv, nv, false, rng);
    const float qg = nv ? 0.37f : 1.f, kg = nv ? 1.7f : 1.f;
    const HostTensor cu_q = i32_tensor(cumulative(lq)), cu_k = i32_tensor(cumulative(lk));
    TestStream stream;
    const DeviceTensor dq = to_device(q.values, stream), dqs = to_device(q.scale, stream);
    const DeviceTensor dk = to_device(k.values, stream), dks = to_device(k.scale, stream);
    const DeviceTensor dcq = to_device(cu_q, stream), dck = to_device(cu_k, stream);
    DeviceBuffer dst(16);
    HostTensor ref(DType::f32, {hq, nblk, total_q});
    BlockScoresArgs a;
    a.q = QTensor(q.values.t, q.scale.t, qg);
    a.kv.k = QTensor(k.values.t, k.scale.t, kg);
    a.kv.cu_seqlens_k = cu_k.t;
    a.cu_seqlens_q = cu_q.t;
    a.scores = ref.t;
    a.kv_block_size = blk;
    block_scores(a);  // CPU
    BlockScoresArgs g = a;
    g.q = QTensor(dq.t, dqs.t, qg);
    g.kv.k = QTensor(dk.t, dks.t, kg);
    g.kv.cu_seqlens_k = dck.t;
    g.cu_seqlens_q = dcq.t;
    g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
    const auto flat = gpu_scores(g, ref, stream);
    SCOPED_TRACE(nv ? "NVFP4" : "MXFP4");
    expect_scores_match(flat, ref, false);
    const BlockTopKArgs f = topk_args(g, 5);
    const auto flat_ids = expect_fused_matches_unfused(f, flat, hq, nblk, cu_q, cu_k, hkv, stream);

    // The same K paged, and q / K scales preordered: the GPU's bits must not move.
    auto expect_same = [&](const BlockScoresArgs& v, const std::string& what) {
      SCOPED_TRACE(what);
      const auto got = gpu_scores(v, ref, stream);
      EXPECT_EQ(0, std::memcmp(got.data(), flat.data(), flat.size() * 4)) << "scores differ from flat";
      const auto ids = run_gpu<int32_t>(&block_topk, topk_args(v, 5), &BlockTopKArgs::q2k,
                                        HostTensor(DType::i32, {hkv, total_q, 5}), stream);
      EXPECT_EQ(ids, flat_ids) << "fused ids differ from flat";
    };
    const HostTensor qpre = preorder(q.scale, KVLayout::flat);
    const DeviceTensor dqpre = to_device(qpre, stream);
    BlockScoresArgs v = g;
    v.q = QTensor(dq.t, dqpre.t, qg);
    expect_same(v, "q scales preordered");
    const HostTensor kpre_flat = preorder(k.scale, KVLayout::flat);
    const DeviceTensor dkpre_flat = to_device(kpre_flat, stream);
    v.kv.k = QTensor(dk.t, dkpre_flat.t, kg);
    expect_same(v, "q and flat K scales preordered");
    for (const int64_t page : {128, 64})
      for (const bool hnd : {false, true}) {
        const Fp4Pool pool = fp4_pool(k, lk, page, hnd);
        const DeviceTensor dpv = to_device(pool.values, stream), dps = to_device(pool.scale, stream);
        const DeviceTensor dpt = to_device(pool.page_table, stream);
        const HostTensor used = i32_tensor(lk);
        const DeviceTensor du = to_device(used, stream);
        BlockScoresArgs pg = g;
        pg.kv = KVCache{};
        pg.kv.layout = hnd ? KVLayout::paged_hnd : KVLayout::paged_nhd;
        pg.kv.k = QTensor(dpv.t, dps.t, kg);
        pg.kv.page_table = dpt.t;
        pg.kv.seqused_k = du.t;
        const std::string where = std::string(hnd ? "hnd" : "nhd") + " pages of " + std::to_string(page);
        expect_same(pg, where);
        if (page != 128) continue;
        const HostTensor kpre = preorder(pool.scale, pg.kv.layout);
        const DeviceTensor dkpre = to_device(kpre, stream);
        pg.kv.k = QTensor(dpv.t, dkpre.t, kg);
        pg.q = v.q;  // preordered q scales too
        expect_same(pg, where + ", q and pool scales preordered");
      }
  }
}

TEST(IndexerGpu, Fp4PagedAndPreorderedMatchFlat) {
  MSA_REQUIRE_GPU();
  fp4_paged_and_preordered_match_flat(128);
}

TEST(IndexerGpu, Blk64Fp4PagedAndPreorderedMatchFlat) {
  MSA_REQUIRE_GPU();
  fp4_paged_and_preordered_match_flat(64);
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

// 64-key blocks at the edges of a 128-key tile: key counts 1, 63, 64, 65, 127, 128, 129 and
// 191 (a last tile with one block or two, its second block wholly invisible or partly visible),
// Lq > Lk (queries that see no key, a tile whose first block is the last visible one under the
// causal limit), an empty batch each way; every G, causal or not, the scores sized exactly (odd
// and even largest block counts) or with a spare block; exact (integer-valued) cases compare the
// ids with the CPU's, topk 64 far above the visible blocks included.
TEST(IndexerGpu, Blk64EdgeShapes) {
  MSA_REQUIRE_GPU();
  const std::vector<std::vector<int32_t>> lqs = {{1, 63, 64, 65}, {127, 0, 128, 300}, {5, 129, 191, 3}};
  const std::vector<std::vector<int32_t>> lks = {{1, 63, 64, 65}, {127, 40, 128, 129}, {200, 129, 191, 0}};
  const int64_t groups[] = {1, 2, 4, 8, 16};
  int trial = 0;
  for (size_t i = 0; i < lqs.size(); ++i)
    for (const bool causal : {true, false})
      for (const bool spare : {false, true}) {
        IdxCase c;
        c.lq = lqs[i];
        c.lk = lks[i];
        c.blk = 64;
        c.spare_block = spare;
        c.causal = causal;
        c.group = groups[trial % 5];
        c.hkv = 1 + trial % 2;
        c.integer_values = trial % 2 == 0;
        c.topk = trial % 3 == 0 ? 64 : 1 + trial % 5;
        c.sink = c.topk >= 2 ? 1 : 0;
        c.local = c.topk >= 2 ? 1 : 0;
        c.dtype = trial % 4 == 1 ? DType::f16 : DType::bf16;
        c.seed = 1900 + trial++;
        SCOPED_TRACE("lengths " + std::to_string(i) + (causal ? " causal" : " non-causal") +
                     (spare ? " spare block" : " exact nblk"));
        run_case(c);
      }
}

// The -inf tail past each segment's blocks (fill_tail) with 16-byte stores (every row start
// aligned: total_q % 4 == 0, segments starting at multiples of 4) and with 4-byte ones, for
// 16-, 32- and 64-token tiles (G 16, 8, 4), blocks of 128 and 64 keys.
TEST(IndexerGpu, TailFillAlignedAndNot) {
  MSA_REQUIRE_GPU();
  const std::vector<std::vector<int32_t>> lqs = {{256, 512}, {257, 510}, {64, 4, 188}};
  for (const int blk : {128, 64})
    for (const int64_t group : {16, 8, 4})
      for (const auto& lq : lqs) {
        IdxCase c;
        c.lq = lq;
        for (const int32_t l : lq) c.lk.push_back(l + 200);
        c.group = group;
        c.hkv = 1;
        c.blk = blk;
        SCOPED_TRACE("blk " + std::to_string(blk) + " G " + std::to_string(group) + " first batch " +
                     std::to_string(lq[0]));
        run_case(c);
      }
}

// Selection heads other than k's heads (q2k rows a multiple of them): each token keeps a list
// per group of group / lists heads, up to 256 lists a CTA sharing the fused kernel's keys (16 a
// list then), e.g. MiniMax-M3's 4 index heads on 1 key head selecting for 4 kv heads. Every G
// with every list count, bf16 / f16 / FP8 (per-token and per-token-and-head scales, so each
// head's list sees its own scaled scores), 128- and 64-key blocks, causal or not, varlen with an
// empty batch, topk up to the list's size plus the forced blocks (ties: integer values).
void lists_per_head(int blk) {
  std::mt19937 rng(blk == 128 ? 41 : 42);
  int trial = 0;
  for (const int64_t group : {1, 2, 4, 8, 16})
    for (int64_t lists = 2; lists <= group; lists *= 2) {
      if (small_tests() && (trial / 2) % 2 == 1) {  // trials 0, 1, 4, 5, 8, 9 under the sanitizers
        ++trial;
        continue;
      }
      IdxCase c;
      c.lq = {int32_t(1 + rng() % 300), 0, int32_t(64 + rng() % 200)};
      c.lk = {int32_t(c.lq[0] + rng() % 900), int32_t(rng() % 300), int32_t(c.lq[2] + 1100)};
      c.group = group;
      c.lists = lists;
      c.hkv = 1 + trial % 2;
      c.blk = blk;
      c.causal = trial % 3 != 2;
      c.integer_values = trial % 2 == 0;
      c.dtype = trial % 3 == 0 ? DType::fp8_e4m3 : trial % 3 == 1 ? DType::bf16 : DType::f16;
      if (c.dtype == DType::fp8_e4m3) {
        c.q_scale_kind = 3;
        c.k_scale_kind = trial % 2 == 0 ? 2 : 3;
      }
      // The list size: 4096 keys over the CTA's lists (64 R / G tokens, `lists` each).
      const int64_t cap = std::min<int64_t>(64, 4096 / (std::min<int64_t>(group, 4) * 64 / group * lists));
      c.sink = 1;
      c.local = trial % 4 == 3 ? 0 : 1;
      // At most 64: the unfused select_topk it is compared with takes no more on CUDA.
      c.topk = int(trial % 2 == 0 ? std::min<int64_t>(64, cap + c.sink + c.local) : 1 + rng() % cap);
      c.seed = (blk == 128 ? 2100 : 2200) + trial++;
      SCOPED_TRACE("blk " + std::to_string(blk) + " G " + std::to_string(group) + " lists " +
                   std::to_string(lists) + " topk " + std::to_string(c.topk));
      run_case(c);
    }
}

TEST(IndexerGpu, ListsPerHeadMatchUnfused) {
  MSA_REQUIRE_GPU();
  lists_per_head(128);
}

TEST(IndexerGpu, Blk64ListsPerHeadMatchUnfused) {
  MSA_REQUIRE_GPU();
  lists_per_head(64);
}

// Selection heads the fused kernel cannot serve are refused by name, before any launch: rows that
// do not split k's heads (2 rows on 4 key heads: each would span two CTAs), and picks past a
// list's share of the keys (256 lists of 16: topk 19 with one sink and one local block).
TEST(IndexerGpu, ListsItCannotFuseAreRefused) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  const int64_t tq = 8, tk = 256;
  DeviceBuffer dq(size_t(tq) * 16 * kD * 2), dk(size_t(tk) * 4 * kD * 2), dcu(16), dq2k(1 << 16), dst(16);
  dcu.upload(std::vector<int32_t>{0, int32_t(tq)}, stream);
  DeviceBuffer dcuk(16);
  dcuk.upload(std::vector<int32_t>{0, int32_t(tk)}, stream);
  BlockTopKArgs f;
  f.cu_seqlens_q = Tensor(dcu.get(), DType::i32, {2}, gpu0());
  f.kv.cu_seqlens_k = Tensor(dcuk.get(), DType::i32, {2}, gpu0());
  f.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  const auto expect_refusal = [&](int64_t hq, int64_t hkv, int64_t rows, int topk, const char* what) {
    f.q = Tensor(dq.get(), DType::bf16, {tq, hq, kD}, gpu0());
    f.kv.k = Tensor(dk.get(), DType::bf16, {tk, hkv, kD}, gpu0());
    f.topk = topk;
    f.q2k = Tensor(dq2k.get(), DType::i32, {rows, tq, int64_t(topk)}, gpu0());
    try {
      block_topk(f, stream);
      ADD_FAILURE() << "no error for " << rows << " rows on " << hkv << " key heads, topk " << topk;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_refusal(16, 4, 2, 4, "fused on CUDA only when they split each of k's heads");
  expect_refusal(4, 1, 4, 19, "keep at most 16 picks a row besides the forced blocks");
  expect_refusal(16, 1, 16, 19, "keep at most 16 picks a row besides the forced blocks");
  // At the cap itself the call runs.
  f.q = Tensor(dq.get(), DType::bf16, {tq, 4, kD}, gpu0());
  f.kv.k = Tensor(dk.get(), DType::bf16, {tk, 1, kD}, gpu0());
  f.topk = 18;
  f.q2k = Tensor(dq2k.get(), DType::i32, {4, tq, 18}, gpu0());
  dq.poison(stream);  // NaN inputs: the ids are then those of equal (NaN) scores, not checked here
  clear_status(f.status, stream);
  EXPECT_NO_THROW(block_topk(f, stream));
  check_status(f.status, stream);
}

TEST(IndexerGpu, RejectsWhatItDoesNotSupport) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  DeviceBuffer buf(1 << 16);
  BlockScoresArgs a;
  a.q = Tensor(buf.get(), DType::bf16, {4, 2, 96}, gpu0());
  a.kv.k = Tensor(buf.get(), DType::bf16, {4, 1, 96}, gpu0());
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
          EXPECT_NE(std::string(e.what()).find("head_dim must be 128 on CUDA (or 64 with bf16 / "
                                               "f16 inputs, 256 with fp8_e4m3), got 96 with bf16"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  // 16-bit inputs at 256 and FP8 at 64 are refused too (traits.h kHeadDimOk).
  for (const auto& [dt, dim] : {std::pair{DType::bf16, int64_t(256)}, std::pair{DType::fp8_e4m3, int64_t(64)}}) {
    a.q = Tensor(buf.get(), dt, {4, 2, dim}, gpu0());
    a.kv.k = Tensor(buf.get(), dt, {4, 1, dim}, gpu0());
    try {
      block_scores(a, stream);
      ADD_FAILURE() << "no error for head dim " << dim << " with " << dtype_name(dt);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(dim) + " with " + dtype_name(dt)),
                std::string::npos)
          << e.what();
    }
  }
}

// ---- Paged K (docs/semantics.md, Paged KV) ----

// A page pool holding a flat k [total_k, Hkv, D] (copy_row: bit-exact), pages shuffled, 2 spare
// pages, one spare page-table column per request. Every slot no key occupies stays NaN (the
// HostTensor poison). Spare columns hold ids no kernel may read: INT_MIN, or another request's
// page (attending it would change the scores).
// FP8 key scales per token (and head), k_scale given, move to the pool's slots (page * page_size
// + slot); the slots without a key get NaN.
struct PagedK {
  HostTensor pool, page_table, seqused_k;
  std::optional<HostTensor> slot_scale;
};

PagedK make_paged_k(const HostTensor& k, const std::vector<int32_t>& lk, KVLayout layout,
                    int64_t page_size, int64_t row_pad, std::mt19937& rng,
                    const HostTensor* k_scale = nullptr) {
  const int64_t batch = int64_t(lk.size()), hkv = k.t.shape[1];
  int64_t max_pages = 1, used = 0;
  for (int32_t l : lk) {
    max_pages = std::max<int64_t>(max_pages, (l + page_size - 1) / page_size + 1);
    used += (l + page_size - 1) / page_size;
  }
  const int64_t pages = used + 2;
  std::vector<int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  PagedK out{make_pool(k.t.dtype, layout, pages, page_size, hkv, k.t.shape[2], row_pad),
             HostTensor(DType::i32, {batch, max_pages}), i32_tensor(lk)};
  const int64_t per_slot = k_scale && k_scale->t.numel() > 1 ? (k_scale->t.ndim == 2 ? hkv : 1) : 0;
  if (per_slot) {
    std::vector<int64_t> shape{pages * page_size};
    if (k_scale->t.ndim == 2) shape.push_back(hkv);
    out.slot_scale.emplace(DType::f32, shape);
    std::fill(out.slot_scale->data<float>(), out.slot_scale->data<float>() + out.slot_scale->t.numel(),
              std::numeric_limits<float>::quiet_NaN());
  }
  int64_t next = 0, k0 = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = out.page_table.data<int32_t>() + b * max_pages;
    const int64_t n = (lk[b] + page_size - 1) / page_size;
    for (int64_t col = 0; col < max_pages; ++col)
      row[col] = col < n ? order[next++] : col % 2 ? order[(b + col) % pages] : INT_MIN;
    for (int64_t j = 0; j < lk[b]; ++j) {
      for (int64_t h = 0; h < hkv; ++h)
        copy_row(k, k0 + j, h, out.pool, layout, row[j / page_size], j % page_size);
      if (per_slot)
        std::copy_n(k_scale->data<float>() + (k0 + j) * per_slot, per_slot,
                    out.slot_scale->data<float>() +
                        (int64_t(row[j / page_size]) * page_size + j % page_size) * per_slot);
    }
    k0 += lk[b];
  }
  return out;
}

struct PagedSpec {
  const char* name;
  std::vector<int32_t> lq, lk;
  int64_t page_size;
  KVLayout layout;
  int64_t group = 4, hkv = 2;
  bool causal = true;
  DType dtype = DType::bf16;  // fp8_e4m3: per-token q scales, k scales of kind k_scale_kind
  int64_t row_pad = 0;        // pool rows of D + row_pad elements
  int topk = 6;
  int k_scale_kind = 1;       // fp8: 1 per tensor, 2 per token, 3 per token and head (pool slots)
  int blk = 128;              // kv_block_size
  int64_t lists = 1;          // q2k rows per kv head (IdxCase::lists)
  int64_t dim = 128;          // head dim (IdxCase::dim)
};

// One paged case: GPU paged scores vs the CPU reference on the same pool, GPU paged == GPU flat
// bitwise on the same logical K, fused ids on the pool == select_topk on the paged scores.
void run_paged_case(PagedSpec sp, unsigned seed, bool small) {
  std::mt19937 rng(seed);
  if (small)  // shorter requests, still not multiples of 128 or of the page size
    for (auto* v : {&sp.lq, &sp.lk})
      for (int32_t& l : *v) l = l > 3 ? l / 3 + 1 : l;
  const int64_t total_q = std::accumulate(sp.lq.begin(), sp.lq.end(), int64_t(0));
  const int64_t total_k = std::accumulate(sp.lk.begin(), sp.lk.end(), int64_t(0));
  const int64_t hq = sp.hkv * sp.group;
  int64_t nblk = 1;
  for (int32_t k : sp.lk) nblk = std::max<int64_t>(nblk, (k + sp.blk - 1) / sp.blk);
  nblk += 1;
  const bool fp8 = sp.dtype == DType::fp8_e4m3;
  const HostTensor q = random_tokens(total_q, hq, sp.dtype, false, rng, sp.dim);
  const HostTensor k = random_tokens(total_k, sp.hkv, sp.dtype, false, rng, sp.dim);
  const auto q_scale = random_scale(fp8 ? 2 : 0, total_q, hq, false, rng);
  const auto k_scale = random_scale(fp8 ? sp.k_scale_kind : 0, total_k, sp.hkv, false, rng);
  const HostTensor cu_q = i32_tensor(cumulative(sp.lq)), cu_k = i32_tensor(cumulative(sp.lk));
  const PagedK pk = make_paged_k(k, sp.lk, sp.layout, sp.page_size, sp.row_pad, rng,
                                 k_scale ? &*k_scale : nullptr);
  const HostTensor* pool_scale = pk.slot_scale ? &*pk.slot_scale : k_scale ? &*k_scale : nullptr;

  HostTensor ref(DType::f32, {hq, nblk, total_q});
  BlockScoresArgs a;
  a.q = q_scale ? QTensor(q.t, q_scale->t) : QTensor(q.t);
  a.kv.k = pool_scale ? QTensor(pk.pool.t, pool_scale->t) : QTensor(pk.pool.t);
  a.kv.layout = sp.layout;
  a.kv.page_table = pk.page_table.t;
  a.kv.seqused_k = pk.seqused_k.t;
  a.cu_seqlens_q = cu_q.t;
  a.scores = ref.t;
  a.causal = sp.causal;
  a.kv_block_size = sp.blk;
  block_scores(a);

  TestStream s;
  const DeviceQTensor dq = to_device(q, q_scale, s), dk = to_device(k, k_scale, s);
  const DeviceQTensor dpool = to_device(pk.pool, pool_scale, s);
  const DeviceTensor dpt = to_device(pk.page_table, s), dsu = to_device(pk.seqused_k, s);
  const DeviceTensor dcq = to_device(cu_q, s), dck = to_device(cu_k, s);
  DeviceBuffer dst(16);
  BlockScoresArgs g = a;
  g.q = dq.view();
  g.kv.k = dpool.view();
  g.kv.page_table = dpt.t;
  g.kv.seqused_k = dsu.t;
  g.cu_seqlens_q = dcq.t;
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  const auto paged = gpu_scores(g, ref, s);
  expect_scores_match(paged, ref, false);

  BlockScoresArgs gf = g;  // the same logical K, flat
  gf.kv = KVCache();
  gf.kv.k = dk.view();
  gf.kv.cu_seqlens_k = dck.t;
  const auto flat = gpu_scores(gf, ref, s);
  EXPECT_EQ(0, std::memcmp(paged.data(), flat.data(), paged.size() * 4)) << "paged != flat scores";

  expect_fused_matches_unfused(topk_args(g, sp.topk), paged, hq, nblk, cu_q, cu_k, sp.hkv * sp.lists, s);
}

// The paged specs in turn (every third with MSA_TEST_SMALL), stopping at the first failure.
template <size_t N>
void run_paged_specs(const PagedSpec (&specs)[N], unsigned seed) {
  const bool small = small_tests();
  int index = 0;
  for (const PagedSpec& sp : specs) {
    ++seed;
    if (small && index++ % 3 != 0) continue;
    SCOPED_TRACE(sp.name);
    run_paged_case(sp, seed, small);
    if (::testing::Test::HasFailure()) break;
  }
}

// Every page size in both layouts, G 1/4/16, causal both ways, bf16/f16/FP8 (key scales per
// tensor, per pool slot, per slot and head), lengths that are not multiples of 128 or of the page
// size, requests without keys or queries, Lq > Lk, seqused_k below the pages' capacity (a spare
// column each), padded pool rows.
TEST(IndexerGpu, PagedMatchesCpuAndFlat) {
  MSA_REQUIRE_GPU();
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf16 = DType::bf16, f16 = DType::f16, fp8 = DType::fp8_e4m3;
  const PagedSpec specs[] = {
      {"ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 16, nhd, 1, 2},
      {"ps16 hnd G4 non-causal fp8", {200, 5, 130}, {513, 0, 130}, 16, hnd, 4, 2, false, fp8},
      {"ps32 nhd G16 padded", {260, 17}, {260, 700}, 32, nhd, 16, 1, true, bf16, 8},
      {"ps32 hnd G1 f16", {100, 0, 90}, {333, 0, 257}, 32, hnd, 1, 3, true, f16},
      {"ps64 nhd G4 fp8 padded", {257, 40, 0, 9}, {400, 0, 5, 130}, 64, nhd, 4, 2, true, fp8, 16},
      {"ps64 hnd G16 non-causal", {200, 64}, {90, 640}, 64, hnd, 16, 1, false},
      {"ps128 nhd G1 fp8", {129, 0, 300}, {129, 0, 1000}, 128, nhd, 1, 2, true, fp8},
      {"ps128 hnd G4 non-causal padded", {150, 33}, {383, 129}, 128, hnd, 4, 2, false, bf16, 8},
      {"ps256 nhd G16", {300, 1}, {700, 257}, 256, nhd, 16, 1},
      {"ps256 hnd G4 fp8 non-causal", {333, 0}, {600, 0}, 256, hnd, 4, 2, false, fp8},
      {"ps256 nhd G1 f16 one key", {1, 3}, {1, 3}, 256, nhd, 1, 1, true, f16},
      {"ps16 nhd G4 topk 64", {128, 70}, {200, 1100}, 16, nhd, 4, 1, true, bf16, 0, 64},
      {"ps32 hnd G4 fp8 per-token k", {150, 0, 61}, {400, 3, 300}, 32, hnd, 4, 2, true, fp8, 0, 6, 2},
      {"ps128 nhd G16 fp8 per-token-head k padded", {90, 129}, {700, 129}, 128, nhd, 16, 2, true, fp8, 16, 6, 3},
      {"ps256 nhd G1 fp8 per-token k non-causal", {70, 5}, {900, 40}, 256, nhd, 1, 2, false, fp8, 0, 6, 2},
      {"ps64 nhd M3: G4 fp8 per-slot k, a list per head, topk 16", {300, 0, 129}, {700, 40, 1000}, 64, nhd, 4, 1, true, fp8, 0, 16, 2, 128, 4},
  };
  run_paged_specs(specs, 7000);
}

// The same with 64-key blocks: pages smaller than, equal to and larger than a block, lengths not
// multiples of 64 (nor of 128 or the page size), FP8 key scales of every kind.
TEST(IndexerGpu, Blk64PagedMatchesCpuAndFlat) {
  MSA_REQUIRE_GPU();
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf16 = DType::bf16, f16 = DType::f16, fp8 = DType::fp8_e4m3;
  const PagedSpec specs[] = {
      {"ps16 hnd G4 blk64", {300, 0, 77}, {300, 50, 201}, 16, hnd, 4, 2, true, bf16, 0, 6, 1, 64},
      {"ps32 nhd G1 f16 non-causal blk64", {100, 1, 90}, {333, 1, 257}, 32, nhd, 1, 3, false, f16, 8, 9, 1, 64},
      {"ps64 nhd G16 fp8 per-token k blk64", {257, 40, 0}, {400, 65, 5}, 64, nhd, 16, 1, true, fp8, 0, 6, 2, 64},
      {"ps64 hnd G2 fp8 non-causal blk64", {63, 129}, {63, 640}, 64, hnd, 2, 2, false, fp8, 16, 5, 1, 64},
      {"ps128 nhd G8 fp8 per-token-head k blk64", {129, 0, 200}, {129, 0, 1001}, 128, nhd, 8, 2, true, fp8, 0, 6, 3, 64},
      {"ps256 hnd G4 topk 64 blk64", {128, 70}, {191, 1100}, 256, hnd, 4, 1, true, bf16, 0, 64, 1, 64},
      {"ps256 nhd G1 one key blk64", {1, 3}, {1, 3}, 256, nhd, 1, 1, true, bf16, 0, 6, 1, 64},
      {"ps128 hnd G16 a list per head topk 18 blk64", {200, 33}, {900, 300}, 128, hnd, 16, 1, true, bf16, 0, 18, 1, 64, 16},
  };
  run_paged_specs(specs, 7100);
}

// Paged K at head dims 64 (bf16 / f16) and 256 (FP8, key scales per tensor, slot, slot and
// head): page sizes 16-256 in both layouts, both block sizes, padded rows.
TEST(IndexerGpu, PagedHeadDimsMatchCpuAndFlat) {
  MSA_REQUIRE_GPU();
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf16 = DType::bf16, f16 = DType::f16, fp8 = DType::fp8_e4m3;
  PagedSpec specs[] = {
      {"D64 ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 16, nhd, 1, 2},
      {"D64 ps32 hnd G4 f16 padded blk64", {200, 5, 130}, {513, 0, 130}, 32, hnd, 4, 2, false, f16, 8, 6, 1, 64},
      {"D64 ps128 nhd G16", {260, 17}, {260, 700}, 128, nhd, 16, 1, true, bf16},
      {"D256 ps64 nhd G4 fp8 per-slot k", {257, 40, 0, 9}, {400, 0, 5, 130}, 64, nhd, 4, 2, true, fp8, 16, 6, 2},
      {"D256 ps256 hnd G16 fp8 per-slot-head k blk64", {200, 64}, {90, 640}, 256, hnd, 16, 1, false, fp8, 0, 6, 3, 64},
      {"D256 ps16 hnd G1 fp8 per-tensor k", {129, 0, 300}, {129, 0, 1000}, 16, hnd, 1, 2, true, fp8},
  };
  for (PagedSpec& sp : specs) sp.dim = sp.dtype == fp8 ? 256 : 64;
  run_paged_specs(specs, 7200);
}

// seqused_k absent: every request has max_pages * page_size keys, so spare columns are used.
TEST(IndexerGpu, PagedDefaultLengths) {
  MSA_REQUIRE_GPU();
  for (const KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
    SCOPED_TRACE(kv_layout_name(layout));
    std::mt19937 rng(77);
    const std::vector<int32_t> lq = {100, 37}, lk = {256, 384};  // whole pages of 128: no tail
    const int64_t hq = 8, hkv = 2, total_q = 137, total_k = 640, nblk = 4;
    const HostTensor q = random_tokens(total_q, hq, DType::bf16, false, rng);
    const HostTensor k = random_tokens(total_k, hkv, DType::bf16, false, rng);
    PagedK pk = make_paged_k(k, lk, layout, 128, 0, rng);
    // Drop the spare column: capacity = max_pages * 128 = 384 keys for both requests, so the
    // first request's third column must hold a real page: request 1's last one (shared pages).
    const int64_t cols = pk.page_table.t.shape[1] - 1;
    HostTensor pt(DType::i32, {2, cols});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < cols; ++c)
        pt.data<int32_t>()[b * cols + c] = pk.page_table.data<int32_t>()[b * (cols + 1) + c];
    pt.data<int32_t>()[2] = pt.data<int32_t>()[cols + 2];  // request 0 reads request 1's last page
    const HostTensor cu_q = i32_tensor(cumulative(lq));
    HostTensor ref(DType::f32, {hq, nblk, total_q});
    BlockScoresArgs a;
    a.q = q.t;
    a.kv.k = pk.pool.t;
    a.kv.layout = layout;
    a.kv.page_table = pt.t;
    a.cu_seqlens_q = cu_q.t;
    a.scores = ref.t;
    block_scores(a);
    TestStream s;
    const DeviceTensor dq = to_device(q, s), dpool = to_device(pk.pool, s), dpt = to_device(pt, s);
    const DeviceTensor dcq = to_device(cu_q, s);
    DeviceBuffer dst(16);
    BlockScoresArgs g = a;
    g.q = dq.t;
    g.kv.k = dpool.t;
    g.kv.page_table = dpt.t;
    g.cu_seqlens_q = dcq.t;
    g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
    expect_scores_match(gpu_scores(g, ref, s), ref, false);
  }
}

// Scores with fewer blocks than a request has (flat K: only the device counts them), 64-key
// blocks and an odd nblk_max: the device reports the request's block count, the blocks inside the
// scores hold the CPU's values, and nothing past the scores is written (the last tile's second
// block is past nblk_max).
TEST(IndexerGpu, Blk64ShortScoresReported) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(95);
  const std::vector<int32_t> lq = {40, 300}, lk = {100, 300};  // request 1: 5 blocks of 64
  const int64_t hq = 4, hkv = 1, total_q = 340, total_k = 400, nblk = 3, full = 5;
  const HostTensor q = random_tokens(total_q, hq, DType::bf16, false, rng);
  const HostTensor k = random_tokens(total_k, hkv, DType::bf16, false, rng);
  const HostTensor cu_q = i32_tensor(cumulative(lq)), cu_k = i32_tensor(cumulative(lk));
  HostTensor ref(DType::f32, {hq, full, total_q});
  BlockScoresArgs a;
  a.q = q.t;
  a.kv.k = k.t;
  a.kv.cu_seqlens_k = cu_k.t;
  a.cu_seqlens_q = cu_q.t;
  a.scores = ref.t;
  a.causal = false;  // every tile of request 1 sees its 5 blocks: one report, whichever CTA wins
  a.kv_block_size = 64;
  block_scores(a);
  HostTensor want(DType::f32, {hq, nblk, total_q});  // the CPU's first nblk blocks
  for (int64_t h = 0; h < hq; ++h)
    std::memcpy(want.data<float>() + h * nblk * total_q, ref.data<float>() + h * full * total_q,
                size_t(nblk * total_q) * 4);

  TestStream s;
  const DeviceTensor dq = to_device(q, s), dk = to_device(k, s);
  const DeviceTensor dcq = to_device(cu_q, s), dck = to_device(cu_k, s);
  const size_t bytes = size_t(hq * nblk * total_q) * 4, guard = 4096;
  DeviceBuffer dst(16), dscores(bytes + guard);
  dscores.poison(s);
  BlockScoresArgs g = a;
  g.q = dq.t;
  g.kv.k = dk.t;
  g.kv.cu_seqlens_k = dck.t;
  g.cu_seqlens_q = dcq.t;
  g.scores = Tensor(dscores.get(), DType::f32, {hq, nblk, total_q}, gpu0());
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  expect_error([&] {
    clear_status(g.status, s);
    block_scores(g, s);
    check_status(g.status, s);
  }, "shape mismatch detected on device (1, 5, 3)");
  const auto got = dscores.download<float>((bytes + guard) / 4, s);
  expect_scores_match(std::vector<float>(got.begin(), got.begin() + int64_t(bytes / 4)), want, false);
  int64_t written = 0;
  for (size_t i = bytes; i < bytes + guard; i += 4) {
    uint32_t w;
    std::memcpy(&w, reinterpret_cast<const uint8_t*>(got.data()) + i, 4);
    written += w != 0xffffffffu;
  }
  EXPECT_EQ(written, 0) << "scores written past nblk_max";
}

// A negative FP8 key scale of a key the kernel reads is reported with the token that indexes
// the scale tensor: the flat key, or (paged) the pool slot page * page_size + slot; scales of
// unused pool slots (NaN here) are never read.
TEST(IndexerGpu, NegativeKeyScaleReportedFlatAndPaged) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(93);
  const std::vector<int32_t> lq = {40, 90}, lk = {100, 200};
  const int64_t hq = 4, hkv = 1, total_q = 130, total_k = 300;
  const HostTensor q = random_tokens(total_q, hq, DType::fp8_e4m3, false, rng);
  const HostTensor k = random_tokens(total_k, hkv, DType::fp8_e4m3, false, rng);
  auto k_scale = random_scale(2, total_k, hkv, false, rng);
  const int64_t bad_key = 100 + 150;  // request 1, key 150 (visible to its later queries)
  k_scale->data<float>()[bad_key] = -0.5f;
  const PagedK pk = make_paged_k(k, lk, KVLayout::paged_hnd, 32, 0, rng, &*k_scale);
  const int64_t cols = pk.page_table.t.shape[1];
  const int64_t bad_slot = int64_t(pk.page_table.data<int32_t>()[cols + 150 / 32]) * 32 + 150 % 32;
  ASSERT_EQ(pk.slot_scale->data<float>()[bad_slot], -0.5f);
  const HostTensor cu_q = i32_tensor(cumulative(lq)), cu_k = i32_tensor(cumulative(lk));
  TestStream s;
  const DeviceTensor dq = to_device(q, s), dk = to_device(k, s), dks = to_device(*k_scale, s);
  const DeviceTensor dpool = to_device(pk.pool, s), dps = to_device(*pk.slot_scale, s);
  const DeviceTensor dpt = to_device(pk.page_table, s), dsu = to_device(pk.seqused_k, s);
  const DeviceTensor dcq = to_device(cu_q, s), dck = to_device(cu_k, s);
  DeviceBuffer dst(16), dscores(size_t(hq * 8 * total_q) * 4);
  BlockScoresArgs g;
  g.q = dq.t;
  g.kv.k = QTensor(dk.t, dks.t);
  g.kv.cu_seqlens_k = dck.t;
  g.cu_seqlens_q = dcq.t;
  g.scores = Tensor(dscores.get(), DType::f32, {hq, 2, total_q}, gpu0());
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  const auto run = [&](const BlockScoresArgs& args, int64_t token) {
    expect_error([&] {
      clear_status(args.status, s);
      block_scores(args, s);
      check_status(args.status, s);
    }, "k.scale: FP8 scales must be finite and >= 0; negative or not finite at (token " + std::to_string(token) + ", head 0)");
  };
  run(g, bad_key);
  BlockScoresArgs gp = g;
  gp.kv = KVCache();
  gp.kv.k = QTensor(dpool.t, dps.t);
  gp.kv.layout = KVLayout::paged_hnd;
  gp.kv.page_table = dpt.t;
  gp.kv.seqused_k = dsu.t;
  gp.scores = Tensor(dscores.get(), DType::f32, {hq, 8, total_q}, gpu0());
  run(gp, bad_slot);
}

// A page id out of [0, num_pages) in a used column, or a seqused_k above the capacity, is
// reported by the device as an msa::Error naming it (the first offence: lengths, then page ids
// in (batch, column) order); ids in unused columns are never read.
TEST(IndexerGpu, PagedBadPageIdsReported) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(91);
  const std::vector<int32_t> lq = {40, 90}, lk = {100, 200};
  const int64_t hq = 4, hkv = 1, total_q = 130, total_k = 300;
  const HostTensor q = random_tokens(total_q, hq, DType::bf16, false, rng);
  const HostTensor k = random_tokens(total_k, hkv, DType::bf16, false, rng);
  const PagedK pk = make_paged_k(k, lk, KVLayout::paged_nhd, 32, 0, rng);
  const int64_t cols = pk.page_table.t.shape[1], pages = pk.pool.t.shape[0];
  std::vector<int32_t> pt(pk.page_table.data<int32_t>(), pk.page_table.data<int32_t>() + 2 * cols);
  pt[cols + 2] = int32_t(pages) + 5;  // request 1, column 2: used (keys 64..95)
  pt[cols + 5] = -3;                   // request 1, column 5: used, but a later offence
  pt[4] = INT_MAX;                     // request 0, column 4: past its 100 keys, never read
  const HostTensor cu_q = i32_tensor(cumulative(lq));
  TestStream s;
  DeviceTensor dq = to_device(q, s), dpool = to_device(pk.pool, s), dpt = to_device(pk.page_table, s);
  DeviceTensor dsu = to_device(pk.seqused_k, s), dcq = to_device(cu_q, s);
  dpt.buf.upload(pt, s);
  DeviceBuffer dst(16), dscores(size_t(hq * 3 * total_q) * 4), dids(size_t(hkv * total_q * 4) * 4);
  BlockScoresArgs g;
  g.q = dq.t;
  g.kv.k = dpool.t;
  g.kv.layout = KVLayout::paged_nhd;
  g.kv.page_table = dpt.t;
  g.kv.seqused_k = dsu.t;
  g.cu_seqlens_q = dcq.t;
  g.scores = Tensor(dscores.get(), DType::f32, {hq, 3, total_q}, gpu0());
  g.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  const std::string bad_id = "page_table: page id " + std::to_string(pages + 5) +
                             " out of range [0, num_pages) at (batch 1, column 2)";
  expect_error([&] {
    clear_status(g.status, s);
    block_scores(g, s);
    check_status(g.status, s);
  }, bad_id);
  BlockTopKArgs f = topk_args(g, 4);
  f.q2k = Tensor(dids.get(), DType::i32, {hkv, total_q, 4}, gpu0());
  expect_error([&] {
    clear_status(f.status, s);
    block_topk(f, s);
    check_status(f.status, s);
  }, bad_id);
  // No queries at all: the page ids are still checked.
  BlockScoresArgs none = g;
  const HostTensor cu_none = i32_tensor({0, 0, 0});
  const DeviceTensor dcn = to_device(cu_none, s);
  none.q = Tensor(dq.t.data, DType::bf16, {0, hq, kD}, gpu0());
  none.cu_seqlens_q = dcn.t;
  none.scores = Tensor(dscores.get(), DType::f32, {hq, 3, 0}, gpu0());
  expect_error([&] {
    clear_status(none.status, s);
    block_scores(none, s);
    check_status(none.status, s);
  }, bad_id);
  // A length above max_pages * page_size comes first (lengths before page ids).
  const int32_t cap = int32_t(cols * 32);
  dsu.buf.upload(std::vector<int32_t>{lk[0], cap + 1}, s);
  expect_error([&] {
    clear_status(g.status, s);
    block_scores(g, s);
    check_status(g.status, s);
  }, "seqused_k: batch 1 has " + std::to_string(cap + 1) + " keys, more than its page table holds "
     "(max_pages * page_size = " + std::to_string(cap) + ")");
}

}  // namespace
}  // namespace msa::test
