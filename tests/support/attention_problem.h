// Test inputs and an independent reference for the CPU attention, CSR and decode suites:
// random varlen problems (flat KV, bf16/f16 or FP8 KV), page pools built from them, random q2k,
// and a brute-force attention written straight from docs/semantics.md, Attention (a mask over every
// key).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "msa/msa.h"

namespace msa::test {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Decoded element `offset` of a bf16 / f16 / f32 tensor.
inline double load(const Tensor& t, int64_t offset) {
  switch (t.dtype) {
    case DType::bf16: return codec::bf16_to_float(t.ptr<uint16_t>()[offset]);
    case DType::f16: return codec::f16_to_float(t.ptr<uint16_t>()[offset]);
    case DType::f32: return t.ptr<float>()[offset];
    default: ADD_FAILURE() << "load: unexpected dtype"; return 0;
  }
}

// Stores a float into a bf16 / f16 element and returns the value actually stored.
inline double store(const Tensor& t, int64_t offset, float v) {
  if (t.dtype == DType::bf16) t.ptr<uint16_t>()[offset] = codec::float_to_bf16(v);
  else t.ptr<uint16_t>()[offset] = codec::float_to_f16(v);
  return load(t, offset);
}

enum class Fp8Scale { none, per_tensor, per_token, per_token_head };

// A varlen batch with flat KV: q [total_q, Hq, D], k/v [total_k, Hkv, D] in bf16/f16, or FP8
// KV with f32 scales. *_val hold the logical (dequantized) values the reference uses.
struct Problem {
  int64_t hq = 0, hkv = 0, dim = 0;
  std::vector<int32_t> lq, lk;
  HostTensor q, k, v, cu_q, cu_k;
  std::optional<HostTensor> k_scale, v_scale;
  float k_global = 1.f, v_global = 1.f;  // NVFP4 K/V
  std::optional<HostTensor> q_scale;     // FP8 q: [total_q, Hq] f32
  std::vector<double> q_val, k_val, v_val;

  int64_t batch() const { return int64_t(lq.size()); }
  // The output dtype: q's, bf16 for FP8 q.
  DType out_dtype() const { return q.t.dtype == DType::fp8_e4m3 ? DType::bf16 : q.t.dtype; }
  int64_t total_q() const { return q.t.shape[0]; }
  int64_t total_k() const { return k.t.shape[0]; }
  int32_t q_start(int64_t b) const { return cu_q.data<int32_t>()[b]; }
  int32_t k_start(int64_t b) const { return cu_k.data<int32_t>()[b]; }
  KVCache flat_kv() const {
    KVCache kv;
    kv.k = k_scale ? QTensor(k.t, k_scale->t, k_global) : QTensor(k.t);
    kv.v = v_scale ? QTensor(v.t, v_scale->t, v_global) : QTensor(v.t);
    kv.cu_seqlens_k = cu_k.t;
    return kv;
  }
};

// Fills a bf16/f16 [T, H, D] tensor with random nonzero values in +-[0.05, amp); returns them.
inline std::vector<double> fill_values(const HostTensor& x, std::mt19937& rng, double amp) {
  std::uniform_real_distribution<double> mag(0.05, amp);
  std::bernoulli_distribution neg(0.5);
  std::vector<double> out(x.t.numel());
  for (int64_t i = 0; i < x.t.shape[0]; ++i)
    for (int64_t h = 0; h < x.t.shape[1]; ++h)
      for (int64_t d = 0; d < x.t.shape[2]; ++d) {
        const float val = float(neg(rng) ? -mag(rng) : mag(rng));
        out[(i * x.t.shape[1] + h) * x.t.shape[2] + d] = store(x.t, x.offset({i, h, d}), val);
      }
  return out;
}

// FP8 values: random finite e4m3 bytes (never the NaN codes 0x7f / 0xff); values * scale.
inline std::vector<double> fill_fp8(const HostTensor& x, const std::optional<HostTensor>& scale,
                                    std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t n = x.t.numel(), heads = x.t.shape[1], dim = x.t.shape[2];
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t c;
    do c = uint8_t(byte(rng)); while ((c & 0x78) >= 0x50);  // exponent < 10: |x| < 8, no NaN
    x.data<uint8_t>()[i] = c;
    double s = 1;
    if (scale) {
      const float* sp = scale->data<float>();
      const int64_t token = i / (heads * dim), head = (i / dim) % heads;
      s = scale->t.numel() == 1 ? sp[0] : scale->t.ndim == 1 ? sp[token] : sp[token * heads + head];
    }
    out[i] = s * codec::e4m3_to_float(c);
  }
  return out;
}

