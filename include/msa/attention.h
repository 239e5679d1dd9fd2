// Attention forward: sparse (q2k selection) or dense (every visible key), flat or paged KV
// (docs/semantics.md: Attention, Paged KV).
#pragma once

#include <optional>

#include "msa/common.h"
#include "msa/csr.h"

namespace msa {

struct AttentionParams {
  float softmax_scale = 0.f;  // 0 -> 1/sqrt(D)
  bool causal = true;         // bottom-right aligned: query i sees key j iff j <= i + Lk - Lq
  int kv_block_size = 128;    // 64 or 128, or 1 (token ids: CPU; CUDA decode): the unit of q2k ids
  float temperature = 0.f;    // > 0: also write tlse = log sum exp(s / T); tlse given iff T > 0
  // > 0: soft-capped scores s = soft_cap * tanh(s / soft_cap), after the softmax scale and before
  // the max (lse and tlse use the capped scores); 0 = off. Negative, NaN or infinite: msa::Error.
  float soft_cap = 0.f;
  // f32 or bf16, for any intermediate partial outputs; absent (the default) picks bf16 for bf16 q
  // and f32 for f16 q. bf16 halves the partial traffic of the per-token path and keeps bf16
  // outputs within the FlashAttention-3 error bar (docs/semantics.md, Numerics); each block's
  // normalized partial keeps 8 mantissa bits, coarser than fp16 outputs' 11, hence f32 for f16.
  std::optional<DType> partial_dtype;
};

// Which rows key_mask has: one per batch ([B, Lk_max], a per-key mask) or one per query token
// ([total_q, Lk_max], a per-query-and-key mask). from_shape: the mask's first dim decides; when
// B == total_q both readings fit and the call is an msa::Error asking for the explicit kind.
enum class KeyMaskRows : uint8_t { from_shape, per_batch, per_query };

struct AttentionArgs {
  Tensor q;               // [total_q, Hq, D] bf16 | f16 | fp8_e4m3 (see q_scale)
  Tensor q_scale;         // fp8_e4m3 q only, optional f32: [1], [total_q] or [total_q, Hq]
                          // (contiguous); q's values are q * q_scale. Absent: 1
  KVCache kv;             // k, v; flat or paged
  Tensor cu_seqlens_q;    // [B+1] int32
  Tensor q2k;             // [Hkv, total_q, topk] int32 batch-local block ids; absent = dense
  K2QIndex k2q;           // optional CSR + schedule from build_k2q_csr for the same q2k
  Tensor out;             // out: [total_q, Hq, D], dtype of q (bf16 for fp8_e4m3 q)
  Tensor lse;             // out (optional): [Hq, total_q] f32, natural log, -inf if no key
  Tensor tlse;            // out (optional, needs params.temperature > 0): [Hq, total_q] f32
  // Optional int32 [B] (contiguous), needs params.causal: replaces the bottom-right offset
  // Lk_b - Lq_b of the causal rule, so query i of batch b sees key j iff j <= i + causal_offset[b]
  // (and j < Lk_b, the batch's keys: cu_seqlens_k or seqused_k). Any int32: a negative offset
  // hides keys, one >= Lk_b - 1 shows every key to every query.
  Tensor causal_offset;
  // Optional bool or u8 (nonzero = visible) [B, Lk_max] or [total_q, Lk_max] (see key_mask_rows),
  // last dim contiguous: key j of batch b is attended only where mask[row, j] is set, ANDed with
  // the causal rule and the q2k selection. Lk_max >= every batch's key count (checked on the host
  // for CPU tensors); columns past a batch's keys are never read.
  Tensor key_mask;
  KeyMaskRows key_mask_rows = KeyMaskRows::from_shape;
  AttentionParams params;
  Tensor workspace;       // u8 scratch, at least attention_workspace_bytes(args) (CUDA)
  Tensor status;          // int32[4] on CUDA
};

// out[t, hq] = sum_j softmax(s)_j v[j, hq/G] over the attended keys j (the visible keys of the
// selected blocks, or every visible key when q2k is absent; visible: the causal rule, or
// causal_offset, ANDed with key_mask), s_j = scale * dot(q, k_j), soft-capped when
// params.soft_cap > 0; 0 when there is no key (lse -inf).
// CPU: any head dim D >= 1 and any strides with a contiguous last dim (rows need no alignment).
// FP8 queries (q fp8_e4m3 with q_scale, docs/semantics.md, Quantized attention) take bf16, FP8 or
// FP4 K/V and write bf16 out (on CUDA too).
// CUDA (sm_90a, sparse and dense, D = 128, rows 16-byte aligned; soft_cap, causal_offset and
// key_mask are refused with an msa::Error naming them): K/V of q's dtype, or FP8 / FP4 K/V under
// bf16 or FP8 q; flat or paged
// (page_size 16-256, either pool layout, strides multiples of 16 bytes, B * max_pages *
// page_size < 2^31). The device checks a paged cache before reading it: a page id outside
// [0, num_pages) in a column that seqused_k uses, or a seqused_k outside
// [0, max_pages * page_size], is reported through `status` (check_status).
void attention_forward(const AttentionArgs& args, cudaStream_t stream = nullptr);
size_t attention_workspace_bytes(const AttentionArgs& args);

}  // namespace msa
