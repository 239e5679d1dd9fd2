// Random sparse-attention problems for the GPU tests (CSR builder, sparse forward): varlen
// batches with empty requests and lengths that are not multiples of the block, random q2k rows (visible
// blocks, sometimes invisible ones, -1 padding, sometimes unsorted), NaN in every KV row that no
// query of its kv head selects (device copies: support/device_tensor.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "support/attention_problem.h"
#include "support/host_tensor.h"
#include "support/device_tensor.h"
#include "support/gpu_test_util.h"

namespace msa::test {

struct SparseCase {
  // block: keys per kv block of the q2k ids (kv_block_size, 128 or 64).
  SparseCase(Problem problem, HostTensor ids, int64_t k, int64_t block = 128)
      : p(std::move(problem)), q2k(std::move(ids)), topk(k), blk(block) {
    for (int32_t l : p.lk) total_rows += (l + blk - 1) / blk;
  }
  std::string name;
  Problem p;
  HostTensor q2k;
  int64_t topk = 1;
  int64_t blk = 128;  // kv_block_size
  bool causal = true;
  std::optional<DType> partial;  // absent: the library default (bf16 for bf16 q, f32 for f16 q)
  float temperature = 0.f;
  float scale = 0.f;
  float soft_cap = 0.f;  // params.soft_cap (0: off)
  int64_t total_rows = 0;
  // Dense attention: the call passes no q2k; q2k holds every block of each request (section 14:
  // dense is section 5 with every block selected), for the references that read a selection.
  bool dense = false;
  std::optional<HostTensor> causal_offset;  // [B] int32: query i sees keys j <= i + offset[b]
  std::optional<HostTensor> key_mask;       // bool / u8 [B or total_q, Lk_max], nonzero = visible
  KeyMaskRows key_mask_rows = KeyMaskRows::from_shape;
};

// The case's attention parameters: mask, partial precision, temperature and softmax scale.
inline AttentionParams params_of(const SparseCase& c) {
  AttentionParams prm;
  prm.causal = c.causal;
  prm.partial_dtype = c.partial;
  prm.temperature = c.temperature;
  prm.softmax_scale = c.scale;
  prm.soft_cap = c.soft_cap;
  prm.kv_block_size = int(c.blk);
  return prm;
}

// attention_forward's inputs for the case on the CPU (flat KV) with its parameters; the caller
// adds the outputs.
inline AttentionArgs cpu_args(const SparseCase& c) {
  AttentionArgs a;
  a.params = params_of(c);
  a.q = c.p.q.t;
  if (c.p.q_scale) a.q_scale = c.p.q_scale->t;
  a.kv = c.p.flat_kv();
  a.cu_seqlens_q = c.p.cu_q.t;
  if (!c.dense) a.q2k = c.q2k.t;
  if (c.causal_offset) a.causal_offset = c.causal_offset->t;
  if (c.key_mask) a.key_mask = c.key_mask->t;
  a.key_mask_rows = c.key_mask_rows;
  return a;
}

// A dense case over `p`: q2k [hkv, total_q, K] lists blocks 0 .. nblk_b - 1 of each request (-1
// padded to K = the most blocks of any request, at least 1).
inline SparseCase dense_case(Problem p, bool causal) {
  int64_t k = 1;
  for (int32_t l : p.lk) k = std::max<int64_t>(k, (l + 127) / 128);
  const int64_t hkv = p.hkv, tq = p.total_q();
  HostTensor ids(DType::i32, {hkv, tq, k});
  for (int64_t h = 0; h < hkv; ++h)
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int64_t i = 0; i < p.lq[b]; ++i) {
        int32_t* row = ids.data<int32_t>() + (h * tq + p.q_start(b) + i) * k;
        for (int64_t sl = 0; sl < k; ++sl) row[sl] = sl < (p.lk[b] + 127) / 128 ? int32_t(sl) : -1;
      }
  SparseCase c(std::move(p), std::move(ids), k);
  c.causal = causal;
  c.dense = true;
  return c;
}