inline std::optional<HostTensor> make_scale(Fp8Scale kind, int64_t tokens, int64_t heads,
                                            std::mt19937& rng) {
  std::optional<HostTensor> s;
  if (kind == Fp8Scale::per_tensor) s.emplace(DType::f32, std::vector<int64_t>{1});
  if (kind == Fp8Scale::per_token) s.emplace(DType::f32, std::vector<int64_t>{tokens});
  if (kind == Fp8Scale::per_token_head) s.emplace(DType::f32, std::vector<int64_t>{tokens, heads});
  std::uniform_real_distribution<float> u(0.05f, 0.5f);
  if (s)
    for (int64_t i = 0; i < s->t.numel(); ++i) s->data<float>()[i] = u(rng);
  return s;
}

// q_dtype bf16 | f16 | fp8_e4m3 (with per-token-and-head scales in q_scale); kv_dtype = q_dtype
// (bf16 for FP8 q) or fp8_e4m3 (with `scale`).
inline Problem make_problem(std::vector<int32_t> lq, std::vector<int32_t> lk, int64_t hq,
                            int64_t hkv, int64_t dim, unsigned seed, DType q_dtype = DType::bf16,
                            DType kv_dtype = DType::bf16, Fp8Scale scale = Fp8Scale::none,
                            bool fill_inputs = true) {
  const bool q8 = q_dtype == DType::fp8_e4m3;
  if (kv_dtype != DType::fp8_e4m3) kv_dtype = q8 ? DType::bf16 : q_dtype;
  std::mt19937 rng(seed);
  const std::vector<int32_t> cq = cumulative(lq), ck = cumulative(lk);
  Problem p{hq, hkv, dim, lq, lk,
            HostTensor(q_dtype, {cq.back(), hq, dim}),
            HostTensor(kv_dtype, {ck.back(), hkv, dim}),
            HostTensor(kv_dtype, {ck.back(), hkv, dim}),
            i32_tensor(cq), i32_tensor(ck)};
  if (!fill_inputs) return p;  // shapes only (index tests): q / k / v left as allocated
  if (q8) {
    p.q_scale = make_scale(Fp8Scale::per_token_head, cq.back(), hq, rng);
    p.q_val = fill_fp8(p.q, p.q_scale, rng);
  } else {
    p.q_val = fill_values(p.q, rng, 2.0);  // larger q: peakier softmax
  }
  if (kv_dtype == DType::fp8_e4m3) {
    p.k_scale = make_scale(scale, ck.back(), hkv, rng);
    p.v_scale = make_scale(scale, ck.back(), hkv, rng);
    p.k_val = fill_fp8(p.k, p.k_scale, rng);
    p.v_val = fill_fp8(p.v, p.v_scale, rng);
  } else {
    p.k_val = fill_values(p.k, rng, 1.0);
    p.v_val = fill_values(p.v, rng, 1.0);
  }
  return p;
}

// K and V of p quantized on the host to NVFP4 (global scale 0.75) or MXFP4; k_val / v_val become
// their exact values (f32 holds e2m1 * e4m3 * 0.75 exactly). NaN rows stay NaN (NaN block scales).
inline void quantize_kv_fp4(Problem& p, bool nvfp4) {
  auto one = [&](HostTensor& x, std::optional<HostTensor>& scale, float& global,
                 std::vector<double>& val) {
    const int64_t t = x.t.shape[0], h = x.t.shape[1], d = x.t.shape[2];
    HostTensor values(DType::fp4x2, {t, h, d / 2});
    HostTensor sc(nvfp4 ? DType::fp8_e4m3 : DType::e8m0, {t, h, d / (nvfp4 ? 16 : 32)});
    global = nvfp4 ? 0.75f : 1.f;
    const QTensor qx(values.t, sc.t, global);
    quantize(x.t, nvfp4 ? QuantFormat::nvfp4 : QuantFormat::mxfp4, qx);
    HostTensor exact(DType::f32, {t, h, d});
    dequantize(qx, exact.t);
    val.assign(exact.data<float>(), exact.data<float>() + exact.t.numel());
    x = std::move(values);
    scale = std::move(sc);
  };
  one(p.k, p.k_scale, p.k_global, p.k_val);
  one(p.v, p.v_scale, p.v_global, p.v_val);
}

