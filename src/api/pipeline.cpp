// Public sparse_attention_pipeline (msa/pipeline.h): lays the q2k selection and the attention
// scratch out in the caller's workspace, then runs block_topk and attention_forward, each of
// which validates its own arguments once; attention plans its scratch once.
#include "msa/pipeline.h"

#include <climits>

#include "api/attention.h"
#include "api/indexer.h"
#include "api/validate.h"
#include "msa/topk.h"

namespace msa {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// The two calls of the pipeline, with q2k placed at `q2k_data` and the attention scratch at the
// workspace's remainder (`attn_ws`, absent when sizing). The attention is dense (no q2k) when the
// selection cannot leave a visible block out.
struct Calls {
  BlockTopKArgs select;
  AttentionArgs attend;
  size_t q2k_bytes = 0;
  // Index key heads other than the kv heads (DESIGN section 13, e.g. MiniMax-M3: 4 index heads on
  // 1 index key head for 4 kv heads): kv head h selects by its own index heads, so the scores are
  // materialized after q2k (scores_bytes) and select_topk takes each kv head's index heads
  // (make_calls says why not block_topk's lists per selection head).
  bool unfused = false;
  BlockScoresArgs scores;
  TopKArgs pick;
  size_t scores_bytes = 0;
  // Paged, with attention after the selection: the indexer leaves the page table and seqused_k to
  // attention_forward's check when the index pool has k's page count and page size (the same
  // first offence either way; LAT-CHUNK 7 launches -> 6). Without queries attention enqueues
  // nothing, so the indexer keeps its check.
  bool index_checks_pages = true;
};

Calls make_calls(const PipelineArgs& a, void* q2k_data, const Tensor& attn_ws) {
  check_defined(a.q, "q");
  check_ndim(a.q, "q", 3);
  check_defined(a.kv.k.values, "k");
  const Tensor& k = a.kv.k.values;
  MSA_CHECK(k.ndim == 3 || k.ndim == 4, "k: must be [total_k, Hkv, D] or a 4-d page pool, got ",
            k.describe());
  const int kv_heads_dim = a.kv.layout == KVLayout::paged_nhd ? 2 : 1;
  const int64_t hkv = k.shape[kv_heads_dim];
  MSA_CHECK(a.topk >= 1, "topk: must be >= 1, got ", a.topk);
  const Tensor& ik = a.index_k.values;
  MSA_CHECK(!ik.defined() || ik.ndim == k.ndim, "index_k: must be laid out like k (", k.ndim,
            "-d), got ", ik.describe());
  const Tensor& iq = a.index_q.values.defined() ? a.index_q.values : a.q;
  check_ndim(iq, a.index_q.values.defined() ? "index_q" : "q", 3);
  Calls c;
  // Index heads that select apart take the two steps on both backends: on CUDA block_topk's
  // lists per selection head are slower than block scores + select_topk (IDX-32K-M3-fp8 fused
  // 1.345 ms against 1.091 ms, docs/kernels/block_scores.md: two selector warps an SM against a
  // selection kernel on every SM), on the CPU no faster (1.88 against 1.90 s at 4096 tokens
  // with 4 index heads on 1).
  c.unfused = ik.defined() && ik.shape[kv_heads_dim] != hkv;
  if (c.unfused)  // section 13's rows shared by kv heads (Hi < Hkv) are not built yet
    MSA_CHECK(iq.shape[1] % hkv == 0, "index_q: ", iq.shape[1], " index heads on index_k's ",
              ik.shape[kv_heads_dim], " key heads for ", hkv, " kv heads: each kv head selects by "
              "its own index heads (DESIGN section 13), so Hi must be a multiple of Hkv");
  const Tensor q2k(q2k_data, DType::i32, {hkv, a.q.shape[0], int64_t(a.topk)}, a.q.device);
  c.q2k_bytes = size_t(q2k.numel()) * 4;

  c.select.q = a.index_q.values.defined() ? a.index_q : QTensor(a.q);
  c.select.kv = a.kv;
  c.select.kv.v = QTensor();
  if (a.index_k.values.defined()) c.select.kv.k = a.index_k;
  c.select.cu_seqlens_q = a.cu_seqlens_q;
  c.select.causal = a.params.causal;
  c.select.kv_block_size = a.params.kv_block_size;
  c.select.topk = a.topk;
  c.select.sink_blocks = a.sink_blocks;
  c.select.local_blocks = a.local_blocks;
  c.select.q2k = q2k;
  c.select.status = a.status;

  c.attend.q = a.q;
  c.attend.kv = a.kv;
  c.attend.cu_seqlens_q = a.cu_seqlens_q;
  // When top-K covers every block of the longest request the cache can hold, the selection is
  // every visible block (DESIGN section 3) and dense attention attends exactly those keys,
  // without the k2q CSR and the sparse prep chain (on CUDA ~20 launches: the bulk of a short
  // call's time). The selection is still written for callers that read it, without scoring.
  // (Malformed caches keep the selection: attention then names what is wrong.)
  const Tensor& table = a.kv.page_table;
  const bool flat = a.kv.layout == KVLayout::flat;
  const bool well_formed = flat ? k.ndim == 3 : k.ndim == 4 && table.defined() && table.ndim == 2;
  // Shapes are unchecked here, so the products saturate instead of overflowing.
  auto product = [](int64_t x, int64_t y) {
    int64_t r = 0;
    return __builtin_mul_overflow(x, y, &r) ? INT64_MAX : r;
  };
  const int64_t key_bound =
      !well_formed ? -1
      : flat       ? k.shape[0]
                   : product(table.shape[1], k.shape[a.kv.layout == KVLayout::paged_nhd ? 1 : 2]);
  if (key_bound < 0 || product(a.topk, a.params.kv_block_size) < key_bound) c.attend.q2k = q2k;
  if (!flat && well_formed && c.attend.q2k.defined() && a.q.shape[0] > 0) {
    const int page_dim = a.kv.layout == KVLayout::paged_nhd ? 1 : 2;
    c.index_checks_pages = ik.defined() && (ik.ndim != 4 || ik.shape[0] != k.shape[0] ||
                                            ik.shape[page_dim] != k.shape[page_dim]);
  }
  if (c.unfused && c.attend.q2k.defined()) {
    // [Hi, nblk, total_q] over the longest request the cache can hold, after q2k.
    const int64_t blk = a.params.kv_block_size > 0 ? a.params.kv_block_size : 1;
    const int64_t nblk = key_bound <= 0 ? 1 : (key_bound - 1) / blk + 1;
    c.scores_bytes = size_t(product(product(iq.shape[1], nblk), product(a.q.shape[0], 4)));
    c.scores.q = c.select.q;
    c.scores.kv = c.select.kv;
    c.scores.cu_seqlens_q = a.cu_seqlens_q;
    // Placed in the workspace by the run (sizing reads its shape only).
    c.scores.scores = Tensor(nullptr, DType::f32, {iq.shape[1], nblk, a.q.shape[0]}, a.q.device);
    c.scores.causal = a.params.causal;
    c.scores.kv_block_size = a.params.kv_block_size;
    c.scores.status = a.status;
    c.pick.scores = c.scores.scores;
    c.pick.cu_seqlens_q = a.cu_seqlens_q;
    c.pick.kv = a.kv;
    c.pick.num_kv_heads = int(hkv);
    c.pick.topk = a.topk;
    c.pick.sink_blocks = a.sink_blocks;
    c.pick.local_blocks = a.local_blocks;
    c.pick.causal = a.params.causal;
    c.pick.kv_block_size = a.params.kv_block_size;
    c.pick.q2k = q2k;
    c.pick.status = a.status;
  }
  c.attend.out = a.out;
  c.attend.lse = a.lse;
  c.attend.tlse = a.tlse;
  c.attend.params = a.params;
  c.attend.workspace = attn_ws;
  c.attend.status = a.status;
  return c;
}

}  // namespace

