// The backend interface: the public entry points in src/api/ validate their arguments once
// (device-agnostic rules, api/validate.h), resolve a ProblemShape (common/problem.h) and then call
// exactly one of these. The CPU backend
// is the oracle; the CUDA backend raises msa::Error naming any feature it does not support yet.
#pragma once

#include "common/problem.h"
#include "msa/msa.h"

namespace msa {

namespace cpu {
void block_scores(const BlockScoresArgs& a, const ProblemShape& s);
void block_topk(const BlockTopKArgs& a, const ProblemShape& s);
void select_topk(const TopKArgs& a, const ProblemShape& s);
// The pipeline's selection when top-K covers every visible block: each row of a.q2k ([H, total_q,
// topk], H any head count) lists every visible block ascending, -1 padded (what block_topk
// chooses then), without scoring; `s` is the index inputs' shape (block_topk's checks).
void select_every_visible(const BlockTopKArgs& a, const ProblemShape& s);
void mqa_logits(const MqaLogitsArgs& a);
void paged_mqa_logits(const PagedMqaLogitsArgs& a);
void token_topk(const TokenTopKArgs& a);
void build_k2q_csr(const CsrBuildArgs& a, const ProblemShape& s);
// The reference converter k2q -> q2k (msa::k2q_to_q2k_cpu), on validated host tensors.
void k2q_to_q2k(const K2QIndex& k2q, const Tensor& cu_seqlens_q, const KVCache& kv,
                const ProblemShape& s, const Tensor& q2k);
void attention_forward(const AttentionArgs& a, const ProblemShape& s);
void quantize(const Tensor& x, QuantFormat f, const QTensor& out);
void dequantize(const QTensor& x, const Tensor& out);
// Copies FP4 scales between the public tensor `pub` of `layout` and the preordered `pre`
// (quant.h): into `pre` (its padding zeroed), or into `pub` when `to_public`.
void reorder_fp4_scales(const Tensor& pub, const Tensor& pre, KVLayout layout, bool to_public);
// The SDSA indexer (msa/sdsa.h). `s`: batch (B), total_q (T), head_dim (D), page_size, num_pages
// and max_pages (the block table's width) of validated arguments.
void indexer_scores(const IndexerScoresArgs& a, const ProblemShape& s);
void indexer_threshold_select(const ThresholdSelectArgs& a, const ProblemShape& s);
void top_k_from_candidates(const TopKFromCandidatesArgs& a);
void gather_key_sample(const GatherKeySampleArgs& a, const ProblemShape& s);
void thresholds_from_sample(const ThresholdsFromSampleArgs& a);
void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& a);
// The ICP indexer (msa/icp.h) on validated host tensors: a rank's lists (an msa::Error when a
// visible block's group score is NaN, after the outputs are written), the owner's merge.
void icp_rank_lists(const IcpRankListsArgs& a);
void icp_merge(const IcpMergeArgs& a);
// The token-sparse builders (msa/token_sparse.h) on validated host tensors: the value checks in
// the header's order, each an msa::Error.
void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& a);
void group_union_masks(const GroupUnionMasksArgs& a);
}  // namespace cpu

