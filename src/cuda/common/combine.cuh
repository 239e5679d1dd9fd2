// Combine step of sparse attention: merges the per-(token, kv head, slot) partials (unnormalised
// O, LSE and 1 / sum) into out / lse / tlse, exactly in fp32 and in fixed slot order
// (deterministic).
// Launched by sm90/sparse_fwd/launch.cu after the main kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace msa::cuda {

struct CombineParams {
  const int32_t* q2k = nullptr;           // [Hkv, total_q, topk]: which slots hold a partial
  const int32_t* cu_seqlens_q = nullptr;  // [B+1]
  const int32_t* cu_seqlens_k = nullptr;  // [B+1]
  // partials, indexed by ((h * total_q + t) * topk + slot) * G + g
  const void* part_o = nullptr;           // [.., D] bf16 (part_bf16) or f32, D = head_dim
  int32_t part_bf16 = 0;
  // Each partial row is unnormalised: its P V with p = exp(s - the part's max), the part's LSE and
  // 1 / sum(p) (rl); the merged row is sum_s w_s rl_s O_s / sum_s w_s, w_s = exp(lse_s - max).
  const float* part_lse = nullptr;        // natural log, -inf: no visible key in that block
  const float* part_rl = nullptr;         // 0 where lse is -inf
  const float* part_tlse = nullptr;       // null unless tlse is requested
  void* out = nullptr;                    // [total_q, Hq, head_dim] bf16 / f16, D contiguous
  int64_t out_stride_t = 0, out_stride_h = 0;  // elements
  // 64, 128 or 256 (topk 0: dense attention without keys writes its zero rows here).
  int32_t head_dim = 128;
  float* lse = nullptr;                   // [Hq, total_q] or null
  float* tlse = nullptr;                  // [Hq, total_q] or null
  int64_t batch = 0, total_q = 0;
  int32_t num_kv_heads = 0, group = 1, topk = 0, kv_block_size = 128;
  // The combine walks (kv head, query block) pairs, query blocks of 2^qblock_shift (6, 7 or 9)
  // tokens; the pairs already written by the uniform path (flag 1) are skipped. All are required.
  const int32_t* uniform = nullptr;       // [Hkv, qblock_cap]
  const int32_t* qblock_start = nullptr;  // [B+1] first global query block of batch b
  int64_t qblock_cap = 0;                 // >= qblock_start[B]
  int32_t qblock_shift = 7;
};

// out_f16: out is f16 (else bf16).
void launch_sparse_combine(const CombineParams& p, bool out_f16, cudaStream_t stream);

}  // namespace msa::cuda
