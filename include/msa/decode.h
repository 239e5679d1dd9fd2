// Decode (DESIGN.md section 7): few queries per request over a long paged KV cache, sparse
// (q2k per kv head and token) or dense, with a plan()/run() split: plan sizes the split-KV
// work list once for a batch shape; run neither allocates nor synchronizes.
#pragma once

#include "msa/attention.h"

namespace msa {

struct DecodeShape {
  int batch = 0;                 // B, any count >= 0
  int max_queries_per_request = 1;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 128;
  int page_size = 128;           // 16, 32, 64, 128, 256
  int max_pages = 0;             // page_table's second dim
  KVLayout layout = KVLayout::paged_nhd;
  DType kv_dtype = DType::bf16;  // bf16 | fp8_e4m3
  int topk = 0;                  // 0 = dense decode
  int kv_block_size = 128;
  Device device{};
};

class DecodePlan {
 public:
  // Workspace bytes run() needs for `shape` (partials and the work list).
  static size_t workspace_bytes(const DecodeShape& shape);
  // Builds the split-KV work list for `shape` given host lengths (seqused_k_host[b], or
  // max_pages * page_size when null) into `workspace`. May synchronize.
  void plan(const DecodeShape& shape, const int32_t* seqused_k_host, const Tensor& workspace,
            cudaStream_t stream = nullptr);
  // Runs attention for args (paged KV; args.q2k present iff shape.topk > 0). Lengths in
  // args.kv.seqused_k may change between runs as long as they stay within the planned shape.
  void run(const AttentionArgs& args, cudaStream_t stream = nullptr) const;

  const DecodeShape& shape() const { return shape_; }
  bool planned() const { return planned_; }

 private:
  DecodeShape shape_{};
  Tensor workspace_{};
  bool planned_ = false;
};

}  // namespace msa
