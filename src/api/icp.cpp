// Public ICP indexer entry points (include/msa/icp.h): argument checks on the host, then the CPU
// reference or the CUDA backend. A rank's shard is checked as the unsharded pool it is part of
// (its page table, lengths and page ids) plus its own shape; each backend checks the values it
// reads (the shard's slot scales, each row of the owner's lists; CUDA on the device, through
// status), so a corrupt exchange is an msa::Error, never a wrong or out-of-range q2k.
#include "msa/icp.h"

#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

void check_sharding(IcpLayout layout, int world) {
  MSA_CHECK(layout == IcpLayout::p128 || layout == IcpLayout::p256,
            "layout: must be IcpLayout::p128 or IcpLayout::p256");
  MSA_CHECK(world == 2 || world == 4, "world: must be 2 or 4, got ", world);
}

// ids / scores: [lead..., total_q, topk] int32 / f32 of one shape, contiguous, on `device`.
void check_lists(const Tensor& ids, const Tensor& scores, int ndim, const char* shape_text,
                 int64_t total_q, int topk, Device device) {
  check_defined(ids, "ids");
  check_defined(scores, "scores");
  check_dtype(ids, "ids", {DType::i32});
  check_dtype(scores, "scores", {DType::f32});
  check_ndim(ids, "ids", ndim);
  MSA_CHECK(ids.shape[ndim - 2] == total_q && ids.shape[ndim - 1] == topk, "ids: shape must be ",
            shape_text, " with total_q = ", total_q, " and topk = ", topk, ", got ", ids.describe());
  MSA_CHECK(scores.ndim == ndim, "scores: shape must equal ids' ", ids.describe(), ", got ",
            scores.describe());
  for (int d = 0; d < ndim; ++d)
    MSA_CHECK(scores.shape[d] == ids.shape[d], "scores: shape must equal ids' ", ids.describe(),
              ", got ", scores.describe());
  check_contiguous(ids, "ids");
  check_contiguous(scores, "scores");
  MSA_CHECK(ids.device == device && scores.device == device, "ids, scores: must be on ",
            device_name(device));
}

}  // namespace

int icp_page_rows(IcpLayout layout) {
  check_sharding(layout, 2);
  return layout == IcpLayout::p128 ? 128 : 256;
}

int icp_rows_per_rank(IcpLayout layout, int world) {
  check_sharding(layout, world);
  return icp_page_rows(layout) / world;
}

void icp_rank_lists(const IcpRankListsArgs& a, cudaStream_t stream) {
  constexpr const char* op = "icp_rank_lists";
  check_sharding(a.layout, a.world);
  MSA_CHECK(a.rank >= 0 && a.rank < a.world, "rank: must be in [0, world = ", a.world, "), got ",
            a.rank);
  const int rows = icp_rows_per_rank(a.layout, a.world), page_rows = icp_page_rows(a.layout);
  const Tensor& shard = a.shard.values;
  check_defined(shard, "shard");
  check_ndim(shard, "shard", 4);
  MSA_CHECK(shard.shape[1] == rows, "shard: shape must be [num_pages, rows_per_rank = ", rows,
            ", Hik, D] for this layout and world, got ", shard.describe());
  const Device device = api::common_device(
      op, {{&a.index_q.values, "index_q"}, {&shard, "shard"}, {&a.page_table, "page_table"},
           {&a.seqused_k, "seqused_k"}, {&a.cu_seqlens_q, "cu_seqlens_q"}, {&a.ids, "ids"},
           {&a.scores, "scores"}, {&a.workspace, "workspace"}});

  // The unsharded pool the shard is part of: its page table, lengths and page ids are checked as
  // a paged cache of page_rows-key pages (the shard's scales separately: they count its slots).
  KVCache whole;
  whole.layout = KVLayout::paged_nhd;
  whole.k.values = shard;
  whole.k.values.shape[1] = page_rows;
  whole.page_table = a.page_table;
  whole.seqused_k = a.seqused_k;
  ProblemShape s;
  try {
    s = api::check_q_and_kv(a.index_q, whole, a.cu_seqlens_q,
                            {DType::bf16, DType::f16, DType::fp8_e4m3}, /*need_v=*/false,
                            /*kv_may_be_quantized=*/false, /*kv_block_size=*/128);
  } catch (const Error& e) {
    fail(op, ": ", e.what(), " (q: index_q; k: the shard, counted as the unsharded pool [",
         shard.shape[0], ", ", page_rows, ", Hik, D])");
  }
  api::check_scale_values(a.index_q, "index_q");
  api::check_qtensor_scale(a.shard, "shard", s.num_pages * rows, s.num_kv_heads, s.head_dim);
  api::check_selection(a.topk, a.sink_blocks, a.local_blocks, 128);
  check_lists(a.ids, a.scores, 3, "[Hsel, total_q, topk]", s.total_q, a.topk, device);
  const int64_t hsel = a.ids.shape[0];
  MSA_CHECK(hsel > 0 && s.num_q_heads % hsel == 0, "ids: its first dim (selection heads) must "
            "divide index_q's heads (", s.num_q_heads, "), got ", a.ids.describe());
  api::check_status_arg(a.status, device, op);
  if (device.type == DeviceType::cpu) return cpu::icp_rank_lists(a);
  api::check_row_alignments(a.index_q.values, shard);  // TMA rows
  const size_t need = icp_rank_lists_workspace_bytes(a);
  if (need > 0) {
    check_defined(a.workspace, "workspace");
    check_dtype(a.workspace, "workspace", {DType::u8});
    check_contiguous(a.workspace, "workspace");
    MSA_CHECK(size_t(a.workspace.numel()) >= need, "workspace: needs ", need,
              " bytes (icp_rank_lists_workspace_bytes), got ", a.workspace.describe());
  }
  cuda::icp_rank_lists(a, s, stream);
}