// Random q2k [hkv, total_q, topk] for problem p (blocks of blk keys) shaped like an indexer's
// selection: mostly the sink and diagonal blocks plus visible ones, sometimes invisible blocks,
// fewer than topK ids, unsorted rows or -1 in the middle (random_q2k draws uniform rows instead).
// uniform_blocks: every qblock-query block copies the row of its last query (the `blk` pattern at
// 128; 64: FlashInfer's R = 64 BSR rows; the GPU's uniform path).
inline HostTensor indexer_like_q2k(const Problem& p, int64_t topk, bool causal, std::mt19937& rng,
                                   bool uniform_blocks = false, int64_t blk = 128,
                                   int64_t qblock = 128) {
  const int64_t hkv = p.hkv, tq = p.total_q();
  HostTensor q2k(DType::i32, {hkv, tq, topk});
  int32_t* ids = q2k.data<int32_t>();
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t b = 0; b < p.batch(); ++b) {
    const int64_t lq = p.lq[b], lk = p.lk[b], nblk = (lk + blk - 1) / blk;
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t i = 0; i < lq; ++i) {
        int32_t* row = ids + ((h * tq) + p.q_start(b) + i) * topk;
        const int64_t last = causal ? i + lk - lq : lk - 1;  // last visible key
        const int64_t vis = last < 0 ? 0 : std::min(nblk, last / blk + 1);
        const bool any_block = u(rng) < 0.2;  // sometimes draw invisible blocks too
        const int64_t pool = any_block ? nblk : vis;
        std::vector<int32_t> pick;
        if (pool > 0) {
          if (u(rng) < 0.8) pick.push_back(0);                           // sink
          if (vis > 0 && u(rng) < 0.8) pick.push_back(int32_t(vis - 1));  // diagonal
          const int64_t want = std::min<int64_t>(topk, pool) - int64_t(u(rng) < 0.2 ? rng() % 3 : 0);
          std::set<int32_t> seen;
          std::vector<int32_t> uniq;
          for (int32_t x : pick)
            if (seen.insert(x).second) uniq.push_back(x);
          if (pool <= 4 * topk) {  // small pool: shuffle all, take what is missing
            std::vector<int32_t> all(pool);
            for (int64_t x = 0; x < pool; ++x) all[x] = int32_t(x);
            std::shuffle(all.begin(), all.end(), rng);
            for (int32_t x : all)
              if (int64_t(uniq.size()) < want && seen.insert(x).second) uniq.push_back(x);
          } else {
            while (int64_t(uniq.size()) < want) {
              const int32_t x = int32_t(rng() % pool);
              if (seen.insert(x).second) uniq.push_back(x);
            }
          }
          if (int64_t(uniq.size()) > topk) uniq.resize(topk);
          pick = uniq;
        }
        if (u(rng) < 0.8) std::sort(pick.begin(), pick.end());
        for (int64_t s = 0; s < topk; ++s) row[s] = s < int64_t(pick.size()) ? pick[s] : -1;
        if (u(rng) < 0.1 && topk > 1) std::shuffle(row, row + topk, rng);  // -1 in the middle
      }
  }
  if (uniform_blocks)
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t i = 0; i < p.lq[b]; ++i) {
          const int64_t src = std::min<int64_t>(p.lq[b] - 1, (i / qblock) * qblock + qblock - 1);
          const int32_t* from = ids + ((h * tq) + p.q_start(b) + src) * topk;
          std::copy(from, from + topk, ids + ((h * tq) + p.q_start(b) + i) * topk);
        }
  return q2k;
}

