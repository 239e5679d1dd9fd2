// Public block_scores (include/msa/indexer.h): checks q, the key cache, cu_seqlens_q and the
// scores output on the host, then runs the CPU reference or the CUDA backend.
#include "msa/indexer.h"

#include <algorithm>
#include <utility>

#include "api/indexer.h"
#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

// The largest nblk_b when the lengths can be read on the host (CPU tensors, or a paged cache
// without seqused_k, whose lengths are all max_pages * page_size); -1 otherwise.
int64_t host_max_blocks(const KVCache& kv, const ProblemShape& s, bool on_cuda) {
  const bool paged_fixed = kv.layout != KVLayout::flat && !kv.seqused_k.defined();
  if (on_cuda && !paged_fixed) return -1;
  if (paged_fixed) return s.batch > 0 ? num_blocks(s.max_pages * s.page_size, s.kv_block_size) : 0;
  int64_t m = 0;
  for (int64_t lk : host_key_lengths(kv, s)) m = std::max(m, num_blocks(lk, s.kv_block_size));
  return m;
}

void check_scores(const Tensor& scores, const ProblemShape& s, int64_t need_blocks, Device device) {
  check_defined(scores, "scores");
  check_dtype(scores, "scores", {DType::f32});
  check_ndim(scores, "scores", 3);
  MSA_CHECK(scores.shape[0] == s.num_q_heads && scores.shape[2] == s.total_q,
            "scores: shape must be [Hq, nblk_max, total_q] = [", s.num_q_heads, ", *, ", s.total_q,
            "], got ", scores.describe());
  if (need_blocks >= 0)
    MSA_CHECK(scores.shape[1] >= need_blocks, "scores: nblk_max (dim 1) must be >= the largest "
              "block count max_b ceil(Lk_b / kv_block_size) = ", need_blocks, ", got ",
              scores.describe());
  check_contiguous(scores, "scores");
  MSA_CHECK(scores.device == device, "scores: must be on ", device_name(device), ", got ",
            device_name(scores.device));
}

// q, the key cache and their scales: the indexer's input rules, shared by both entry points.
ProblemShape check_indexer_inputs(const QTensor& q, const KVCache& kv, const Tensor& cu_seqlens_q,
                                  int kv_block_size) {
  // The indexer scores blocks (token scores: mqa_logits), so not attention's kv_block_size 1.
  MSA_CHECK(kv_block_size == 64 || kv_block_size == 128, "kv_block_size: must be 64 or 128, got ",
            kv_block_size);
  const ProblemShape s = api::check_q_and_kv(
      q, kv, cu_seqlens_q, {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp4x2},
      /*need_v=*/false, /*kv_may_be_quantized=*/false, kv_block_size,
      /*preordered_fp4_scales=*/true);
  api::check_row_alignments(q.values, kv.k.values);
  // FP8 scales are finite and >= 0 (the block max factors them out); CUDA checks their values on
  // the device. (Their device is checked with the scales' shapes, in check_qtensor_scale.)
  api::check_scale_values(q, "q");
  api::check_kv_scale_values(kv, s);
  return s;
}

}  // namespace

void api::block_scores(const BlockScoresArgs& a, cudaStream_t stream, bool check_pages) {
  const ProblemShape s = check_indexer_inputs(a.q, a.kv, a.cu_seqlens_q, a.kv_block_size);
  const Device device = a.q.values.device;
  check_scores(a.scores, s, host_max_blocks(a.kv, s, device.type == DeviceType::cuda), device);
  api::check_status_arg(a.status, device, "block_scores");
  if (device.type == DeviceType::cuda) return cuda::block_scores(a, s, stream, check_pages);
  cpu::block_scores(a, s);
}

void block_scores(const BlockScoresArgs& a, cudaStream_t stream) {
  api::block_scores(a, stream, /*check_pages=*/true);
}

namespace {

// block_topk's arguments: the index inputs, the selection knobs, q2k ([Hsel, total_q, topk]:
// Hsel k's heads, or any count dividing Hq in groups of 1, 2, 4, 8 or 16, as select_topk's kv
// heads) and the status. Returns the index inputs' shape with topk.
ProblemShape check_block_topk(const BlockTopKArgs& a, const char* op) {
  ProblemShape s = check_indexer_inputs(a.q, a.kv, a.cu_seqlens_q, a.kv_block_size);
  const Device device = a.q.values.device;
  api::check_selection(a.topk, a.sink_blocks, a.local_blocks, a.kv_block_size);
  ProblemShape rows = s;
  if (a.q2k.defined() && a.q2k.ndim == 3 && a.q2k.shape[0] != s.num_kv_heads) {
    const int64_t hsel = a.q2k.shape[0], g = hsel > 0 ? s.num_q_heads / hsel : 0;
    MSA_CHECK(hsel > 0 && s.num_q_heads % hsel == 0 &&
                  (g == 1 || g == 2 || g == 4 || g == 8 || g == 16),
              "q2k: its first dim (selection heads) must be k's heads (", s.num_kv_heads,
              ") or divide q's heads (", s.num_q_heads, ") in groups of 1, 2, 4, 8 or 16, got ",
              a.q2k.describe());
    rows.num_kv_heads = hsel;
  }
  s.topk = api::check_q2k(a.q2k, rows, device);
  MSA_CHECK(s.topk == a.topk, "q2k: last dim must equal topk (", a.topk, "), got ", a.q2k.describe());
  api::check_status_arg(a.status, device, op);
  return s;
}

}  // namespace

void api::select_every_visible(const BlockTopKArgs& a, cudaStream_t stream) {
  const ProblemShape s = check_block_topk(a, "sparse_attention_pipeline");
  if (a.q.values.is_cuda()) return cuda::select_every_visible(a, s, stream);
  cpu::select_every_visible(a, s);
}

void api::block_topk(const BlockTopKArgs& a, cudaStream_t stream, bool check_pages) {
  const ProblemShape s = check_block_topk(a, "block_topk");
  if (a.q.values.is_cuda()) return cuda::block_topk(a, s, stream, check_pages);
  cpu::block_topk(a, s);
}

void block_topk(const BlockTopKArgs& a, cudaStream_t stream) {
  api::block_topk(a, stream, /*check_pages=*/true);
}

}  // namespace msa