// CUDA: none where the indexer kernel keeps the lists itself (cuda::icp_lists_fuse), else the
// partial-score plane [Hi, max_pages, total_q] f32.
size_t icp_rank_lists_workspace_bytes(const IcpRankListsArgs& a) {
  if (!a.index_q.values.defined() || !a.index_q.values.is_cuda()) return 0;
  check_ndim(a.index_q.values, "index_q", 3);
  check_defined(a.page_table, "page_table");
  check_ndim(a.page_table, "page_table", 2);
  const Tensor& shard = a.shard.values;
  if (shard.defined() && shard.ndim == 4 && a.ids.defined() && a.ids.ndim == 3 &&
      cuda::icp_lists_fuse(a.index_q.values.shape[1], shard.shape[2], a.ids.shape[0], a.topk,
                           a.sink_blocks, a.local_blocks))
    return 0;
  return size_t(a.index_q.values.shape[1]) * size_t(a.page_table.shape[1]) *
         size_t(a.index_q.values.shape[0]) * 4;
}

void icp_merge(const IcpMergeArgs& a, cudaStream_t stream) {
  constexpr const char* op = "icp_merge";
  check_sharding(a.layout, 2);
  const Device device = api::common_device(
      op, {{&a.ids, "ids"}, {&a.scores, "scores"}, {&a.page_table, "page_table"},
           {&a.seqused_k, "seqused_k"}, {&a.cu_seqlens_q, "cu_seqlens_q"}, {&a.q2k, "q2k"}});
  check_defined(a.ids, "ids");
  check_ndim(a.ids, "ids", 4);
  const int64_t world = a.ids.shape[0], hsel = a.ids.shape[1], total_q = a.ids.shape[2];
  MSA_CHECK(world >= 1, "ids: its first dim (ranks) must be >= 1, got ", a.ids.describe());
  api::check_selection(a.topk, a.sink_blocks, a.local_blocks, 128);
  check_lists(a.ids, a.scores, 4, "[world, Hsel, total_q, topk]", total_q, a.topk, device);

  check_defined(a.cu_seqlens_q, "cu_seqlens_q");
  check_dtype(a.cu_seqlens_q, "cu_seqlens_q", {DType::i32});
  check_ndim(a.cu_seqlens_q, "cu_seqlens_q", 1);
  const int64_t batch = a.cu_seqlens_q.shape[0] - 1;
  MSA_CHECK(batch >= 0, "cu_seqlens_q: must be [B+1], got ", a.cu_seqlens_q.describe());
  api::check_cu_seqlens(a.cu_seqlens_q, "cu_seqlens_q", batch, total_q, device);
  check_defined(a.page_table, "page_table");
  check_dtype(a.page_table, "page_table", {DType::i32});
  check_ndim(a.page_table, "page_table", 2);
  MSA_CHECK(a.page_table.shape[0] == batch, "page_table: shape must be [B = ", batch,
            ", max_pages], got ", a.page_table.describe());
  const int page_rows = icp_page_rows(a.layout);
  const bool on_cpu = device.type == DeviceType::cpu;
  if (a.seqused_k.defined()) {
    check_dtype(a.seqused_k, "seqused_k", {DType::i32});
    check_shape(a.seqused_k, "seqused_k", {batch});
    const int64_t cap = a.page_table.shape[1] * page_rows;
    for (int64_t b = 0; on_cpu && b < batch; ++b) {
      const int32_t v = a.seqused_k.ptr<int32_t>()[b * a.seqused_k.strides[0]];
      MSA_CHECK(v >= 0 && v <= cap, "seqused_k[", b, "] must be in [0, max_pages * ", page_rows,
                " = ", cap, "], got ", v);
    }
  }
  check_defined(a.q2k, "q2k");
  check_dtype(a.q2k, "q2k", {DType::i32});
  check_shape(a.q2k, "q2k", {hsel, total_q, int64_t(a.topk)});
  check_contiguous(a.q2k, "q2k");
  api::check_status_arg(a.status, device, op);
  if (!on_cpu) {
    MSA_CHECK(a.topk <= 64, op, ": topk must be at most 64 on CUDA, got ", a.topk);
    MSA_CHECK(world <= 4, op, ": at most 4 ranks' lists on CUDA, got ", a.ids.describe());
    return cuda::icp_merge(a, stream);
  }

  cpu::icp_merge(a);
}

}  // namespace msa