// A page pool holding the problem's KV: pages handed out in a random order, page_size keys each,
// every slot that holds no key left NaN (the HostTensor poison), page_table columns past a
// batch's last page set to garbage (never read when seqused_k is given). `row_pad` extra
// elements per row make the strides non-contiguous.
struct PagedKV {
  HostTensor k, v, page_table, seqused_k;
  std::optional<HostTensor> k_scale, v_scale;
  KVLayout layout;
  float k_global = 1.f, v_global = 1.f;  // NVFP4 pools
  KVCache cache(bool with_seqused = true) const {
    KVCache kv;
    kv.k = k_scale ? QTensor(k.t, k_scale->t, k_global) : QTensor(k.t);
    kv.v = v_scale ? QTensor(v.t, v_scale->t, v_global) : QTensor(v.t);
    kv.layout = layout;
    kv.page_table = page_table.t;
    if (with_seqused) kv.seqused_k = seqused_k.t;
    return kv;
  }
};

inline HostTensor make_pool(DType dtype, KVLayout layout, int64_t pages, int64_t page_size,
                            int64_t heads, int64_t dim, int64_t row_pad) {
  const int64_t row = dim + row_pad;
  if (layout == KVLayout::paged_nhd)
    return HostTensor(dtype, {pages, page_size, heads, dim},
                      {page_size * heads * row, heads * row, row, 1});
  return HostTensor(dtype, {pages, heads, page_size, dim}, {heads * page_size * row, page_size * row, row, 1});
}

// Copies key `row` of the flat k into slot `slot` of page `page` (raw bytes: bit-exact).
inline void copy_row(const HostTensor& flat, int64_t row, int64_t h, const HostTensor& pool,
                     KVLayout layout, int64_t page, int64_t slot) {
  const size_t es = dtype_size(flat.t.dtype);
  const int64_t dst = layout == KVLayout::paged_nhd ? pool.offset({page, slot, h, 0})
                                                    : pool.offset({page, h, slot, 0});
  std::memcpy(pool.data<uint8_t>() + dst * es, flat.data<uint8_t>() + flat.offset({row, h, 0}) * es,
              flat.t.shape[2] * es);
}

