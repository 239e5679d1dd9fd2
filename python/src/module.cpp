// The private extension msa._C: one thin function per public C++ entry point, called by the
// Python layer (python/msa/) with keyword arguments, or with one dict of them (args.h
// call_arguments). Outputs and status buffers arrive
// preallocated; scratch comes from the caller's workspace= or, sized here, from its alloc=
// callable (so one call imports each array once). No semantics are added here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "args.h"

namespace nb = nanobind;
using namespace msa;
using msa::py::Access;
using msa::py::Args;

namespace msa::py {
void bind_decode(nb::module_& m);
}

namespace {

// Defines the op `name` (`label` in its errors; name when null): unpacks the keywords with
// `read(a)`, rejects unknown ones, then runs `run(args, stream)` without the GIL (the CPU backend
// can run for seconds; CUDA calls may wait on the driver).
template <typename Read, typename Run>
void def_op(nb::module_& m, const char* name, const char* doc, Read read, Run run,
            const char* label = nullptr) {
  const char* op = label ? label : name;
  m.def(
      name,
      [op, read, run](nb::args args, nb::kwargs kw) {
        Args a(py::call_arguments(args, std::move(kw), op), op);
        auto x = read(a);
        cudaStream_t stream = a.stream();
        a.finish();
        nb::gil_scoped_release unlocked;
        run(x, stream);
      },
      doc);
}

// The keywords the indexer and top-K ops share: query lengths, the keys (no v), the mask, the
// block size and the status buffer.
template <typename X>
X index_args(Args& a) {
  X x;
  x.cu_seqlens_q = a.tensor("cu_seqlens_q");
  x.kv = a.kv(/*with_v=*/false);
  x.causal = a.flag("causal", true);
  x.kv_block_size = a.int32("kv_block_size", 128);
  x.status = a.tensor("status", Access::write);
  return x;
}

// ... and those of a top-K selection: topk, the forced sink and local blocks, the q2k output.
template <typename X>
X selection_args(Args& a) {
  X x = index_args<X>(a);
  x.topk = a.int32("topk", 16);
  x.sink_blocks = a.int32("sink_blocks", 1);
  x.local_blocks = a.int32("local_blocks", 1);
  x.q2k = a.tensor("q2k", Access::write);
  return x;
}

// The keywords both ICP ops take: the layout ("p128" | "p256"), the unsharded pool's lengths,
// the selection knobs and the status.
template <typename X>
X icp_args(Args& a) {
  X x;
  const std::string layout = a.text("layout", "p128");
  MSA_CHECK(layout == "p128" || layout == "p256", "layout: must be \"p128\" or \"p256\", got \"",
            layout, "\"");
  x.layout = layout == "p128" ? IcpLayout::p128 : IcpLayout::p256;
  x.page_table = a.tensor("page_table");
  x.seqused_k = a.tensor("seqused_k");
  x.cu_seqlens_q = a.tensor("cu_seqlens_q");
  x.topk = a.int32("topk", 16);
  x.sink_blocks = a.int32("sink_blocks", 1);
  x.local_blocks = a.int32("local_blocks", 1);
  x.causal = a.flag("causal", true);
  x.status = a.tensor("status", Access::write);
  return x;
}

// The keywords of the CSR family (builder and reference converters); the converters get no
// workspace or status, which then stay undefined. `to_k2q`: the k2q side is the output (build,
// q2k -> k2q), else q2k is (k2q -> q2k).
CsrBuildArgs csr_args(Args& a, bool to_k2q) {
  CsrBuildArgs x;
  x.q2k = a.tensor("q2k", to_k2q ? Access::read : Access::write);
  x.cu_seqlens_q = a.tensor("cu_seqlens_q");
  x.kv = a.kv(/*with_v=*/false);
  x.kv_block_size = a.int32("kv_block_size", 128);
  x.out = a.k2q("", to_k2q ? Access::write : Access::read);
  x.workspace = a.tensor("workspace", Access::write);
  x.status = a.tensor("status", Access::write);
  return x;
}

// The SDSA indexer's query rows (query, its NVFP4 scale and global scale, row_requests, row_lens)
// and paged key cache (key_cache, its scale and global scale, block_table, seq_lens).
IndexQueryRows index_rows(Args& a) {
  IndexQueryRows r;
  r.query = a.qtensor("query");
  r.row_requests = a.tensor("row_requests");
  r.row_lens = a.tensor("row_lens");
  return r;
}
IndexKeyCache index_cache(Args& a) {
  IndexKeyCache c;
  c.key_cache = a.qtensor("key_cache");
  c.block_table = a.tensor("block_table");
  c.seq_lens = a.tensor("seq_lens");
  return c;
}

void bind_sdsa(nb::module_& m) {
  def_op(
      m, "indexer_scores", "msa::indexer_scores; keywords as in msa.indexer_scores, scores preallocated.",
      [](Args& a) {
        IndexerScoresArgs x;
        x.rows = index_rows(a);
        x.cache = index_cache(a);
        x.scores = a.tensor("scores", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const IndexerScoresArgs& x, cudaStream_t s) { indexer_scores(x, s); });
  def_op(
      m, "indexer_threshold_select",
      "msa::indexer_threshold_select; candidates and ties preallocated, counts updated in place.",
      [](Args& a) {
        ThresholdSelectArgs x;
        x.rows = index_rows(a);
        x.cache = index_cache(a);
        x.thresholds = a.tensor("thresholds");
        x.candidates = a.tensor("candidates", Access::write);
        x.ties = a.tensor("ties", Access::write);
        x.counts = a.tensor("counts", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const ThresholdSelectArgs& x, cudaStream_t s) { indexer_threshold_select(x, s); });
  def_op(
      m, "top_k_from_candidates",
      "msa::top_k_from_candidates; ids and row_status preallocated.",
      [](Args& a) {
        TopKFromCandidatesArgs x;
        x.candidates = a.tensor("candidates");
        x.ties = a.tensor("ties");
        x.counts = a.tensor("counts");
        x.topk = a.int32("topk", 2048);
        x.ids = a.tensor("ids", Access::write);
        x.row_status = a.tensor("row_status", Access::write);
        return x;
      },
      [](const TopKFromCandidatesArgs& x, cudaStream_t s) { top_k_from_candidates(x, s); });
  def_op(
      m, "gather_key_sample", "msa::gather_key_sample; sample and sample_lens preallocated.",
      [](Args& a) {
        GatherKeySampleArgs x;
        x.cache = index_cache(a);
        x.stride = a.int32("stride", 1);
        x.offsets = a.tensor("offsets");
        x.sample = a.qtensor("sample", Access::write);
        x.sample_lens = a.tensor("sample_lens", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const GatherKeySampleArgs& x, cudaStream_t s) { gather_key_sample(x, s); });
  def_op(
      m, "thresholds_from_sample",
      "msa::thresholds_from_sample; thresholds and counts preallocated.",
      [](Args& a) {
        ThresholdsFromSampleArgs x;
        x.sample_scores = a.tensor("sample_scores");
        x.topk = a.int32("topk", 2048);
        x.sample_stride = a.int32("sample_stride", 1);
        x.oversample = a.real("oversample", 2.0);
        x.thresholds = a.tensor("thresholds", Access::write);
        x.counts = a.tensor("counts", Access::write);
        return x;
      },
      [](const ThresholdsFromSampleArgs& x, cudaStream_t s) { thresholds_from_sample(x, s); });
  def_op(
      m, "quantize_write_index_qk_nvfp4",
      "msa::quantize_write_index_qk_nvfp4; key_cache written in place, query_out preallocated.",
      [](Args& a) {
        QuantizeIndexQKArgs x;
        x.key = a.tensor("key");
        x.slots = a.tensor("slots");
        x.key_cache = a.qtensor("key_cache", Access::write);
        x.query = a.tensor("query");
        x.query_out = a.qtensor("query_out", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const QuantizeIndexQKArgs& x, cudaStream_t s) { quantize_write_index_qk_nvfp4(x, s); });
}

// Attention's arguments; with `scratch`, a CUDA call without workspace= gets
// attention_workspace_bytes from alloc= (the size function validates the arguments first, so a
// bad call allocates nothing).
AttentionArgs attention_args(Args& a, bool scratch) {
  AttentionArgs x = a.attention();
  x.k2q = a.k2q("k2q_");
  x.workspace = a.tensor("workspace", Access::write);
  x.status = a.tensor("status", Access::write);
  if (!scratch) return x;
  a.allocator();
  if (!x.workspace.defined() && x.q.is_cuda()) x.workspace = a.allocate(attention_workspace_bytes(x));
  return x;
}

// The pipeline's arguments; with `scratch`, the workspace (also on the CPU, where it holds q2k)
// from alloc= when workspace= is absent.
PipelineArgs pipeline_args(Args& a, bool scratch) {
  PipelineArgs x;
  x.q = a.tensor("q");
  x.kv = a.kv(/*with_v=*/true);
  x.cu_seqlens_q = a.tensor("cu_seqlens_q");
  x.index_q = a.qtensor("index_q");
  x.index_k = a.qtensor("index_k");
  x.topk = a.int32("topk", 16);
  x.sink_blocks = a.int32("sink_blocks", 1);
  x.local_blocks = a.int32("local_blocks", 1);
  x.params = a.attention_params();
  x.out = a.tensor("out", Access::write);
  x.lse = a.tensor("lse", Access::write);
  x.tlse = a.tensor("tlse", Access::write);
  x.workspace = a.tensor("workspace", Access::write);
  x.status = a.tensor("status", Access::write);
  if (!scratch) return x;
  a.allocator();
  if (!x.workspace.defined()) x.workspace = a.allocate(pipeline_workspace_bytes(x));
  return x;
}

// The keywords of the FP4 scale reorders; `to_public` picks the inverse (preordered -> public).
struct ReorderArgs {
  Tensor scale, out;
  KVLayout layout;
  bool to_public;
};
ReorderArgs reorder_args(Args& a) {
  return {a.tensor("scale"), a.tensor("out", Access::write),
          py::parse_layout(a.text("layout", "flat")), a.flag("to_public", false)};
}

// The ragged (mqa_logits, mqa_logits_topk) and paged logits' inputs.
template <typename X>
void read_ragged_logits(Args& a, X& x) {
  x.q = a.qtensor("q");
  x.k = a.qtensor("k");
  x.weights = a.tensor("weights");
  x.ks = a.tensor("ks");
  x.ke = a.tensor("ke");
}
template <typename X>
void read_paged_logits(Args& a, X& x) {
  x.q = a.tensor("q");
  x.q_sf = a.tensor("q_sf");
  x.kv_fused = a.tensor("kv_fused");
  x.weights = a.tensor("weights");
  x.block_tables = a.tensor("block_tables");
  x.seq_lens = a.tensor("seq_lens");
  x.max_seq_len = a.integer("max_seq_len", 0);
}

// The logits + top-K ops' topk, outputs and scratch: a call without workspace= whose inputs are
// on CUDA and shaped for the size function (`sized`) gets bytes() of scratch from alloc=.
template <typename X, typename Bytes>
void read_logits_topk(Args& a, X& x, bool sized, Bytes bytes) {
  x.topk = a.int32("topk", 2048);
  x.ids = a.tensor("ids", Access::write);
  x.workspace = a.tensor("workspace", Access::write);
  x.status = a.tensor("status", Access::write);
  a.allocator();
  if (!x.workspace.defined() && sized) x.workspace = a.allocate(size_t(bytes()));
}

// The names and docstrings of an op with caller-sized scratch and of its size function.
struct ScratchOpNames {
  const char* size_fn;    // e.g. "attention_workspace_bytes"
  const char* size_doc;
  const char* op;         // e.g. "attention_forward"
  const char* label;      // the op's name in its errors
  const char* op_doc;
};

// Defines an op family's size function and the op itself from one argument reader
// `read(a, scratch)`: the size function reads without scratch (and accepts stream=, so one keyword
// dict serves both calls) and returns size(args); the op takes its scratch from workspace= or
// alloc= and calls run(args, stream).
template <typename X>
void def_scratch_op(nb::module_& m, X (*read)(Args&, bool), size_t (*size)(const X&),
                    void (*run)(const X&, cudaStream_t), const ScratchOpNames& n) {
  const char* size_fn = n.size_fn;
  m.def(
      n.size_fn,
      [size_fn, read, size](nb::args args, nb::kwargs kw) {
        Args a(py::call_arguments(args, std::move(kw), size_fn), size_fn);
        const X x = read(a, /*scratch=*/false);
        a.stream();
        a.finish();
        return size(x);
      },
      n.size_doc);
  def_op(m, n.op, n.op_doc, [read](Args& a) { return read(a, /*scratch=*/true); }, run, n.label);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "msa's private C++ bindings; use the functions of the msa package instead.";
  m.attr("__version__") = kVersion;
  // A RuntimeError as it always was, and a ValueError: every rejected argument raises MsaError,
  // including the Python layer's own checks, which raised ValueError before.
  nb::exception<Error>(m, "MsaError",
                       nb::make_tuple(nb::handle(PyExc_RuntimeError), nb::handle(PyExc_ValueError)));
  // torch.compile caches keep DecodePlan objects until interpreter exit, which nanobind's
  // shutdown check would report as leaks; they are not.
  nb::set_leak_warnings(false);

  m.def("register_torch", &py::register_torch, nb::arg("tensor_type"), nb::arg("dtypes"),
        "Lets the ops read torch tensors directly: torch.Tensor and {torch dtype: msa name}.");
  m.def("built_with_cuda", &built_with_cuda, "True when this build contains the CUDA backend.");
  m.def("cuda_device_count", &cuda_device_count,
        "Number of usable CUDA devices (0 without CUDA or without a GPU).");

  def_op(
      m, "block_scores", "msa::block_scores; keywords as in msa.block_scores, outputs preallocated.",
      [](Args& a) {
        auto x = index_args<BlockScoresArgs>(a);
        x.q = a.qtensor("q");
        x.scores = a.tensor("scores", Access::write);
        return x;
      },
      [](const BlockScoresArgs& x, cudaStream_t s) { block_scores(x, s); });

  def_op(
      m, "block_topk", "msa::block_topk; keywords as in msa.block_topk, q2k preallocated.",
      [](Args& a) {
        auto x = selection_args<BlockTopKArgs>(a);
        x.q = a.qtensor("q");
        return x;
      },
      [](const BlockTopKArgs& x, cudaStream_t s) { block_topk(x, s); });

  def_op(
      m, "icp_rank_lists", "msa::icp_rank_lists; keywords as in msa.icp_rank_lists, outputs preallocated.",
      [](Args& a) {
        auto x = icp_args<IcpRankListsArgs>(a);
        x.world = a.int32("world", 2);
        x.rank = a.int32("rank", 0);
        x.index_q = a.qtensor("index_q");
        x.shard = a.qtensor("shard");
        x.ids = a.tensor("ids", Access::write);
        x.scores = a.tensor("scores", Access::write);
        x.workspace = a.tensor("workspace", Access::write);
        // Without workspace=, what the call needs (none where the kernel keeps the lists) from
        // alloc=.
        a.allocator();
        if (!x.workspace.defined() && x.index_q.values.is_cuda())
          x.workspace = a.allocate(icp_rank_lists_workspace_bytes(x));
        return x;
      },
      [](const IcpRankListsArgs& x, cudaStream_t s) { icp_rank_lists(x, s); });
  def_op(
      m, "icp_merge", "msa::icp_merge; keywords as in msa.icp_merge, q2k preallocated.",
      [](Args& a) {
        auto x = icp_args<IcpMergeArgs>(a);
        x.ids = a.tensor("ids");
        x.scores = a.tensor("scores");
        x.q2k = a.tensor("q2k", Access::write);
        return x;
      },
      [](const IcpMergeArgs& x, cudaStream_t s) { icp_merge(x, s); });

  def_op(
      m, "select_topk", "msa::select_topk; keywords as in msa.select_topk, outputs preallocated.",
      [](Args& a) {
        auto x = selection_args<TopKArgs>(a);
        x.scores = a.tensor("scores");
        x.num_kv_heads = a.int32("num_kv_heads", 0);
        return x;
      },
      [](const TopKArgs& x, cudaStream_t s) { select_topk(x, s); });

  def_op(
      m, "mqa_logits", "msa::mqa_logits; keywords as in msa.mqa_logits, logits preallocated.",
      [](Args& a) {
        MqaLogitsArgs x;
        read_ragged_logits(a, x);
        x.logits = a.tensor("logits", Access::write);
        x.clean_logits = a.flag("clean_logits", true);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const MqaLogitsArgs& x, cudaStream_t s) { mqa_logits(x, s); });

  def_op(
      m, "paged_mqa_logits",
      "msa::paged_mqa_logits; keywords as in msa.paged_mqa_logits, logits preallocated.",
      [](Args& a) {
        PagedMqaLogitsArgs x;
        read_paged_logits(a, x);
        x.logits = a.tensor("logits", Access::write);
        x.clean_logits = a.flag("clean_logits", true);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const PagedMqaLogitsArgs& x, cudaStream_t s) { paged_mqa_logits(x, s); });

  def_op(
      m, "mqa_logits_topk",
      "msa::mqa_logits_topk; keywords as in msa.mqa_logits_topk, ids preallocated; scratch from "
      "workspace= or alloc=.",
      [](Args& a) {
        MqaLogitsTopKArgs x;
        read_ragged_logits(a, x);
        const Tensor &q = x.q.values, &k = x.k.values;
        read_logits_topk(a, x, q.is_cuda() && q.ndim == 3 && k.ndim == 2,
                         [&] { return mqa_logits_topk_workspace_bytes(q.shape[0], k.shape[0]); });
        return x;
      },
      [](const MqaLogitsTopKArgs& x, cudaStream_t s) { mqa_logits_topk(x, s); });
  m.def("mqa_logits_topk_workspace_bytes", &mqa_logits_topk_workspace_bytes, nb::arg("rows"),
        nb::arg("keys"), "Scratch bytes mqa_logits_topk takes on CUDA for its default chunks.");

  def_op(
      m, "paged_mqa_logits_topk",
      "msa::paged_mqa_logits_topk; keywords as in msa.paged_mqa_logits_topk, ids preallocated; "
      "scratch from workspace= or alloc=.",
      [](Args& a) {
        PagedMqaLogitsTopKArgs x;
        read_paged_logits(a, x);
        read_logits_topk(a, x, x.q.is_cuda() && x.q.ndim == 4 && x.q.shape[1] >= 1 && x.max_seq_len >= 0,
                         [&] {
                           return paged_mqa_logits_topk_workspace_bytes(x.q.shape[0], x.q.shape[1],
                                                                        x.max_seq_len);
                         });
        return x;
      },
      [](const PagedMqaLogitsTopKArgs& x, cudaStream_t s) { paged_mqa_logits_topk(x, s); });
  m.def("paged_mqa_logits_topk_workspace_bytes", &paged_mqa_logits_topk_workspace_bytes,
        nb::arg("batch"), nb::arg("next_n"), nb::arg("max_seq_len"),
        "Scratch bytes paged_mqa_logits_topk takes on CUDA for its default chunks.");

  def_op(
      m, "token_topk", "msa::token_topk; keywords as in msa.token_topk, ids preallocated.",
      [](Args& a) {
        TokenTopKArgs x;
        x.logits = a.tensor("logits");
        x.ks = a.tensor("ks");
        x.ke = a.tensor("ke");
        x.topk = a.int32("topk", 2048);
        x.ids = a.tensor("ids", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const TokenTopKArgs& x, cudaStream_t s) { token_topk(x, s); });

  def_op(
      m, "token_sparse_kv_indices",
      "msa::token_sparse_kv_indices; keywords as in msa.token_sparse_kv_indices, slots "
      "preallocated.",
      [](Args& a) {
        TokenSparseKvIndicesArgs x;
        x.positions = a.tensor("positions");
        x.requests = a.tensor("requests");
        x.block_table = a.tensor("block_table");
        x.page_size = a.integer("page_size", 0);
        x.seq_lens = a.tensor("seq_lens");
        x.slots = a.tensor("slots", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const TokenSparseKvIndicesArgs& x, cudaStream_t s) { token_sparse_kv_indices(x, s); });

  def_op(
      m, "group_union_masks",
      "msa::group_union_masks; keywords as in msa.group_union_masks, union_keys, union_lens, "
      "group_rows and mask (bool, or u8 when packed) preallocated.",
      [](Args& a) {
        GroupUnionMasksArgs x;
        x.positions = a.tensor("positions");
        x.cu_seqlens_q = a.tensor("cu_seqlens_q");
        x.group_size = a.integer("group_size", 1);
        x.union_keys = a.tensor("union_keys", Access::write);
        x.union_lens = a.tensor("union_lens", Access::write);
        x.group_rows = a.tensor("group_rows", Access::write);
        x.mask = a.tensor("mask", Access::write);
        x.status = a.tensor("status", Access::write);
        return x;
      },
      [](const GroupUnionMasksArgs& x, cudaStream_t s) { group_union_masks(x, s); });

  def_op(
      m, "build_k2q_csr",
      "msa::build_k2q_csr; outputs row_ptr, q_idx and (optional) schedule preallocated; scratch "
      "from workspace= or alloc=.",
      [](Args& a) {
        CsrBuildArgs x = csr_args(a, /*to_k2q=*/true);
        a.allocator();
        if (!x.workspace.defined() && x.q2k.is_cuda() && x.q2k.ndim == 3 && x.out.row_ptr.ndim == 2)
          x.workspace = a.allocate(csr_workspace_bytes(x.q2k.shape[0], x.out.row_ptr.shape[1] - 1,
                                                       x.q2k.shape[1], x.q2k.shape[2]));
        return x;
      },
      [](const CsrBuildArgs& x, cudaStream_t s) { build_k2q_csr(x, s); });

  m.def("k2q_schedule_size", &k2q_schedule_size, nb::arg("num_kv_heads"), nb::arg("total_rows"),
        nb::arg("total_q"), nb::arg("topk"),
        "int32 elements of the schedule buffer build_k2q_csr writes for this shape.");
  m.def("csr_workspace_bytes", &csr_workspace_bytes, nb::arg("num_kv_heads"),
        nb::arg("total_rows"), nb::arg("total_q"), nb::arg("topk"),
        "Scratch bytes build_k2q_csr needs on CUDA (0 on CPU).");

  def_op(
      m, "q2k_to_k2q_cpu", "CPU reference converter q2k -> (row_ptr, q_idx), outputs preallocated.",
      [](Args& a) { return csr_args(a, /*to_k2q=*/true); },
      [](const CsrBuildArgs& x, cudaStream_t) {
        q2k_to_k2q_cpu(x.q2k, x.cu_seqlens_q, x.kv, x.kv_block_size, x.out.row_ptr, x.out.q_idx);
      });

  def_op(
      m, "k2q_to_q2k_cpu", "CPU reference converter (row_ptr, q_idx) -> q2k, output preallocated.",
      [](Args& a) { return csr_args(a, /*to_k2q=*/false); },
      [](const CsrBuildArgs& x, cudaStream_t) {
        k2q_to_q2k_cpu(x.out.row_ptr, x.out.q_idx, x.cu_seqlens_q, x.kv, x.kv_block_size, x.q2k);
      });

  def_scratch_op(m, attention_args, attention_workspace_bytes, attention_forward,
                 {.size_fn = "attention_workspace_bytes",
                  .size_doc = "Scratch bytes attention_forward needs for these arguments (0 on CPU).",
                  .op = "attention_forward", .label = "attention_forward",
                  .op_doc = "msa::attention_forward; out, lse, tlse and status preallocated; scratch "
                            "from workspace= or alloc=."});
  def_scratch_op(m, pipeline_args, pipeline_workspace_bytes, sparse_attention_pipeline,
                 {.size_fn = "pipeline_workspace_bytes",
                  .size_doc = "Workspace bytes sparse_attention_pipeline needs for these arguments.",
                  .op = "sparse_attention_pipeline", .label = "sparse_attention",
                  .op_doc = "msa::sparse_attention_pipeline (block_topk, then attention_forward); out, "
                            "lse, tlse and status preallocated; the workspace (q2k first) from "
                            "workspace= or alloc=."});

  def_op(
      m, "quantize", "msa::quantize into preallocated out (values), out_scale, out_global_scale.",
      [](Args& a) {
        struct {
          Tensor x;
          QuantFormat format;
          QTensor out;
        } q;
        q.x = a.tensor("x");
        q.format = py::parse_quant_format(a.text("format", ""));
        q.out = a.qtensor("out", Access::write);
        return q;
      },
      [](const auto& q, cudaStream_t s) { quantize(q.x, q.format, q.out, s); });

  def_op(
      m, "dequantize", "msa::dequantize of x (values), x_scale, x_global_scale into preallocated out.",
      [](Args& a) {
        struct {
          QTensor x;
          Tensor out;
        } d;
        d.x = a.qtensor("x");
        d.out = a.tensor("out", Access::write);
        return d;
      },
      [](const auto& d, cudaStream_t s) { dequantize(d.x, d.out, s); });

  def_op(
      m, "reorder_fp4_scales",
      "msa::reorder_fp4_scales of scale into preallocated out, or with to_public "
      "msa::reorder_fp4_scales_to_public.",
      reorder_args,
      [](const ReorderArgs& r, cudaStream_t s) {
        if (r.to_public) reorder_fp4_scales_to_public(r.scale, r.layout, r.out, s);
        else reorder_fp4_scales(r.scale, r.layout, r.out, s);
      });

  def_op(m, "check_status",
         "Waits for the stream, then raises MsaError if the status buffer records an offence.",
         [](Args& a) { return a.tensor("status"); },
         [](const Tensor& status, cudaStream_t s) { check_status(status, s); });
  def_op(m, "clear_status", "Resets a status buffer to ok (asynchronous on the stream for CUDA).",
         [](Args& a) { return a.tensor("status", Access::write); },
         [](const Tensor& status, cudaStream_t s) { clear_status(status, s); });

  bind_sdsa(m);
  py::bind_decode(m);
}
