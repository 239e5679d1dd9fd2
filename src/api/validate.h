// Device-agnostic argument rules shared by every public entry point (docs/semantics.md:
// Conventions, Paged KV, Errors). Each check throws msa::Error naming the argument and the rule.
// Value checks (cu_seqlens monotone, page ids in range) run here on the host for CPU tensors; for
// CUDA tensors they run on the device and report through the status buffer.
#pragma once

#include <utility>
#include <vector>

#include "backend.h"

namespace msa::api {

// q [total_q, Hq, D] (or fp4x2 [total_q, Hq, D/2]) + cu_seqlens_q [B+1] + the KV cache.
// Fills every field of ProblemShape but topk. `values`: the value dtypes q may take; kv value
// dtype must equal q's unless `kv_may_be_quantized` (then fp8_e4m3 and fp4x2 KV are allowed too,
// and bf16 KV under fp8_e4m3 q).
// `need_v`: kv.v must be present with k's shape.
// `preordered_fp4_scales`: FP4 scales of q and k may come in the preordered layout (the indexer's
// choice, quant.h reorder_fp4_scales); elsewhere a 6-D scale is an error saying so.
ProblemShape check_q_and_kv(const QTensor& q, const KVCache& kv, const Tensor& cu_seqlens_q,
                            std::initializer_list<DType> values, bool need_v, bool kv_may_be_quantized,
                            int kv_block_size, bool preordered_fp4_scales = false);

// The logical (unpacked) size of t's last dim: fp4x2 stores two values a byte. Throws msa::Error
// naming `name` when that count does not fit int64 (an empty view may claim any size).
int64_t logical_last_dim(const Tensor& t, const char* name);

// Attention's output dtype for a query dtype: q's own, bf16 for fp8_e4m3 queries.
inline DType attention_out_dtype(DType q) { return q == DType::fp8_e4m3 ? DType::bf16 : q; }

// Attention's and decode's `out`: defined, attention_out_dtype(q), [total_q, Hq, D], last dim
// contiguous, on `device`.
void check_attention_out(const Tensor& out, DType q, const ProblemShape& s, Device device);

// The values of a host QTensor's FP8 scales: each finite and >= 0 (a NaN or infinite scale turns
// every score it touches into NaN; a negative one flips them, which no quantizer produces); an
// NVFP4 global scale (a host float, whatever the device) finite and > 0. Device scales are the
// kernels' to check.
void check_scale_values(const QTensor& x, const char* name);
// The same for the K (and V) scales of a validated cache: of a host page pool's per-slot scales
// only the slots that hold a key (the others may hold anything: they are never read).
void check_kv_scale_values(const KVCache& kv, const ProblemShape& s);

// The scale rules of QTensor for a tensor with `tokens` x `heads` x `dim` logical elements; the
// scale lives on the values' device. `preordered_ok`: an FP4 scale may also be preordered,
// [heads, ceil(tokens / 128), ceil(G / 4), 32, 4, 4].
void check_qtensor_scale(const QTensor& x, const char* name, int64_t tokens, int64_t heads,
                         int64_t dim, bool preordered_ok = false);

// A preordered FP4 scale (common/fp4_scale_layout.h): exactly [matrices, rest_m, rest_g, 32, 4, 4]
// and contiguous; `rule` says in the message how those sizes follow from the tensor it scales.
void check_preordered_fp4_scale(const Tensor& sc, const char* name, int64_t matrices,
                                int64_t rest_m, int64_t rest_g, const char* rule);

// cu_seqlens [B+1] int32 on `device`. For CPU tensors the values are checked too: start at 0,
// non-decreasing, last == total.
void check_cu_seqlens(const Tensor& cu, const char* name, int64_t batch, int64_t total,
                      Device device);

// The length-bearing parts of a KV cache when only lengths are needed (flat: cu_seqlens_k;
// paged: page_table, optional seqused_k, and k's shape for the page size). Returns a shape with
// batch and the page fields filled, enough for host_key_lengths.
ProblemShape check_kv_lengths(const KVCache& kv, int64_t batch, Device device);

// 16-byte aligned rows (base pointer and every stride but the last) of q, k, v and out where
// defined: what the CUDA kernels' vector and TMA loads need. The CPU backend reads elements, so
// attention asks only `elements_only` (base pointers aligned to the element size) there, and any
// head dim runs on the CPU.
void check_row_alignments(const Tensor& q, const Tensor& k, const Tensor& v = {},
                          const Tensor& out = {}, bool elements_only = false);

// The attention features only the CPU backend runs so far (causal_offset, params.soft_cap and
// key_mask unless `offsets`: the CUDA prefill takes them, decode does not): each one set is an
// msa::Error naming it, for `op` on CUDA tensors.
void refuse_cpu_only_attention(const AttentionArgs& a, const char* op, bool offsets = false);

// The GQA group of a sparse call (a q2k selection): 1, 2, 4, 8 or 16, or one kv head for up to
// 128 query heads (token-sparse MQA). `what` names the argument that made the call sparse.
void check_sparse_group(int64_t group, int64_t num_kv_heads, const char* what);

// q2k [Hkv, total_q, topk] int32 on the op's device (the call's group passing
// check_sparse_group); returns topk.
int64_t check_q2k(const Tensor& q2k, const ProblemShape& s, Device device);

// Top-K selection knobs (docs/semantics.md, Top-K selection): kv_block_size 64 | 128, topk >= 1,
// sink/local >= 0, sink + local <= topk so that no forced block is ever dropped.
void check_selection(int topk, int sink_blocks, int local_blocks, int kv_block_size);

// A list of (tensor, its argument name).
using TensorArgs = std::initializer_list<std::pair<const Tensor*, const char*>>;

// The device of an op: every tensor given (absent ones are skipped) on the first one's device,
// else an msa::Error naming both.
Device common_device(const char* op, TensorArgs args);

// Status buffer int32[4]: required (and cleared by the caller's op) on CUDA.
void check_status_arg(const Tensor& status, Device device, const char* op);

}  // namespace msa::api