inline PagedKV make_paged(const Problem& p, KVLayout layout, int64_t page_size, unsigned seed,
                          int64_t row_pad = 0, int64_t spare_pages = 3, int64_t extra_columns = 1) {
  std::mt19937 rng(seed);
  const int64_t batch = p.batch();
  int64_t max_pages = extra_columns, used = 0;
  for (int32_t l : p.lk) {
    max_pages = std::max<int64_t>(max_pages, (l + page_size - 1) / page_size + extra_columns);
    used += (l + page_size - 1) / page_size;
  }
  const int64_t pages = used + spare_pages;
  std::vector<int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const DType dt = p.k.t.dtype;
  const int64_t row_elems = p.k.t.shape[2];  // D, or D / 2 bytes of packed FP4
  PagedKV out{make_pool(dt, layout, pages, page_size, p.hkv, row_elems, row_pad),
              make_pool(dt, layout, pages, page_size, p.hkv, row_elems, row_pad),
              HostTensor(DType::i32, {batch, max_pages}), i32_tensor(p.lk), std::nullopt,
              std::nullopt, layout};
  // Scales: FP4 ones a pool of the values' layout (NaN bytes in the slots that hold no key); FP8
  // per tensor as they are, per token (and head) moved to the pool's slots (token
  // page * page_size + slot), every slot that holds no key NaN.
  const bool fp4 = dt == DType::fp4x2;
  const auto pool_scale = [&](const std::optional<HostTensor>& flat) -> std::optional<HostTensor> {
    if (!flat) return std::nullopt;
    if (fp4) {
      std::optional<HostTensor> s;
      s.emplace(make_pool(flat->t.dtype, layout, pages, page_size, p.hkv, flat->t.shape[2], 0));
      std::fill(s->data<uint8_t>(), s->data<uint8_t>() + s->bytes(), uint8_t(0xff));
      return s;
    }
    const bool tensor = flat->t.numel() == 1 && flat->t.ndim == 1;
    std::vector<int64_t> shape{tensor ? 1 : pages * page_size};
    if (flat->t.ndim == 2) shape.push_back(p.hkv);
    std::optional<HostTensor> s;
    s.emplace(DType::f32, shape);
    std::fill(s->data<float>(), s->data<float>() + s->t.numel(),
              tensor ? flat->data<float>()[0] : std::numeric_limits<float>::quiet_NaN());
    return s;
  };
  out.k_global = p.k_global;
  out.v_global = p.v_global;
  out.k_scale = pool_scale(p.k_scale);
  out.v_scale = pool_scale(p.v_scale);
  const auto move_scale = [&](const std::optional<HostTensor>& flat, std::optional<HostTensor>& pool,
                              int64_t row, int64_t slot) {
    if (!flat || fp4 || (flat->t.numel() == 1 && flat->t.ndim == 1)) return;
    const int64_t n = flat->t.ndim == 2 ? p.hkv : 1;
    std::copy(flat->data<float>() + row * n, flat->data<float>() + row * n + n,
              pool->data<float>() + slot * n);
  };
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = (p.lk[b] + page_size - 1) / page_size;
    for (int64_t c = 0; c < max_pages; ++c)
      out.page_table.data<int32_t>()[b * max_pages + c] =
          c < n ? order[next++] : std::numeric_limits<int32_t>::max();
    for (int64_t j = 0; j < p.lk[b]; ++j) {
      const int64_t page = out.page_table.data<int32_t>()[b * max_pages + j / page_size];
      move_scale(p.k_scale, out.k_scale, p.k_start(b) + j, page * page_size + j % page_size);
      move_scale(p.v_scale, out.v_scale, p.k_start(b) + j, page * page_size + j % page_size);
      for (int64_t h = 0; h < p.hkv; ++h) {
        copy_row(p.k, p.k_start(b) + j, h, out.k, layout, page, j % page_size);
        copy_row(p.v, p.k_start(b) + j, h, out.v, layout, page, j % page_size);
        if (fp4) {
          copy_row(*p.k_scale, p.k_start(b) + j, h, *out.k_scale, layout, page, j % page_size);
          copy_row(*p.v_scale, p.k_start(b) + j, h, *out.v_scale, layout, page, j % page_size);
        }
      }
    }
  }
  return out;
}

// Random q2k [Hkv, total_q, topk] for requests of lq[b] queries over lk[b] keys: each (head,
// token) picks up to `topk` distinct blocks of its request (any, visible or not) at random;
// sorted rows are ascending and -1 padded at the end, unsorted rows put ids and -1 in random slots.
inline std::vector<int32_t> random_q2k(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk,
                                       int64_t hkv, int64_t topk, int64_t blk, std::mt19937& rng,
                                       bool sorted = true) {
  const int64_t total_q = std::accumulate(lq.begin(), lq.end(), int64_t(0));
  std::vector<int32_t> q2k(hkv * total_q * topk, -1);
  for (int64_t h = 0; h < hkv; ++h)
    for (size_t b = 0, t = 0; b < lq.size(); ++b)
      for (int64_t i = 0; i < lq[b]; ++i, ++t) {
        std::vector<int32_t> ids((lk[b] + blk - 1) / blk);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        const int64_t n = std::min<int64_t>(std::uniform_int_distribution<int64_t>(0, topk)(rng),
                                            int64_t(ids.size()));
        ids.resize(n);
        ids.resize(topk, -1);
        if (sorted) std::sort(ids.begin(), ids.begin() + n);
        else std::shuffle(ids.begin(), ids.end(), rng);
        std::copy(ids.begin(), ids.end(), q2k.begin() + (h * total_q + int64_t(t)) * topk);
      }
  return q2k;
}

// The same for problem p's lengths, from a fresh generator seeded with `seed`.
inline std::vector<int32_t> random_q2k(const Problem& p, int64_t topk, int64_t blk, unsigned seed,
                                       bool sorted = true) {
  std::mt19937 rng(seed);
  return random_q2k(p.lq, p.lk, p.hkv, topk, blk, rng, sorted);
}

