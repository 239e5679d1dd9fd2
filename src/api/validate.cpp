// Shared argument rules (validate.h).
#include "api/validate.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "common/fp4_scale_layout.h"

namespace msa::api {

void check_attention_out(const Tensor& out, DType q, const ProblemShape& s, Device device) {
  check_defined(out, "out");
  const DType out_dtype = attention_out_dtype(q);
  MSA_CHECK(out.dtype == out_dtype, "out: dtype must be ", dtype_name(out_dtype), " for ",
            dtype_name(q), " q, got ", dtype_name(out.dtype));
  check_shape(out, "out", {s.total_q, s.num_q_heads, s.head_dim});
  check_last_dim_contiguous(out, "out");
  MSA_CHECK(out.device == device, "out: must be on ", device_name(device), ", got ",
            device_name(out.device));
}

void check_cu_seqlens(const Tensor& cu, const char* name, int64_t batch, int64_t total,
                      Device device) {
  check_defined(cu, name);
  check_dtype(cu, name, {DType::i32});
  check_shape(cu, name, {batch + 1});
  check_contiguous(cu, name);
  MSA_CHECK(cu.device == device, name, ": must be on ", device_name(device), ", got ",
            device_name(cu.device));
  if (cu.is_cuda()) return;  // values checked on the device
  const int32_t* c = cu.ptr<int32_t>();
  MSA_CHECK(c[0] == 0, name, ": must start at 0, got ", c[0]);
  for (int64_t b = 0; b < batch; ++b)
    MSA_CHECK(c[b + 1] >= c[b], name, ": must be non-decreasing, but [", b + 1, "] = ", c[b + 1],
              " < [", b, "] = ", c[b]);
  MSA_CHECK(c[batch] == total, name, ": last entry must equal the token count ", total,
            ", got ", c[batch]);
}

void check_scale_values(const QTensor& x, const char* name) {
  const std::string sn = std::string(name) + ".scale";
  if (x.values.dtype == DType::fp4x2 && x.scale.dtype == DType::fp8_e4m3)
    MSA_CHECK(std::isfinite(x.global_scale) && x.global_scale > 0.f, name,
              ": NVFP4 global scale must be finite and > 0, got ", x.global_scale);
  const Tensor& sc = x.scale;
  if (x.values.dtype != DType::fp8_e4m3 || !sc.defined() || sc.is_cuda()) return;
  for (int64_t i = 0; i < sc.numel(); ++i) {
    const float v = sc.ptr<float>()[i];
    MSA_CHECK(std::isfinite(v) && v >= 0.f, sn, ": FP8 scales must be finite and >= 0, got ", v,
              " at element ", i);
  }
}

void check_kv_scale_values(const KVCache& kv, const ProblemShape& s) {
  for (const auto& [x, name] : {std::pair{&kv.k, "k"}, std::pair{&kv.v, "v"}}) {
    if (!x->values.defined()) continue;
    const Tensor& sc = x->scale;
    const bool per_slot = x->values.dtype == DType::fp8_e4m3 && sc.defined() && !sc.is_cuda() &&
                          sc.numel() > 1 && kv.layout != KVLayout::flat;
    if (!per_slot) {
      check_scale_values(*x, name);
      continue;
    }
    // Pool slot page * page_size + j % page_size of each key j < Lk_b (validate.cpp: the scale's
    // token index); per slot and head: Hkv values each.
    const int64_t per = sc.ndim == 2 ? sc.shape[1] : 1;
    const Tensor& pt = kv.page_table;
    const std::vector<int64_t> lengths = host_key_lengths(kv, s);
    for (int64_t b = 0; b < int64_t(lengths.size()); ++b)
      for (int64_t j = 0; j < lengths[b]; ++j) {
        const int64_t page = pt.ptr<int32_t>()[b * pt.strides[0] + (j / s.page_size) * pt.strides[1]];
        const int64_t slot = page * s.page_size + j % s.page_size;
        for (int64_t h = 0; h < per; ++h) {
          const float v = sc.ptr<float>()[slot * per + h];
          MSA_CHECK(std::isfinite(v) && v >= 0.f, name, ".scale: FP8 scales must be finite and >= 0,"
                    " got ", v, " for key ", j, " of batch ", b, " (pool slot ", slot, ")");
        }
      }
  }
}

// An FP4 tensor's scale: defined, on the values' device, e4m3 (NVFP4) or e8m0 (MXFP4), with a
// head dim that its groups divide; returns the groups per row, D / 16 or D / 32.
static int64_t fp4_scale_groups(const QTensor& x, const char* name, int64_t dim) {
  const Tensor& sc = x.scale;
  const std::string sn = std::string(name) + ".scale";
  check_defined(sc, sn.c_str());
  check_same_device(x.values, name, sc, sn.c_str());
  check_dtype(sc, sn.c_str(), {DType::fp8_e4m3, DType::e8m0});
  const int64_t group = sc.dtype == DType::fp8_e4m3 ? 16 : 32;
  MSA_CHECK(dim % group == 0, name, ": head dim ", dim, " must be a multiple of ", group, " for ",
            sc.dtype == DType::fp8_e4m3 ? "NVFP4" : "MXFP4");
  return dim / group;
}

// A 6-D FP4 scale where only the public layout is read.
static void refuse_preordered(const std::string& sn, bool preordered_ok, const char* public_shape) {
  MSA_CHECK(preordered_ok, sn, ": the preordered (6-D) FP4 scale layout is read by the indexer "
            "only (block_scores, block_topk); this op takes the public layout ", public_shape);
}

void check_preordered_fp4_scale(const Tensor& sc, const char* name, int64_t matrices,
                                int64_t rest_m, int64_t rest_g, const char* rule) {
  const int64_t want[6] = {matrices, rest_m, rest_g, 32, 4, 4};
  bool same = sc.ndim == 6;
  for (int d = 0; same && d < 6; ++d) same = sc.shape[d] == want[d];
  MSA_CHECK(same, name, ": preordered FP4 scales must be [", matrices, ", ", rest_m, ", ", rest_g,
            ", 32, 4, 4] (", rule, "), got ", sc.describe());
  check_contiguous(sc, name);
}

void check_qtensor_scale(const QTensor& x, const char* name, int64_t tokens, int64_t heads,
                         int64_t dim, bool preordered_ok) {
  const Tensor& sc = x.scale;
  const std::string sn = std::string(name) + ".scale";
  switch (x.values.dtype) {
    case DType::bf16:
    case DType::f16:
      MSA_CHECK(!sc.defined(), sn, ": must be absent for ", dtype_name(x.values.dtype), " values");
      return;
    case DType::fp8_e4m3:
      if (!sc.defined()) return;
      check_same_device(x.values, name, sc, sn.c_str());
      check_dtype(sc, sn.c_str(), {DType::f32});
      check_contiguous(sc, sn.c_str());
      MSA_CHECK((sc.ndim == 1 && (sc.shape[0] == 1 || sc.shape[0] == tokens)) ||
                    (sc.ndim == 2 && sc.shape[0] == tokens && sc.shape[1] == heads),
                sn, ": fp8 scales must be [1], [", tokens, "] or [", tokens, ", ", heads,
                "], got ", sc.describe());
      return;
    case DType::fp4x2: {
      const int64_t groups = fp4_scale_groups(x, name, dim);
      if (sc.ndim == 6) {
        refuse_preordered(sn, preordered_ok, "[T, H, D / group]");
        check_preordered_fp4_scale(sc, sn.c_str(), heads, fp4_layout::rest_rows(tokens),
                                   fp4_layout::rest_groups(groups),
                                   "[H, ceil(T / 128), ceil(G / 4), 32, 4, 4] with G = D / group");
        return;
      }
      check_shape(sc, sn.c_str(), {tokens, heads, groups});
      check_last_dim_contiguous(sc, sn.c_str());
      return;
    }
    default:
      fail(name, ": unsupported value dtype ", dtype_name(x.values.dtype));
  }
}

static void check_page_size(int64_t page_size, const KVCache& kv) {
  MSA_CHECK(page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128 ||
                page_size == 256,
            "k: page size must be 16, 32, 64, 128 or 256, got ", page_size, " (layout ",
            kv_layout_name(kv.layout), ", ", kv.k.values.describe(), ")");
}

ProblemShape check_kv_lengths(const KVCache& kv, int64_t batch, Device device) {
  ProblemShape s;
  s.batch = batch;
  const Tensor& k = kv.k.values;
  if (k.defined())
    MSA_CHECK(k.device == device, "k: must be on ", device_name(device), " (q2k's device), got ",
              device_name(k.device));
  if (kv.layout == KVLayout::flat) {
    MSA_CHECK(!kv.page_table.defined(), "page_table: must be absent for a flat KV cache");
    const Tensor& cu = kv.cu_seqlens_k;
    check_defined(cu, "cu_seqlens_k");
    check_dtype(cu, "cu_seqlens_k", {DType::i32});
    // B comes from cu_seqlens_q in every caller: say so, since either array may be the wrong one.
    MSA_CHECK(cu.ndim == 1 && cu.shape[0] == batch + 1, "cu_seqlens_k: shape must be [B+1] = [",
              batch + 1, "] for the B = ", batch, " requests of cu_seqlens_q, got ",
              cu.describe());
    // Contiguous before its last entry is read below.
    check_contiguous(cu, "cu_seqlens_k");
    // Without k the total is whatever the last entry says (only the lengths matter here).
    if (k.defined()) check_ndim(k, "k", 3);
    const int64_t total_k = k.defined() ? k.shape[0] : cu.is_cuda() ? 0 : cu.ptr<int32_t>()[batch];
    check_cu_seqlens(cu, "cu_seqlens_k", batch, total_k, device);
    return s;
  }
  MSA_CHECK(k.defined(), "k: required for a paged KV cache (its shape gives page_size)");
  check_ndim(k, "k", 4);
  MSA_CHECK(!kv.cu_seqlens_k.defined(), "cu_seqlens_k: must be absent for a paged KV cache "
            "(lengths come from seqused_k)");
  s.num_pages = k.shape[0];
  s.page_size = kv.layout == KVLayout::paged_nhd ? k.shape[1] : k.shape[2];
  check_page_size(s.page_size, kv);
  const Tensor& pt = kv.page_table;
  check_defined(pt, "page_table");
  check_dtype(pt, "page_table", {DType::i32});
  check_ndim(pt, "page_table", 2);
  MSA_CHECK(pt.shape[0] == batch, "page_table: first dim must be B = ", batch, ", got ",
            pt.describe());
  MSA_CHECK(pt.device == device, "page_table: must be on ", device_name(device));
  s.max_pages = pt.shape[1];
  // A request holds at most 2^31 - 1 keys (lengths are int32), so a wider table is a caller's
  // error; the bound also keeps max_pages * page_size, the length without seqused_k, in range.
  MSA_CHECK(s.max_pages <= INT32_MAX / s.page_size, "page_table: ", s.max_pages, " columns of ",
            s.page_size, " keys are more than the 2^31 - 1 keys a request holds, got ",
            pt.describe());
  const Tensor& su = kv.seqused_k;
  if (!su.defined()) return s;
  check_dtype(su, "seqused_k", {DType::i32});
  check_shape(su, "seqused_k", {batch});
  check_contiguous(su, "seqused_k");
  MSA_CHECK(su.device == device, "seqused_k: must be on ", device_name(device));
  if (su.is_cuda()) return s;
  const int64_t cap = s.max_pages * s.page_size;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lk = su.ptr<int32_t>()[b];
    MSA_CHECK(lk >= 0 && lk <= cap, "seqused_k: entry ", b, " = ", lk, " must be in [0, ", cap,
              "] (max_pages * page_size)");
  }
  return s;
}

