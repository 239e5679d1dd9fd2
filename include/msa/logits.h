// DeepSeek-style indexer logits (docs/semantics.md, Indexer logits): for a query row and a key,
// the weighted sum over the row's query heads of relu(q . k), times the key's scale.
#pragma once

#include "msa/common.h"

namespace msa {

// Ragged prefill logits (DeepGEMM's fp8_mqa_logits contract): query row t sees the keys
// [ks[t], ke[t]) of one flat key tensor shared by every head (MQA).
struct MqaLogitsArgs {
  QTensor q;               // [T, H, D] fp8_e4m3 (no scale: fold it into weights) or bf16
  QTensor k;               // [S, D] q's dtype; fp8: optional f32 scale [S] (absent: 1)
  Tensor weights;          // [T, H] f32, may be negative
  Tensor ks, ke;           // [T] int32, 0 <= ks[t] <= ke[t] <= S
  Tensor logits;           // out: [T, S] f32, rows may be strided (last dim contiguous)
  bool clean_logits = true;  // columns outside [ks[t], ke[t]) -inf; false: left unwritten
};

// logits[t, s] = scale[s] * sum_h weights[t, h] * relu(q[t, h] . k[s]) for ks[t] <= s < ke[t],
// accumulated exactly and rounded once to f32; relu keeps NaN (a NaN input gives a NaN logit).
// CPU tensors only so far: CUDA tensors are an msa::Error.
void mqa_logits(const MqaLogitsArgs& args, cudaStream_t stream = nullptr);

// Token top-K over logits rows (docs/semantics.md, Indexer logits): per row, the topk highest
// positions among its candidates (ks[r] <= s < ke[r], or the whole row without ranges), written
// ascending and -1 padded; -inf never selected, ties toward the lower position, NaN below every
// finite value. CPU tensors only so far.
struct TokenTopKArgs {
  Tensor logits;  // [R, S] f32, rows may be strided (last dim contiguous)
  Tensor ks, ke;  // optional, both or neither: [R] int32, 0 <= ks[r] <= ke[r] <= S
  int topk = 2048;
  Tensor ids;     // out: [R, topk] int32
};
void token_topk(const TokenTopKArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