inline HostTensor q2k_tensor(const std::vector<int32_t>& ids, int64_t hkv, int64_t total_q,
                             int64_t topk) {
  HostTensor t(DType::i32, {hkv, total_q, topk});
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

struct Reference {
  std::vector<double> out;   // [total_q, Hq, D]
  std::vector<double> lse;   // [Hq, total_q]
  std::vector<double> tlse;  // [Hq, total_q], when temperature > 0
};

// Dense attention's visibility (docs/semantics.md, Dense attention) as plain host data: per-batch
// causal offsets replacing the bottom-right rule, and a key mask with one row per batch or per
// query token.
struct Visibility {
  std::vector<int32_t> causal_offset;  // [B]; empty: the bottom-right rule
  std::vector<uint8_t> mask;           // [rows, lk_max] row-major, nonzero = visible; empty: none
  bool per_query = false;              // mask rows: one per query token (else one per batch)
  int64_t lk_max = 0;

  // Whether query i (token t) of batch b sees key j of its lk keys, lq queries.
  bool sees(bool causal, int64_t b, int64_t i, int64_t t, int64_t j, int64_t lq, int64_t lk) const {
    bool use = causal_offset.empty() ? !causal || j <= i + lk - lq : j <= i + int64_t(causal_offset[b]);
    if (!mask.empty()) use = use && mask[(per_query ? t : b) * lk_max + j] != 0;
    return use;
  }
};

// Brute force from docs/semantics.md, Attention: for every query, a mask over every key of its
// batch (visible under the causal rule or the offsets and key mask of `vis`, and in a selected
// block when q2k is given); scores soft-capped when prm.soft_cap > 0.
inline Reference reference_attention(const Problem& p, const std::vector<int32_t>* q2k,
                                     int64_t topk, const AttentionParams& prm,
                                     const Visibility& vis = {}) {
  const int64_t total_q = p.total_q(), g = p.hq / p.hkv, D = p.dim, blk = prm.kv_block_size;
  const double scale = prm.softmax_scale != 0.f ? prm.softmax_scale : float(1.0 / std::sqrt(double(D)));
  Reference r{std::vector<double>(total_q * p.hq * D), std::vector<double>(p.hq * total_q),
              std::vector<double>(p.hq * total_q)};
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t i = 0; i < p.lq[b]; ++i)
      for (int64_t hq = 0; hq < p.hq; ++hq) {
        const int64_t t = p.q_start(b) + i, h = hq / g;
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < p.lk[b]; ++j) {
          bool use = vis.sees(prm.causal, b, i, t, j, p.lq[b], p.lk[b]);
          if (q2k) {
            const int32_t* row = q2k->data() + (h * total_q + t) * topk;
            use = use && std::find(row, row + topk, int32_t(j / blk)) != row + topk;
          }
          if (!use) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += p.q_val[(t * p.hq + hq) * D + d] * p.k_val[((p.k_start(b) + j) * p.hkv + h) * D + d];
          const double sj = scale * dot;
          s.push_back(prm.soft_cap > 0 ? prm.soft_cap * std::tanh(sj / prm.soft_cap) : sj);
          keys.push_back(p.k_start(b) + j);
        }
        double* o = &r.out[(t * p.hq + hq) * D];
        if (keys.empty()) {
          r.lse[hq * total_q + t] = r.tlse[hq * total_q + t] = -kInf;
          continue;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0, tsum = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(s[n] - m);
          sum += w;
          if (prm.temperature > 0) tsum += std::exp((s[n] - m) / prm.temperature);
          for (int64_t d = 0; d < D; ++d) o[d] += w * p.v_val[(keys[n] * p.hkv + h) * D + d];
        }
        for (int64_t d = 0; d < D; ++d) o[d] /= sum;
        r.lse[hq * total_q + t] = m + std::log(sum);
        r.tlse[hq * total_q + t] = prm.temperature > 0 ? m / prm.temperature + std::log(tsum) : 0;
      }
  return r;
}

// Outputs of one attention call, poisoned (NaN) before the run by HostTensor.
struct Outputs {
  HostTensor out, lse, tlse;
  Outputs(DType dtype, int64_t total_q, int64_t hq, int64_t dim)
      : out(dtype, {total_q, hq, dim}), lse(DType::f32, {hq, total_q}), tlse(DType::f32, {hq, total_q}) {}
};