// An FP4 page pool's scales: a pool of the values' layout, one scale per group along D (NVFP4:
// e4m3 per 16, MXFP4: e8m0 per 32), any strides but a contiguous last dim, so the four regions of
// a page (K values, K scales, V values, V scales) may be strided views of one allocation.
// Or, where `preordered_ok`, the preordered layout of a pool of 128-slot pages.
static void check_fp4_pool_scale(const QTensor& x, const char* name, const ProblemShape& s,
                                 bool preordered_ok) {
  const Tensor& sc = x.scale;
  const std::string sn = std::string(name) + ".scale";
  const int64_t groups = fp4_scale_groups(x, name, s.head_dim);
  if (sc.ndim == 6) {
    refuse_preordered(sn, preordered_ok, "[num_pages, page_size, Hkv, D / group] (or hnd)");
    MSA_CHECK(s.page_size == fp4_layout::kTileRows, sn, ": preordered FP4 scales of a page pool "
              "need page_size 128 (each page is one 128-row tile), got page_size ", s.page_size);
    int64_t matrices = 0;
    MSA_CHECK(!__builtin_mul_overflow(s.num_pages, s.num_kv_heads, &matrices), name,
              ": num_pages * Hkv overflows int64, got ", x.values.describe());
    check_preordered_fp4_scale(sc, sn.c_str(), matrices, 1,
                               fp4_layout::rest_groups(groups),
                               "[num_pages * Hkv, 1, ceil(G / 4), 32, 4, 4] with G = D / group");
    return;
  }
  const Tensor& v = x.values;
  check_shape(sc, sn.c_str(), {v.shape[0], v.shape[1], v.shape[2], groups});
  check_last_dim_contiguous(sc, sn.c_str());
}

