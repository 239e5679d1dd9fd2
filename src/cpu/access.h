// Shared by the whole CPU backend (block scores, top-K, attention, CSR, quant): read a
// dequantized row of a QTensor (q, or K/V of a flat or paged KVCache) as double, write a double
// into an f32/bf16/f16 tensor with one rounding, and the causal visibility rule (docs/semantics.md,
// Visibility). Keep this API small and stable: several CPU files depend on it. Arguments are
// validated by src/api before any of this runs, so these helpers do not re-check shapes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "backend.h"
#include "common/codecs.h"
#include "common/fp4_scale_layout.h"

namespace msa::cpu {

// Top-K selection's order of blocks (docs/semantics.md, Top-K selection): block a (group score
// sa) before block b when its score is higher, NaN below every number, ties toward the lower id.
// Shared by select_topk and the ICP merge, which must rank exactly alike.
inline bool block_ranks_before(float sa, int64_t a, float sb, int64_t b) {
  if (std::isnan(sa) != std::isnan(sb)) return std::isnan(sb);
  if (!std::isnan(sa) && sa != sb) return sa > sb;
  return a < b;
}

// Exclusive end of the batch-local keys visible to batch-local query i (docs/semantics.md,
// Visibility): causal is bottom-right aligned, query i sees key j iff j <= i + lk - lq.
inline int64_t visible_key_end(int64_t i, int64_t lq, int64_t lk, bool causal) {
  if (!causal) return lk;
  return std::clamp<int64_t>(i + lk - lq + 1, 0, lk);
}

// The cu_seqlens [B+1] int32 host tensor as 64-bit offsets.
inline std::vector<int64_t> host_offsets(const Tensor& cu) {
  std::vector<int64_t> off(cu.numel());
  for (int64_t b = 0; b < cu.numel(); ++b) off[b] = cu.ptr<int32_t>()[b];
  return off;
}

// One quantized value tensor plus its scales: decodes D logical elements that start at a given
// element offset of x.values (fp4x2: offsets count bytes, as the tensor view's strides do).
// The result is exact in double: every format's value * scale (* global) fits in 53 bits.
class RowDecoder {
 public:
  RowDecoder(const QTensor& x, int64_t head_dim)
      : x_(x), dim_(head_dim), preordered_(x.values.dtype == DType::fp4x2 && x.scale.ndim == 6) {}

  // Whether the FP4 scales come in the preordered layout (quant.h, reorder_fp4_scales), and the
  // offset of the scales of (matrix l, row m) there.
  bool preordered() const { return preordered_; }
  int64_t preordered_row(int64_t l, int64_t m) const {
    return fp4_layout::row_offset(l, m, x_.scale.shape[1], x_.scale.shape[2]);
  }

  // `token`, `head`: the indices the scales are looked up with (ignored for per-tensor scales;
  // preordered FP4 scales: matrix `head`, row `token`); `fp4_scale_row`: the offset of the row's
  // FP4 scales instead (page pools; preordered: a preordered_row). An offset, not an index:
  // negative strides make it negative.
  void decode(int64_t offset, int64_t token, int64_t head, double* out,
              std::optional<int64_t> fp4_scale_row = std::nullopt) const {
    const Tensor& v = x_.values;
    switch (v.dtype) {
      case DType::bf16:
        for (int64_t d = 0; d < dim_; ++d) out[d] = codec::bf16_to_float(v.ptr<uint16_t>()[offset + d]);
        return;
      case DType::f16:
        for (int64_t d = 0; d < dim_; ++d) out[d] = codec::f16_to_float(v.ptr<uint16_t>()[offset + d]);
        return;
      case DType::fp8_e4m3: {
        const double s = fp8_scale(token, head);
        for (int64_t d = 0; d < dim_; ++d) out[d] = s * codec::e4m3_to_float(v.ptr<uint8_t>()[offset + d]);
        return;
      }
      case DType::fp4x2: {
        const uint8_t* row = v.ptr<uint8_t>() + offset;
        const Tensor& s = x_.scale;
        const int64_t srow = fp4_scale_row ? *fp4_scale_row
                             : preordered_  ? preordered_row(head, token)
                                            : token * s.strides[0] + head * s.strides[1];
        for (int64_t d = 0; d < dim_; ++d) out[d] = fp4_scale(srow, d) * codec::fp4x2_get(row, d);
        return;
      }
      default:
        fail("cpu: unsupported value dtype ", dtype_name(v.dtype));
    }
  }

 private:
  // fp8 scale: absent -> 1; [1] per tensor; [T] per token; [T, H] per token and head.
  double fp8_scale(int64_t token, int64_t head) const {
    const Tensor& s = x_.scale;
    if (!s.defined()) return 1.0;
    const float* p = s.ptr<float>();
    if (s.numel() == 1) return p[0];
    if (s.ndim == 1) return p[token * s.strides[0]];
    return p[token * s.strides[0] + head * s.strides[1]];
  }
  // NVFP4: e4m3 scale per 16 elements times global_scale; MXFP4: e8m0 scale per 32 elements.
  // `row`: the element offset of the (token, head) row's scales; its groups are contiguous in the
  // public layout, in tiles of 4 in the preordered one.
  double fp4_scale(int64_t row, int64_t d) const {
    const Tensor& s = x_.scale;
    const bool nv = s.dtype == DType::fp8_e4m3;
    const int64_t g = d / (nv ? 16 : 32);
    const uint8_t b = s.ptr<uint8_t>()[row + (preordered_ ? fp4_layout::group_offset(g) : g)];
    return nv ? double(codec::e4m3_to_float(b)) * double(x_.global_scale)
              : double(codec::e8m0_to_float(b));
  }