inline AttentionArgs make_args(const Problem& p, const KVCache& kv, const Outputs& o,
                               const HostTensor* q2k, const AttentionParams& prm) {
  AttentionArgs a;
  a.q = p.q.t;
  if (p.q_scale) a.q_scale = p.q_scale->t;
  a.kv = kv;
  a.cu_seqlens_q = p.cu_q.t;
  if (q2k) a.q2k = q2k->t;
  a.out = o.out.t;
  a.lse = o.lse.t;
  if (prm.temperature > 0) a.tlse = o.tlse.t;
  a.params = prm;
  return a;
}

inline Outputs run_attention(const Problem& p, const KVCache& kv, const HostTensor* q2k,
                             const AttentionParams& prm) {
  Outputs o(p.out_dtype(), p.total_q(), p.hq, p.dim);
  attention_forward(make_args(p, kv, o, q2k, prm));
  return o;
}

// Every element written and within one rounding of the reference: out to its dtype (relative
// 2^-8 bf16, 2^-10 f16), lse / tlse to f32; -inf exactly where the reference has -inf.
inline void expect_matches(const Outputs& o, const Reference& r, bool check_tlse = false) {
  const Tensor& out = o.out.t;
  const double rel = out.dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 1024;
  int64_t bad = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double got = load(out, i), want = r.out[i];
    if (!(std::fabs(got - want) <= rel * std::fabs(want) + 1e-7) && bad++ < 5)
      ADD_FAILURE() << "out[" << i << "] = " << got << ", reference " << want;
  }
  auto check_stat = [&](const HostTensor& t, const std::vector<double>& want, const char* name) {
    for (int64_t i = 0; i < t.t.numel(); ++i) {
      const double got = t.data<float>()[i];
      const bool ok = want[i] == -kInf ? got == -kInf
                                       : std::fabs(got - want[i]) <= 1e-6 * std::max(1.0, std::fabs(want[i]));
      if (!ok && bad++ < 10) ADD_FAILURE() << name << "[" << i << "] = " << got << ", reference " << want[i];
    }
  };
  check_stat(o.lse, r.lse, "lse");
  if (check_tlse) check_stat(o.tlse, r.tlse, "tlse");
  EXPECT_EQ(bad, 0);
}

// Bitwise equality of two outputs of the same shape (contiguous).
inline void expect_same_bits(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(std::memcmp(a.out.data<uint8_t>(), b.out.data<uint8_t>(), a.out.bytes()), 0) << "out differs";
  EXPECT_EQ(std::memcmp(a.lse.data<uint8_t>(), b.lse.data<uint8_t>(), a.lse.bytes()), 0) << "lse differs";
}

// One kv head, D = 8: q = 0.25 everywhere, k0 = 0.25, k1 = 0.5 everywhere, so with scale 1 the
// logits are s0 = 8 * 0.0625 = 0.5 and s1 = 8 * 0.125 = 1; v0[d] = d + 1, v1[d] = -(d + 1) / 2.
// (tests/cpu/test_attention.cpp, test_attention_dense.cpp)
struct HandCase {
  HostTensor q, k, v, cu_q, cu_k;
  HandCase(int32_t lq) : q(DType::bf16, {lq, 1, 8}), k(DType::bf16, {2, 1, 8}), v(DType::bf16, {2, 1, 8}),
                         cu_q(i32_tensor({0, lq})), cu_k(i32_tensor({0, 2})) {
    for (int64_t d = 0; d < 8; ++d) {
      for (int32_t i = 0; i < lq; ++i) store(q.t, i * 8 + d, 0.25f);
      store(k.t, d, 0.25f);
      store(k.t, 8 + d, 0.5f);
      store(v.t, d, float(d + 1));
      store(v.t, 8 + d, -float(d + 1) / 2);
    }
  }
  Outputs run(const AttentionParams& prm) const {
    Outputs o(DType::bf16, q.t.shape[0], 1, 8);
    AttentionArgs a;
    a.q = q.t;
    a.kv.k = k.t;
    a.kv.v = v.t;
    a.kv.cu_seqlens_k = cu_k.t;
    a.cu_seqlens_q = cu_q.t;
    a.out = o.out.t;
    a.lse = o.lse.t;
    a.params = prm;
    attention_forward(a);
    return o;
  }
};

}  // namespace msa::test