int64_t logical_last_dim(const Tensor& t, const char* name) {
  const int64_t stored = t.shape[t.ndim - 1];
  if (t.dtype != DType::fp4x2) return stored;
  MSA_CHECK(stored <= INT64_MAX / 2, name, ": last dim of ", stored,
            " bytes holds more FP4 values than int64 counts, got ", t.describe());
  return 2 * stored;
}

ProblemShape check_q_and_kv(const QTensor& qt, const KVCache& kv, const Tensor& cu_seqlens_q,
                            std::initializer_list<DType> values, bool need_v, bool kv_may_be_quantized,
                            int kv_block_size, bool preordered_fp4_scales) {
  const Tensor& q = qt.values;
  check_defined(q, "q");
  check_dtype(q, "q", values);
  check_ndim(q, "q", 3);
  check_last_dim_contiguous(q, "q");
  MSA_CHECK(kv_block_size == 1 || kv_block_size == 64 || kv_block_size == 128,
            "kv_block_size: must be 1 (token ids), 64 or 128, got ", kv_block_size);
  ProblemShape s;
  s.total_q = q.shape[0];
  s.num_q_heads = q.shape[1];
  s.head_dim = logical_last_dim(q, "q");
  s.kv_block_size = kv_block_size;
  MSA_CHECK(s.num_q_heads > 0, "q: number of heads must be > 0, got ", q.describe());
  MSA_CHECK(s.head_dim > 0, "q: head dim must be > 0, got ", q.describe());
  check_qtensor_scale(qt, "q", s.total_q, s.num_q_heads, s.head_dim, preordered_fp4_scales);

  const Tensor& k = kv.k.values;
  check_defined(k, "k");
  check_same_device(q, "q", k, "k");
  if (kv_may_be_quantized && (k.dtype == DType::fp8_e4m3 || k.dtype == DType::fp4x2)) {
    // quantized KV (FP8, or FP4) under any query dtype attention takes
  } else if (kv_may_be_quantized && q.dtype == DType::fp8_e4m3) {
    MSA_CHECK(k.dtype == DType::bf16, "k: FP8 queries take bf16, fp8_e4m3 or fp4x2 keys, got ",
              dtype_name(k.dtype));
  } else {
    MSA_CHECK(k.dtype == q.dtype, "k: dtype must equal q's (", dtype_name(q.dtype), "), got ",
              dtype_name(k.dtype));
  }
  check_last_dim_contiguous(k, "k");
  const bool flat = kv.layout == KVLayout::flat;
  check_ndim(k, "k", flat ? 3 : 4);
  const int64_t kdim = logical_last_dim(k, "k");
  MSA_CHECK(kdim == s.head_dim, "k: head dim must equal q's (", s.head_dim, "), got ", k.describe());
  s.num_kv_heads = flat ? k.shape[1] : (kv.layout == KVLayout::paged_nhd ? k.shape[2] : k.shape[1]);
  MSA_CHECK(s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0,
            "k: kv heads (", s.num_kv_heads, ") must divide q heads (", s.num_q_heads, ")");
  s.group = s.num_q_heads / s.num_kv_heads;
  // Any GQA group up to 128 for dense attention; the sparse path narrows it (check_q2k:
  // check_sparse_group), the CUDA kernels too (common/problem.h check_cuda_group).
  MSA_CHECK(s.group <= 128, "q: GQA group Hq/Hkv must be at most 128, got ", s.group, " (",
            s.num_q_heads, " query heads on ", s.num_kv_heads, " kv heads)");

  if (need_v) {
    const Tensor& v = kv.v.values;
    check_defined(v, "v");
    check_same_device(q, "q", v, "v");
    MSA_CHECK(v.dtype == k.dtype, "v: dtype must equal k's (", dtype_name(k.dtype), "), got ",
              dtype_name(v.dtype));
    MSA_CHECK(v.ndim == k.ndim, "v: shape must equal k's ", k.describe(), ", got ", v.describe());
    for (int d = 0; d < k.ndim; ++d)
      MSA_CHECK(v.shape[d] == k.shape[d], "v: shape must equal k's ", k.describe(), ", got ",
                v.describe());
    check_last_dim_contiguous(v, "v");
  }

  s.batch = cu_seqlens_q.defined() ? cu_seqlens_q.numel() - 1 : -1;
  MSA_CHECK(cu_seqlens_q.defined() && cu_seqlens_q.ndim == 1 && s.batch >= 0,
            "cu_seqlens_q: must be a 1-D int32 tensor [B+1]");
  check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", s.batch, s.total_q, q.device);

  if (flat) {
    const int64_t total_k = k.shape[0];
    check_kv_lengths(kv, s.batch, q.device);
    check_qtensor_scale(kv.k, "k", total_k, s.num_kv_heads, s.head_dim, preordered_fp4_scales);
    if (need_v) check_qtensor_scale(kv.v, "v", total_k, s.num_kv_heads, s.head_dim);
  } else {
    const ProblemShape lens = check_kv_lengths(kv, s.batch, q.device);
    s.num_pages = lens.num_pages;
    s.page_size = lens.page_size;
    s.max_pages = lens.max_pages;
    const Tensor& pt = kv.page_table;
    check_last_dim_contiguous(pt, "page_table");
    if (k.dtype == DType::fp4x2) {
      check_fp4_pool_scale(kv.k, "k", s, preordered_fp4_scales);
      if (need_v) check_fp4_pool_scale(kv.v, "v", s, /*preordered_ok=*/false);
    } else {
      // Paged FP8 scales count the pool's slots as its tokens: slot s of page P is token
      // P * page_size + s (either layout), so a per-token scale is [num_pages * page_size] and a
      // per-token-and-head one [num_pages * page_size, Hkv].
      const int64_t pool_tokens = s.num_pages * s.page_size;
      check_qtensor_scale(kv.k, "k", pool_tokens, s.num_kv_heads, s.head_dim);
      if (need_v) check_qtensor_scale(kv.v, "v", pool_tokens, s.num_kv_heads, s.head_dim);
    }
    if (!q.is_cuda()) {
      const int64_t cap = s.max_pages * s.page_size;
      for (int64_t b = 0; b < s.batch; ++b) {
        const int64_t lk = kv.seqused_k.defined() ? kv.seqused_k.ptr<int32_t>()[b] : cap;  // checked
        const int64_t pages = (lk + s.page_size - 1) / s.page_size;
        for (int64_t p = 0; p < pages; ++p) {
          const int32_t id = pt.ptr<int32_t>()[b * pt.strides[0] + p * pt.strides[1]];
          MSA_CHECK(id >= 0 && id < s.num_pages, "page_table: page id ", id,
                    " out of range [0, ", s.num_pages, ") at (batch ", b, ", column ", p, ")");
        }
      }
    }
  }
  return s;
}

