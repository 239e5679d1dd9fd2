// Decode (docs/semantics.md, Decode): few queries per request over a long paged KV cache, sparse
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
  int kv_block_size = 128;       // 64 or 128, or 1 (token ids; CUDA: up to 65536 keys a request)
  Device device{};
};

// CUDA contract (the CPU backend needs no plan data and accepts any lengths):
// - plan() computes the split-KV work list from the host lengths and copies it into `workspace`
//   (u8, at least workspace_bytes(shape), on shape.device); the workspace must stay alive and
//   untouched until the last run(), and one plan serves one stream at a time.
// - Each request's planned capacity is its host length rounded up to a multiple of 128 keys
//   (capped at max_pages * page_size), or max_pages * page_size when seqused_k_host is null.
//   run() reads seqused_k on the device: lengths may shrink freely (to 0) and grow up to that
//   capacity. A longer length, or a request with more than max_queries_per_request queries, is
//   reported in the status buffer as shape_mismatch (a = request, b = keys or queries found,
//   c = the planned capacity or max_queries_per_request); the keys or queries past the plan are
//   then not attended. q2k may change freely between runs.
// - Token ids (kv_block_size 1): plan() throws msa::Error when a request's planned capacity
//   exceeds 65536 keys (the kernel's union has a bit per key); such plans run one query per CTA,
//   with all of its heads.
// - GQA groups: every group validation takes, up to 128 (sparse: 1, 2, 4, 8, 16, or any with one
//   kv head, e.g. MQA with 64 or 128 query heads, over blocks or token ids).
// - run() launches one kernel on `stream` (the last split of a request to finish combines the
//   splits), never allocates or synchronizes, and can be captured in a CUDA graph; replays read
//   the current seqused_k and q2k. The workspace's split counters return to zero at the end of
//   every run, so one plan serves one stream at a time. Device-side checks (cu_seqlens_q,
//   seqused_k < 0, q2k ids, page ids) write the first offence to args.status; call
//   check_status() to read it.
// - CUDA takes head_dim 64, 128 or 256 (FP8 e4m3 KV at 128 and 256, NVFP4 KV at 128 only); tlse
//   (temperature), a k2q index, params.soft_cap, causal_offset and key_mask are not supported
//   (msa::Error naming them); partials are always f32. The CPU runs attention_forward, so it
//   takes all of these and any head_dim >= 1.
// - A sparse plan with one query chunk per request whose CTAs fit one wave (e.g. B = 32, one
//   query each) reads K/V under an L2 evict_first policy: each line is read once, and the lines
//   earlier kernels left in L2 stay there.
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
  // CUDA: size of the work list plan() wrote, the SM count it was balanced for, its CTA width and
  // whether the list is the identity (its largest item's tiles, else 0).
  int64_t num_items_ = 0;
  int sm_count_ = 0, warps_ = 0, identity_tiles_ = 0;
};

}  // namespace msa