// Writes NaN into every K/V row (of kv head h) of a block (of blk keys) that no query of head h
// selects.
inline void poison_unselected(Problem& p, const HostTensor& q2k, int64_t topk, int64_t blk = 128) {
  const int64_t tq = p.total_q();
  for (int64_t b = 0; b < p.batch(); ++b) {
    const int64_t nblk = (p.lk[b] + blk - 1) / blk;
    for (int64_t h = 0; h < p.hkv; ++h) {
      std::vector<char> used(nblk, 0);
      for (int64_t i = 0; i < p.lq[b]; ++i)
        for (int64_t s = 0; s < topk; ++s) {
          const int32_t kb = q2k.data<int32_t>()[((h * tq) + p.q_start(b) + i) * topk + s];
          if (kb >= 0 && kb < nblk) used[kb] = 1;
        }
      for (int64_t kb = 0; kb < nblk; ++kb) {
        if (used[kb]) continue;
        for (int64_t j = kb * blk; j < std::min<int64_t>(p.lk[b], (kb + 1) * blk); ++j)
          for (int64_t d = 0; d < p.dim; ++d) {
            const int64_t row = p.k_start(b) + j;
            if (p.k.t.dtype == DType::fp8_e4m3) {  // 0x7f: NaN in e4m3
              p.k.data<uint8_t>()[p.k.offset({row, h, d})] = 0x7f;
              p.v.data<uint8_t>()[p.v.offset({row, h, d})] = 0x7f;
            } else {  // 0x7fff: NaN in bf16 and f16
              p.k.data<uint16_t>()[p.k.offset({row, h, d})] = 0x7fff;
              p.v.data<uint16_t>()[p.v.offset({row, h, d})] = 0x7fff;
            }
          }
      }
    }
  }
}

// " lq=[..] lk=[..]": a case's request lengths, for its name.
inline std::string lengths_text(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk) {
  std::ostringstream os;
  os << " lq=[";
  for (size_t b = 0; b < lq.size(); ++b) os << (b ? "," : "") << lq[b];
  os << "] lk=[";
  for (size_t b = 0; b < lk.size(); ++b) os << (b ? "," : "") << lk[b];
  os << "]";
  return os.str();
}

// A random configuration. `index` selects the seed; small: short lengths for the sanitizer;
// fill_inputs false: shapes and q2k only (the same q2k), for tests of the index builders;
// fp8: bf16 q over FP8 e4m3 K/V with scales of that kind; blk: keys per kv block (128 or 64);
// dim: the head dim (the same draws at any dim).
// The CPU reference costs ~ tokens * Hq * attended keys * D, so long query sets come with few
// heads / small top-K and the key lengths (up to 5000) carry the long-context part.
inline SparseCase random_case(int index, bool small, bool fill_inputs = true,
                              std::optional<Fp8Scale> fp8 = std::nullopt, int64_t blk = 128,
                              int64_t dim = 128) {
  std::mt19937 rng(1234567u + 7919u * unsigned(index));
  const int groups[] = {1, 2, 4, 8, 16};
  const int topks[] = {1, 4, 8, 16, 32};
  const int64_t g = groups[rng() % 5];
  const int64_t hkv = 1 + rng() % (g >= 8 ? 2 : 3);
  const int64_t topk = topks[rng() % 5];
  const bool causal = rng() % 4 != 0;
  const int batch = 1 + int(rng() % 8);
  const int64_t max_k = small ? 700 : 5000;
  // Query budget: tokens * Hq * min(topk, 40) * 128 <= 1.5e7 (small: 2e6), about 0.5 s of
  // fp64 reference on 16 cores.
  const double budget = small ? 2e6 : 1.5e7;
  const int64_t max_q_total =
      std::max<int64_t>(1, int64_t(budget / double(g * hkv * std::min<int64_t>(topk, 40) * 128)));
  std::vector<int32_t> lq(batch), lk(batch);
  for (int b = 0; b < batch; ++b) {
    const int kind = int(rng() % 10);
    if (kind == 0) { lq[b] = 0; lk[b] = int32_t(rng() % max_k); }       // no queries
    else if (kind == 1) { lk[b] = 0; lq[b] = int32_t(1 + rng() % 50); }  // no keys
    else {
      lk[b] = int32_t(1 + rng() % max_k);
      lq[b] = rng() % 3 == 0 ? int32_t(1 + rng() % lk[b]) : lk[b];  // decode-like or prefill
      if (rng() % 8 == 0) lq[b] = lk[b] + int32_t(rng() % 100);     // more queries than keys
    }
  }
  int64_t total = 0;
  for (int32_t l : lq) total += l;
  if (total > max_q_total)  // scale the query lengths down to the budget, keep >= 1 where > 0
    for (int32_t& l : lq)
      if (l > 0) l = std::max<int32_t>(1, int32_t(int64_t(l) * max_q_total / total));
  const DType dt = rng() % 3 == 0 && !fp8 ? DType::f16 : DType::bf16;
  Problem prob = make_problem(lq, lk, g * hkv, hkv, dim, 99u + unsigned(index), dt,
                              fp8 ? DType::fp8_e4m3 : dt, fp8.value_or(Fp8Scale::none), fill_inputs);
  const bool uniform_blocks = rng() % 3 == 0;
  HostTensor ids = indexer_like_q2k(prob, topk, causal, rng, uniform_blocks, blk);
  SparseCase c(std::move(prob), std::move(ids), topk, blk);
  c.causal = causal;
  poison_unselected(c.p, c.q2k, c.topk, blk);
  const int partial = int(rng() % 3);
  if (partial > 0) c.partial = partial == 1 ? DType::bf16 : DType::f32;
  c.temperature = rng() % 3 == 0 ? 0.5f + float(rng() % 100) / 50.f : 0.f;
  c.scale = rng() % 4 == 0 ? 0.05f : 0.f;
  std::ostringstream os;
  os << "case " << index << ": B=" << batch << " G=" << g << " Hkv=" << hkv << " topk=" << topk
     << (c.causal ? " causal" : " non-causal") << (uniform_blocks ? " blk" : " tok") << " kv_block="
     << blk << (dim != 128 ? " D=" + std::to_string(dim) : std::string()) << " "
     << dtype_name(dt) << (fp8 ? " fp8 kv scales " + std::to_string(int(*fp8)) : "") << " partial="
     << (c.partial ? dtype_name(*c.partial) : "default") << " T=" << c.temperature
     << lengths_text(lq, lk);
  c.name = os.str();
  return c;
}