void check_row_alignments(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          bool elements_only) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"},
                                std::pair{&out, "out"}})
    if (t->defined()) check_row_alignment(*t, name, elements_only ? dtype_size(t->dtype) : 16);
}

void refuse_cpu_only_attention(const AttentionArgs& a, const char* op, bool offsets) {
  MSA_CHECK(offsets || a.params.soft_cap == 0.f, "params.soft_cap: ", op, " does not run a soft-cap on CUDA "
            "yet (got ", a.params.soft_cap, "); run on CPU tensors or leave it 0");
  MSA_CHECK(offsets || !a.causal_offset.defined(), "causal_offset: ", op, " does not take per-batch causal "
            "offsets on CUDA yet; run on CPU tensors or leave it absent");
  MSA_CHECK(offsets || !a.key_mask.defined(), "key_mask: ", op, " does not take a key mask on "
            "CUDA yet; run on CPU tensors or leave it absent");
}

void check_sparse_group(int64_t group, int64_t num_kv_heads, const char* what) {
  MSA_CHECK(group == 1 || group == 2 || group == 4 || group == 8 || group == 16 ||
                (num_kv_heads == 1 && group <= 128),
            what, ": a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or 16 (or one kv head for "
            "up to 128 query heads), got ", group, "; any group up to 128 runs dense (no q2k)");
}