  QTensor x_;
  int64_t dim_;
  bool preordered_;
};

// Rows of q [total_q, H, D] (fp4x2: [total_q, H, D/2]); t is the global token index.
class QReader {
 public:
  QReader(const QTensor& q, int64_t head_dim) : q_(q.values), dec_(q, head_dim) {}
  void row(int64_t t, int64_t h, double* out_D) const {
    dec_.decode(t * q_.strides[0] + h * q_.strides[1], t, h, out_D);
  }

 private:
  Tensor q_;
  RowDecoder dec_;
};

enum class KVPart : uint8_t { k, v };

// Rows of K (or V) of a KVCache by (batch, batch-local key index, kv head), flat or paged.
// Paged caches are read through page_table. Validation range-checked its ids, but the table is
// the caller's memory and the bindings release the GIL: another thread may write it during the
// call. So every id is checked again where it is read; one out of range gives a NaN row, never an
// out-of-bounds read, and marks the reader (table_changed) for the op to report after its loops
// (an exception cannot leave an OpenMP region).
class KeyReader {
 public:
  KeyReader(const KVCache& kv, const ProblemShape& s, KVPart part = KVPart::k)
      : kv_(kv),
        t_(part == KVPart::k ? kv.k.values : kv.v.values),
        scale_(part == KVPart::k ? kv.k.scale : kv.v.scale),
        dec_(part == KVPart::k ? kv.k : kv.v, s.head_dim),
        dim_(s.head_dim),
        heads_(s.num_kv_heads),
        page_size_(s.page_size),
        lengths_(host_key_lengths(kv, s)) {
    if (kv.layout == KVLayout::flat) starts_ = host_offsets(kv.cu_seqlens_k);
  }

  // Whether a page id read at use was out of range (the table changed after validation).
  bool table_changed() const { return changed_.load(std::memory_order_relaxed); }
  // Throws msa::Error for `op` if table_changed().
  void check_table_unchanged(const char* op) const {
    MSA_CHECK(!table_changed(), op, ": page_table: a page id was out of range when read, after "
              "it passed validation (the table was written during the call); the outputs are "
              "not valid");
  }

  int64_t batch() const { return int64_t(lengths_.size()); }
  int64_t length(int64_t b) const { return lengths_[b]; }  // Lk_b
  const std::vector<int64_t>& lengths() const { return lengths_; }

  void row(int64_t b, int64_t j_local, int64_t h, double* out_D) const {
    if (kv_.layout == KVLayout::flat) {
      const int64_t t = starts_[b] + j_local;
      dec_.decode(t * t_.strides[0] + h * t_.strides[1], t, h, out_D);
      return;
    }
    const Tensor& pt = kv_.page_table;
    const int64_t page = pt.ptr<int32_t>()[b * pt.strides[0] + (j_local / page_size_) * pt.strides[1]];
    if (page < 0 || page >= t_.shape[0]) {
      changed_.store(true, std::memory_order_relaxed);
      std::fill(out_D, out_D + dim_, std::numeric_limits<double>::quiet_NaN());
      return;
    }
    const int64_t slot = j_local % page_size_;
    const int64_t off = kv_.layout == KVLayout::paged_nhd
                            ? page * t_.strides[0] + slot * t_.strides[1] + h * t_.strides[2]
                            : page * t_.strides[0] + h * t_.strides[1] + slot * t_.strides[2];
    // FP8 scales of a page pool are indexed by pool slot (validate.cpp): token page * page_size +
    // slot; FP4 scales are a pool of the values' layout, or preordered with one matrix of 128
    // rows per (page, head).
    std::optional<int64_t> fp4_row;
    if (t_.dtype == DType::fp4x2) {
      const Tensor& sc = scale_;
      fp4_row = dec_.preordered() ? dec_.preordered_row(page * heads_ + h, slot)
                : kv_.layout == KVLayout::paged_nhd
                    ? page * sc.strides[0] + slot * sc.strides[1] + h * sc.strides[2]
                    : page * sc.strides[0] + h * sc.strides[1] + slot * sc.strides[2];
    }
    dec_.decode(off, page * page_size_ + slot, h, out_D, fp4_row);
  }

 private:
  KVCache kv_;
  Tensor t_;
  Tensor scale_;  // the part's scales
  RowDecoder dec_;
  int64_t dim_;
  int64_t heads_;  // Hkv
  int64_t page_size_;
  std::vector<int64_t> lengths_;
  std::vector<int64_t> starts_;  // flat only: cu_seqlens_k
  mutable std::atomic<bool> changed_{false};
};


// Writes v into element `offset` of an f32 / bf16 / f16 tensor, rounding once to nearest even.
inline void store_value(const Tensor& t, int64_t offset, double v) {
  switch (t.dtype) {
    case DType::f32: t.ptr<float>()[offset] = float(v); return;
    case DType::bf16: t.ptr<uint16_t>()[offset] = codec::double_to_bf16(v); return;
    case DType::f16: t.ptr<uint16_t>()[offset] = codec::double_to_f16(v); return;
    default: fail("cpu: cannot store into dtype ", dtype_name(t.dtype));
  }
}

// Reads element `offset` of an f32 / bf16 / f16 tensor.
inline double load_value(const Tensor& t, int64_t offset) {
  switch (t.dtype) {
    case DType::f32: return t.ptr<float>()[offset];
    case DType::bf16: return codec::bf16_to_float(t.ptr<uint16_t>()[offset]);
    case DType::f16: return codec::f16_to_float(t.ptr<uint16_t>()[offset]);
    default: fail("cpu: cannot load from dtype ", dtype_name(t.dtype));
  }
}

}  // namespace msa::cpu