// docs/semantics.md, Numerics, on attention outputs: rel L2 of out <= 1e-2 over every element with
// no NaN (poisoned outputs left unwritten show as NaN); an lse-like statistic within 2e-3 absolute
// with -inf at exactly the reference's positions.
inline void expect_out_close(const HostTensor& gpu, const HostTensor& ref, double tol = 1e-2) {
  double num = 0, den = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < ref.t.numel(); ++i) {
    const double g = load(gpu.t, i), r = load(ref.t, i);
    if (std::isnan(g)) { ++nan; continue; }
    num += (g - r) * (g - r);
    den += r * r;
  }
  EXPECT_EQ(nan, 0) << "NaN (unwritten or poisoned) outputs";
  if (den == 0) EXPECT_EQ(num, 0) << "reference is all zeros";
  else EXPECT_LE(std::sqrt(num / den), tol) << "relative L2 error of out";
}

inline void expect_stat_close(const HostTensor& gpu, const HostTensor& ref, const char* what,
                              double tol = 2e-3) {
  double worst = 0;
  int64_t bad_inf = 0, bad_nan = 0;
  for (int64_t i = 0; i < ref.t.numel(); ++i) {
    const float gv = gpu.data<float>()[i], rv = ref.data<float>()[i];
    if (std::isnan(gv)) { ++bad_nan; continue; }
    if (std::isinf(rv) || std::isinf(gv)) { bad_inf += !(gv == rv); continue; }
    worst = std::max(worst, double(std::fabs(gv - rv)));
  }
  EXPECT_EQ(bad_nan, 0) << what << ": NaN";
  EXPECT_EQ(bad_inf, 0) << what << ": -inf positions differ";
  EXPECT_LE(worst, tol) << what << ": max abs error";
}