int64_t check_q2k(const Tensor& q2k, const ProblemShape& s, Device device) {
  check_sparse_group(s.group, s.num_kv_heads, "q2k");
  check_defined(q2k, "q2k");
  check_dtype(q2k, "q2k", {DType::i32});
  check_ndim(q2k, "q2k", 3);
  MSA_CHECK(q2k.shape[0] == s.num_kv_heads && q2k.shape[1] == s.total_q,
            "q2k: shape must be [Hkv, total_q, topk] = [", s.num_kv_heads, ", ", s.total_q,
            ", *], got ", q2k.describe());
  MSA_CHECK(q2k.shape[2] >= 1, "q2k: topk (last dim) must be >= 1, got ", q2k.describe());
  check_contiguous(q2k, "q2k");
  MSA_CHECK(q2k.device == device, "q2k: must be on ", device_name(device), ", got ",
            device_name(q2k.device));
  return q2k.shape[2];
}

void check_selection(int topk, int sink_blocks, int local_blocks, int kv_block_size) {
  MSA_CHECK(kv_block_size == 64 || kv_block_size == 128,
            "kv_block_size: must be 64 or 128, got ", kv_block_size);
  MSA_CHECK(topk >= 1, "topk: must be >= 1, got ", topk);
  MSA_CHECK(sink_blocks >= 0 && local_blocks >= 0, "sink_blocks, local_blocks: must be >= 0, got ",
            sink_blocks, " and ", local_blocks);
  MSA_CHECK(int64_t(sink_blocks) + local_blocks <= topk,
            "sink_blocks + local_blocks: must be <= topk (", topk, "), got ", sink_blocks, " + ",
            local_blocks);
}

Device common_device(const char* op, TensorArgs args) {
  const Tensor* first = nullptr;
  const char* first_name = "";
  for (const auto& [t, name] : args) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      first_name = name;
      continue;
    }
    MSA_CHECK(t->device == first->device, op, ": ", name, " is on ", device_name(t->device),
              ", but ", first_name, " on ", device_name(first->device), "; all on one device");
  }
  return first ? first->device : Device{};
}

void check_status_arg(const Tensor& status, Device device, const char* op) {
  if (device.type != DeviceType::cuda) return;
  MSA_CHECK(status.defined(), op, ": status (int32[4] on the GPU) is required for CUDA tensors");
  check_dtype(status, "status", {DType::i32});
  check_shape(status, "status", {4});
  MSA_CHECK(status.device == device, "status: must be on ", device_name(device), ", got ",
            device_name(status.device));
}

}  // namespace msa::api
