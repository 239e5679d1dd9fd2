// The problem shape every op resolves once (validation fills it, the backends read it) and the
// geometry helpers both layers use: key blocks of a batch, the FP8 scale kind, the host-side key
// lengths of a KV cache. Below src/api/ and the backends: it includes only the public API.
#pragma once

#include <vector>

#include "msa/msa.h"

namespace msa {

// Sizes resolved once by validation and passed to the backends with the args.
struct ProblemShape {
  int64_t batch = 0;       // B
  int64_t total_q = 0;
  int64_t num_q_heads = 0;   // Hq
  int64_t num_kv_heads = 0;  // Hkv
  int64_t group = 1;         // G = Hq / Hkv
  int64_t head_dim = 0;      // D (logical, unpacked)
  int64_t topk = 0;          // 0 when dense
  int64_t kv_block_size = 128;
  int64_t page_size = 0;     // paged only
  int64_t num_pages = 0;     // paged only
  int64_t max_pages = 0;     // paged only: page_table's second dim
};

// Number of blocks of `blk` keys that hold lk >= 0 keys; never forms lk + blk, which overflows
// for a block size a caller's tensor claims (paged_mqa_logits' kv_fused of 2^63 - 1 slots).
inline int64_t num_blocks(int64_t lk, int64_t blk) { return lk <= 0 ? 0 : (lk - 1) / blk + 1; }

// The kind of an FP8 scale (QTensor) as the CUDA kernels' parameters encode it: 0 none, 1 per
// tensor [1], 2 per token [T], 3 per token and head [T, H] (a page pool's tokens are its slots).
inline int fp8_scale_kind(const Tensor& scale) {
  if (!scale.defined()) return 0;
  if (scale.numel() == 1) return 1;
  return scale.ndim == 1 ? 2 : 3;
}

// Key count of batch b, read from a host (CPU) KV cache: flat from cu_seqlens_k, paged from
// seqused_k (or max_pages * page_size). s: batch and the page fields filled.
std::vector<int64_t> host_key_lengths(const KVCache& kv, const ProblemShape& s);

// The GQA groups every CUDA kernel takes so far, those dividing 16 (the dense prefill and dense
// decode check their own wider rules); an msa::Error naming `op` else.
void check_cuda_group(int64_t group, const char* op);

}  // namespace msa