size_t pipeline_workspace_bytes(const PipelineArgs& a) {
  // Any 256-byte aligned address stands in for q2k while sizing: the size functions read shapes.
  const Calls c = make_calls(a, reinterpret_cast<void*>(kAlign), Tensor());
  return align_up(c.q2k_bytes) + align_up(c.scores_bytes) + attention_workspace_bytes(c.attend);
}

// q2k at the workspace's start, the attention scratch in the rest; each call validates its own
// arguments once, and attention checks the rest against its plan (naming this size function).
void sparse_attention_pipeline(const PipelineArgs& a, cudaStream_t stream) {
  Calls c = make_calls(a, nullptr, Tensor());  // q2k, scores and scratch placed below
  const size_t q2k_span = align_up(c.q2k_bytes) + align_up(c.scores_bytes);
  if (a.workspace.defined() || q2k_span > 0) {
    check_defined(a.workspace, "workspace");
    check_dtype(a.workspace, "workspace", {DType::u8});
    check_contiguous(a.workspace, "workspace");
    MSA_CHECK(a.workspace.device == a.q.device, "workspace: must be on ", device_name(a.q.device),
              " (q's device), got ", device_name(a.workspace.device));
    if (size_t(a.workspace.numel()) < q2k_span)  // sized on this error path only
      fail("workspace: needs pipeline_workspace_bytes(args) = ", pipeline_workspace_bytes(a),
           " bytes, got ", a.workspace.describe());
    // cudaMalloc gives 256-byte alignment and the CUDA kernels' scratch layout assumes it.
    const size_t align = a.q.is_cuda() ? kAlign : 16;
    MSA_CHECK(reinterpret_cast<uintptr_t>(a.workspace.data) % align == 0, "workspace: must be ",
              align, "-byte aligned");
    uint8_t* base = a.workspace.ptr<uint8_t>();
    const Tensor attn_ws(base + q2k_span, DType::u8,
                         {a.workspace.numel() - int64_t(q2k_span)}, a.q.device);
    c.select.q2k.data = c.pick.q2k.data = base;
    c.scores.scores.data = c.pick.scores.data = base + align_up(c.q2k_bytes);
    if (c.attend.q2k.defined()) c.attend.q2k.data = base;
    c.attend.workspace = attn_ws;
  }
  // Attention's arguments and what its kernels refuse, before the indexer writes anything.
  const api::CheckedAttention attend = api::check_attention(c.attend);
  if (!c.attend.q2k.defined()) {
    // Dense: the selection is every visible block, written without scoring (on CUDA one launch
    // instead of the indexer's; LAT-2K: the pipeline took 258 us with the indexer, dense attention
    // alone 152 us).
    api::select_every_visible(c.select, stream);
  } else if (c.unfused) {
    api::block_scores(c.scores, stream, c.index_checks_pages);
    select_topk(c.pick, stream);
  } else {
    api::block_topk(c.select, stream, c.index_checks_pages);
  }
  api::attention_forward(attend, stream,
                         cuda::WorkspaceSource{"pipeline_workspace_bytes(args)", q2k_span});
}

}  // namespace msa
