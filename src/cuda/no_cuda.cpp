// Stands in for the CUDA backend in builds without nvcc: every CUDA entry raises msa::Error.
#include "backend.h"

namespace msa {

bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }

namespace cuda {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  fail(op, ": CUDA tensors given, but msa was built without CUDA (configure with nvcc present "
           "or -DMSA_CUDA=ON)");
}
}  // namespace
void block_scores(const BlockScoresArgs&, const ProblemShape&, cudaStream_t, bool) {
  no_cuda("block_scores");
}
void block_topk(const BlockTopKArgs&, const ProblemShape&, cudaStream_t, bool) { no_cuda("block_topk"); }
void select_topk(const TopKArgs&, const ProblemShape&, cudaStream_t) { no_cuda("select_topk"); }
void select_every_visible(const BlockTopKArgs&, const ProblemShape&, cudaStream_t) {
  no_cuda("sparse_attention_pipeline");
}
void check_indexer_supported(const BlockTopKArgs&, const ProblemShape&) { no_cuda("block_topk"); }
void icp_rank_lists(const IcpRankListsArgs&, const ProblemShape&, cudaStream_t) {
  no_cuda("icp_rank_lists");
}
void icp_merge(const IcpMergeArgs&, cudaStream_t) { no_cuda("icp_merge"); }
bool icp_lists_fuse(int64_t, int64_t, int64_t, int, int, int) { return false; }
void build_k2q_csr(const CsrBuildArgs&, const ProblemShape&, cudaStream_t) { no_cuda("build_k2q_csr"); }
size_t csr_workspace_bytes(int64_t, int64_t, int64_t, int64_t) { return 0; }
void attention_forward(const AttentionArgs&, const ProblemShape&, cudaStream_t, const WorkspaceSource&) {
  no_cuda("attention_forward");
}
size_t attention_workspace_bytes(const AttentionArgs&, const ProblemShape&) { return 0; }
void check_attention_supported(const AttentionArgs&, const ProblemShape&) {
  no_cuda("attention_forward");
}
void mqa_logits(const MqaLogitsArgs&, cudaStream_t, int64_t) { no_cuda("mqa_logits"); }
void paged_mqa_logits(const PagedMqaLogitsArgs&, cudaStream_t, int64_t) { no_cuda("paged_mqa_logits"); }
void token_topk(const TokenTopKArgs&, cudaStream_t, int64_t) { no_cuda("token_topk"); }
void token_sparse_kv_indices(const TokenSparseKvIndicesArgs&, cudaStream_t) {
  no_cuda("token_sparse_kv_indices");
}
void group_union_masks(const GroupUnionMasksArgs&, cudaStream_t) { no_cuda("group_union_masks"); }
void quantize(const Tensor&, QuantFormat, const QTensor&, cudaStream_t) { no_cuda("quantize"); }
void dequantize(const QTensor&, const Tensor&, cudaStream_t) { no_cuda("dequantize"); }
void reorder_fp4_scales(const Tensor&, const Tensor&, KVLayout, bool to_public, cudaStream_t) {
  no_cuda(to_public ? "reorder_fp4_scales_to_public" : "reorder_fp4_scales");
}
void indexer_scores(const IndexerScoresArgs&, const ProblemShape&, cudaStream_t) {
  no_cuda("indexer_scores");
}
void indexer_threshold_select(const ThresholdSelectArgs&, const ProblemShape&, cudaStream_t) {
  no_cuda("indexer_threshold_select");
}
void top_k_from_candidates(const TopKFromCandidatesArgs&, cudaStream_t) {
  no_cuda("top_k_from_candidates");
}
void gather_key_sample(const GatherKeySampleArgs&, const ProblemShape&, cudaStream_t) {
  no_cuda("gather_key_sample");
}
void thresholds_from_sample(const ThresholdsFromSampleArgs&, cudaStream_t) {
  no_cuda("thresholds_from_sample");
}
void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs&, cudaStream_t) {
  no_cuda("quantize_write_index_qk_nvfp4");
}
void read_status(const Tensor&, cudaStream_t, int32_t[4]) { no_cuda("check_status"); }
void clear_status(const Tensor&, cudaStream_t) { no_cuda("clear_status"); }
}  // namespace cuda

}  // namespace msa