// Runs attention_forward with a freshly sized, poisoned workspace and waits for it, so a kernel
// that reads workspace it never wrote shows up as wrong outputs.
inline void run_attention_poisoned_workspace(AttentionArgs& a, cudaStream_t s) {
  const size_t need = attention_workspace_bytes(a);
  DeviceBuffer ws(std::max<size_t>(need, 256));
  ws.poison(s);
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(need)}, gpu0());
  attention_forward(a, s);
  MSA_CUDA_CHECK(cudaGetLastError());
  MSA_CUDA_CHECK(cudaStreamSynchronize(s));
  a.workspace = Tensor();
}

// The FlashAttention-3 bar (docs/semantics.md, Numerics): on sampled rows, the largest error of
// the GPU's out against fp64 is at most twice the largest error, against fp64, of a
// same-precision reference: the same 16-bit inputs, fp32 math (scores, exponentials, sums, P V),
// probabilities rounded to the input type before P V, out rounded to it. Calls with bf16 partials
// (the default for bf16 q, asked for with fp16) are held to the precision they asked for: each
// selected block's unnormalized partial (P V) rounded to bf16, the partials merged in fp32. For
// fp16 that rounding dominates (bf16 keeps 8 mantissa bits, fp16 11); for bf16 it is a second
// rounding of the output's size, which 64-key blocks (twice the partials of 128) took past 2x
// the reference without it (2.07x on one sweep case). Rows on the uniform path have no partials;
// the model is then looser than their computation. Rows: every `stride`-th (token, query head).
inline void expect_within_fa3_bar(const SparseCase& c, const HostTensor& gpu_out, int64_t stride) {
  const Problem& p = c.p;
  const int64_t tq = p.total_q(), g = p.hq / p.hkv, D = p.dim, blk = c.blk;
  const bool f16 = p.q.t.dtype == DType::f16;
  const bool rounded_partials = c.partial ? *c.partial == DType::bf16 : !f16;
  auto round16 = [f16](float x) {
    return f16 ? codec::f16_to_float(codec::float_to_f16(x))
               : codec::bf16_to_float(codec::float_to_bf16(x));
  };
  const double scale = c.scale != 0.f ? c.scale : float(1.0 / std::sqrt(double(D)));
  struct Row { int64_t b, i, hq; };
  std::vector<Row> sampled;
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t i = 0; i < p.lq[b]; ++i)
      for (int64_t hq = 0; hq < p.hq; ++hq)
        if (((p.q_start(b) + i) * p.hq + hq) % stride == 0) sampled.push_back({b, i, hq});
  double err_gpu = 0, err_same = 0;
  int64_t rows = 0;
  // Rows in parallel (max and count reductions: the result does not depend on the order).
