// Public select_topk (include/msa/topk.h): checks scores, the lengths, the selection knobs and
// the q2k output on the host, then runs the CPU reference or the CUDA backend.
#include "msa/topk.h"

#include <algorithm>

#include "api/k2q.h"
#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

void check_scores(const Tensor& scores) {
  check_defined(scores, "scores");
  check_dtype(scores, "scores", {DType::f32});
  check_ndim(scores, "scores", 3);
  check_contiguous(scores, "scores");
}

// scores' nblk_max must cover every batch's blocks when the lengths are readable on the host.
void check_scores_blocks(const Tensor& scores, const KVCache& kv, const ProblemShape& s) {
  if (scores.is_cuda()) return;
  int64_t need = 0;
  for (int64_t lk : host_key_lengths(kv, s)) need = std::max(need, num_blocks(lk, s.kv_block_size));
  MSA_CHECK(scores.shape[1] >= need, "scores: nblk_max (dim 1) must be >= the largest block count "
            "max_b ceil(Lk_b / kv_block_size) = ", need, ", got ", scores.describe());
}

}  // namespace

void select_topk(const TopKArgs& a, cudaStream_t stream) {
  check_scores(a.scores);
  const Device device = a.scores.device;
  const int64_t hq = a.scores.shape[0];
  MSA_CHECK(a.num_kv_heads > 0 && hq % a.num_kv_heads == 0, "num_kv_heads: must be > 0 and divide ",
            "the query heads of scores (", hq, "), got ", a.num_kv_heads);
  const int64_t g = hq / a.num_kv_heads;
  api::check_sparse_group(g, a.num_kv_heads, "num_kv_heads");
  api::check_selection(a.topk, a.sink_blocks, a.local_blocks, a.kv_block_size);
  MSA_CHECK(a.cu_seqlens_q.defined() && a.cu_seqlens_q.ndim == 1 && a.cu_seqlens_q.shape[0] >= 1,
            "cu_seqlens_q: must be a 1-D int32 tensor [B+1]");
  const int64_t batch = a.cu_seqlens_q.shape[0] - 1;
  api::check_cu_seqlens(a.cu_seqlens_q, "cu_seqlens_q", batch, a.scores.shape[2], device);

  ProblemShape s = api::check_kv_lengths(a.kv, batch, device);
  s.total_q = a.scores.shape[2];
  s.num_q_heads = hq;
  s.num_kv_heads = a.num_kv_heads;
  s.group = hq / a.num_kv_heads;
  s.kv_block_size = a.kv_block_size;
  s.topk = api::check_q2k(a.q2k, s, device);
  MSA_CHECK(s.topk == a.topk, "q2k: last dim must equal topk (", a.topk, "), got ", a.q2k.describe());
  check_scores_blocks(a.scores, a.kv, s);
  api::check_status_arg(a.status, device, "select_topk");
  if (device.type == DeviceType::cuda) return cuda::select_topk(a, s, stream);
  cpu::select_topk(a, s);
}

}  // namespace msa