namespace cuda {
// Who sized an op's workspace, named in the error when it is short: the size function the caller
// used and the bytes that function counts before this op's part (the pipeline's q2k).
struct WorkspaceSource {
  const char* size_fn = "attention_workspace_bytes(args)";
  size_t offset = 0;
};

// check_pages = false: a paged cache's page ids and seqused_k are left to a later op on the same
// stream that checks the same page table and lengths against a pool of as many pages of the same
// size (the pipeline's attention_forward); the kernel reads nothing out of range either way.
void block_scores(const BlockScoresArgs& a, const ProblemShape& s, cudaStream_t stream,
                  bool check_pages = true);
void block_topk(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream,
                bool check_pages = true);
void select_topk(const TopKArgs& a, const ProblemShape& s, cudaStream_t stream);
// As cpu::select_every_visible; refuses what block_topk refuses on CUDA
// (check_indexer_supported), so a call does not start to fail as its requests grow.
void select_every_visible(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream);
void check_indexer_supported(const BlockTopKArgs& a, const ProblemShape& s);
void build_k2q_csr(const CsrBuildArgs& a, const ProblemShape& s, cudaStream_t stream);
size_t csr_workspace_bytes(int64_t hkv, int64_t total_rows, int64_t total_q, int64_t topk);
// Plans the workspace once and checks the caller's against it (`src` names the size function).
void attention_forward(const AttentionArgs& a, const ProblemShape& s, cudaStream_t stream,
                       const WorkspaceSource& src = {});
size_t attention_workspace_bytes(const AttentionArgs& a, const ProblemShape& s);
// What attention_forward's kernels refuse (head dims, dtypes, sizes), as an msa::Error naming
// it, without planning or launching anything: the pipeline asks before its indexer runs.
void check_attention_supported(const AttentionArgs& a, const ProblemShape& s);
// MQA logits (src/cuda/sm90/mqa_logits/): FP8, D = 128, H <= 128; paged block sizes 32, 64, 128.
// report_base: added to the row (ragged, token_topk) or batch (paged) a device status report
// names, where the call is one chunk of a larger one (mqa_logits_topk).
void mqa_logits(const MqaLogitsArgs& a, cudaStream_t stream, int64_t report_base = 0);
void paged_mqa_logits(const PagedMqaLogitsArgs& a, cudaStream_t stream, int64_t report_base = 0);
// The ICP indexer (common/icp.cu): `s` is the index inputs' shape with the unsharded pool's
// page geometry (page_size = the page rows). The indexer kernel's shard mode
// (icp_shard_scores, sm90/block_scores/launch.cu) writes the rank's lists itself where
// icp_lists_fuse (its fused lists hold the selection: no workspace), else the partial scores
// into the workspace (`plane`), which the list kernel reads.
void icp_rank_lists(const IcpRankListsArgs& a, const ProblemShape& s, cudaStream_t stream);
bool icp_lists_fuse(int64_t hi, int64_t hik, int64_t hsel, int topk, int sink, int local);
void icp_shard_scores(const IcpRankListsArgs& a, const ProblemShape& s, float* plane,
                      cudaStream_t stream);
void icp_merge(const IcpMergeArgs& a, cudaStream_t stream);
// Token top-K (common/token_topk.cu): any topk; ranges checked on the device.
void token_topk(const TokenTopKArgs& a, cudaStream_t stream, int64_t report_base = 0);
void quantize(const Tensor& x, QuantFormat f, const QTensor& out, cudaStream_t stream);
void dequantize(const QTensor& x, const Tensor& out, cudaStream_t stream);
void reorder_fp4_scales(const Tensor& pub, const Tensor& pre, KVLayout layout, bool to_public,
                        cudaStream_t stream);
// The SDSA indexer (src/cuda/sm90/sdsa/), `s` as for the CPU; lengths, ids and slots are checked
// on the device and reported through the status buffer.
void indexer_scores(const IndexerScoresArgs& a, const ProblemShape& s, cudaStream_t stream);
void indexer_threshold_select(const ThresholdSelectArgs& a, const ProblemShape& s,
                              cudaStream_t stream);
void top_k_from_candidates(const TopKFromCandidatesArgs& a, cudaStream_t stream);
void gather_key_sample(const GatherKeySampleArgs& a, const ProblemShape& s, cudaStream_t stream);
void thresholds_from_sample(const ThresholdsFromSampleArgs& a, cudaStream_t stream);
void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs& a, cudaStream_t stream);
// The token-sparse builders (common/token_sparse_slots.cu, common/group_union.cu): value checks
// on the device, the first offence in the header's order into the status buffer.
void token_sparse_kv_indices(const TokenSparseKvIndicesArgs& a, cudaStream_t stream);
void group_union_masks(const GroupUnionMasksArgs& a, cudaStream_t stream);
// The status buffer on the device: copied to `out` after the stream's work (synchronizes), or
// reset asynchronously on the stream.
void read_status(const Tensor& status, cudaStream_t stream, int32_t out[4]);
void clear_status(const Tensor& status, cudaStream_t stream);

// Decode (src/cuda/sm90/decode/; only in CUDA builds, api/decode.cpp guards the calls). plan writes
// the split-KV work list into the workspace and returns its size and geometry; run launches the
// main kernel (which also combines split requests) on `stream` without allocating or
// synchronizing. plan's `warps`: the CTA width, 0 for the planner's choice (DecodePlan), 4 or 8
// to force one (the GPU tests and bench_decode --warps, which then run with decode_run).
struct DecodeWork {
  int64_t items = 0;
  int sm_count = 0;
  int warps = 0;  // the planned CTA width, so run() rebuilds exactly the planned geometry
  int identity_tiles = 0;  // > 0: the work list is the identity (cuda/sm90/decode/plan.h WorkList)
};
size_t decode_workspace_bytes(const DecodeShape& s);
DecodeWork decode_plan(const DecodeShape& s, const int32_t* seqused_k_host, const Tensor& workspace,
                       cudaStream_t stream, int warps = 0);
void decode_run(const AttentionArgs& a, const DecodeShape& s, const DecodeWork& w,
                const Tensor& workspace, cudaStream_t stream);
}  // namespace cuda

}  // namespace msa