#pragma omp parallel for schedule(dynamic, 16) reduction(max : err_gpu, err_same) reduction(+ : rows)
  for (int64_t n_row = 0; n_row < int64_t(sampled.size()); ++n_row) {
    const int64_t b = sampled[n_row].b, i = sampled[n_row].i, hq = sampled[n_row].hq;
    const int64_t t = p.q_start(b) + i, h = hq / g;
    const int32_t* sel = c.q2k.data<int32_t>() + (h * tq + t) * c.topk;
    // The selected blocks' visible keys, ascending (blocks in id order, each once).
    std::vector<int32_t> blocks;
    for (int64_t sl = 0; sl < c.topk; ++sl)
      if (sel[sl] >= 0 && int64_t(sel[sl]) * blk < p.lk[b]) blocks.push_back(sel[sl]);
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    const int64_t last = c.causal ? i + p.lk[b] - p.lq[b] : p.lk[b] - 1;
    std::vector<int64_t> keys;
    for (const int32_t kb : blocks)
      for (int64_t j = int64_t(kb) * blk; j < std::min<int64_t>(p.lk[b], (kb + 1) * blk) && j <= last; ++j)
        keys.push_back(p.k_start(b) + j);
    if (keys.empty()) continue;
    std::vector<double> s64(keys.size());
    std::vector<float> s32(keys.size());
    for (size_t n = 0; n < keys.size(); ++n) {
      double d64 = 0;
      float d32 = 0.f;
      for (int64_t d = 0; d < D; ++d) {
        const double qv = p.q_val[(t * p.hq + hq) * D + d];
        const double kv = p.k_val[(keys[n] * p.hkv + h) * D + d];
        d64 += qv * kv;
        d32 = std::fma(float(qv), float(kv), d32);
      }
      s64[n] = scale * d64;
      s32[n] = float(scale) * d32;
    }
    const double m64 = *std::max_element(s64.begin(), s64.end());
    double l64 = 0;
    std::vector<double> o64(D, 0.0);
    for (size_t n = 0; n < keys.size(); ++n) {
      const double w64 = std::exp(s64[n] - m64);
      l64 += w64;
      for (int64_t d = 0; d < D; ++d) o64[d] += w64 * p.v_val[(keys[n] * p.hkv + h) * D + d];
    }
    // fp32 attention over keys [lo, hi) (probabilities rounded to 16 bits before P V):
    // unnormalized output (P V) into o, the sum of P into l, log-sum-exp returned.
    auto attend32 = [&](size_t lo, size_t hi, std::vector<float>& o, float& l) {
      const float m32 = *std::max_element(s32.begin() + lo, s32.begin() + hi);
      float l32 = 0.f;
      std::fill(o.begin(), o.end(), 0.f);
      for (size_t n = lo; n < hi; ++n) {
        const float w32 = std::exp(s32[n] - m32);
        l32 += w32;
        const float w16 = round16(w32);
        for (int64_t d = 0; d < D; ++d)
          o[d] = std::fma(w16, float(p.v_val[(keys[n] * p.hkv + h) * D + d]), o[d]);
      }
      l = l32;
      return m32 + std::log(l32);
    };
    std::vector<float> o32(D);
    if (!rounded_partials) {
      float l = 0.f;
      attend32(0, keys.size(), o32, l);
      for (int64_t d = 0; d < D; ++d) o32[d] /= l;
    } else {
      // The precision the call asked for: one partial per selected block, its unnormalized
      // output (P V) rounded to bf16, merged in fp32 by the blocks' log-sum-exps and sums.
      std::vector<float> lse_b, sum_b, part;
      std::vector<float> ob(D);
      for (size_t lo = 0; lo < keys.size();) {
        size_t hi = lo + 1;
        while (hi < keys.size() && (keys[hi] - p.k_start(b)) / blk == (keys[lo] - p.k_start(b)) / blk) ++hi;
        float l = 0.f;
        lse_b.push_back(attend32(lo, hi, ob, l));
        sum_b.push_back(l);
        for (int64_t d = 0; d < D; ++d)
          part.push_back(codec::bf16_to_float(codec::float_to_bf16(ob[d])));
        lo = hi;
      }
      const float mx = *std::max_element(lse_b.begin(), lse_b.end());
      float den = 0.f;
      std::fill(o32.begin(), o32.end(), 0.f);
      for (size_t k = 0; k < lse_b.size(); ++k) {
        const float w = std::exp(lse_b[k] - mx);
        den += w;
        for (int64_t d = 0; d < D; ++d) o32[d] = std::fma(w / sum_b[k], part[k * D + d], o32[d]);
      }
      for (int64_t d = 0; d < D; ++d) o32[d] /= den;
    }
    for (int64_t d = 0; d < D; ++d) {
      const double exact = o64[d] / l64;
      err_same = std::max(err_same, std::fabs(double(round16(o32[d])) - exact));
      err_gpu = std::max(err_gpu, std::fabs(load(gpu_out.t, (t * p.hq + hq) * D + d) - exact));
    }
    ++rows;
  }
  if (rows == 0) return;
  EXPECT_LE(err_gpu, 2.0 * err_same)
      << "out: max error vs fp64 " << err_gpu << ", same-precision reference " << err_same
      << " (" << rows << " sampled rows; the bar allows 2x)";
}

}  // namespace msa::test
