// msa._C.DecodePlan: the plan()/run() decode wrapper of msa/decode.h. The Python class
// msa.DecodePlan owns the workspace array and keeps it alive for as long as the plan.
#include <nanobind/nanobind.h>

#include "args.h"

namespace nb = nanobind;

namespace msa::py {

namespace {

DecodeShape decode_shape(Args& a) {
  DecodeShape s;
  s.batch = a.int32("batch", 0);
  s.max_queries_per_request = a.int32("max_queries_per_request", 1);
  s.num_q_heads = a.int32("num_q_heads", 0);
  s.num_kv_heads = a.int32("num_kv_heads", 0);
  s.head_dim = a.int32("head_dim", 128);
  s.page_size = a.int32("page_size", 128);
  s.max_pages = a.int32("max_pages", 0);
  s.layout = parse_layout(a.text("kv_layout", "paged_nhd"));
  s.kv_dtype = parse_dtype(a.text("kv_dtype", "bf16"));
  s.topk = a.int32("topk", 0);
  s.kv_block_size = a.int32("kv_block_size", 128);
  const std::string dev = a.text("device_type", "cpu");
  MSA_CHECK(dev == "cpu" || dev == "cuda", "device_type: must be 'cpu' or 'cuda', got '", dev, "'");
  s.device = {dev == "cpu" ? DeviceType::cpu : DeviceType::cuda,
              a.int32("device_index", 0)};
  return s;
}

}  // namespace

void bind_decode(nb::module_& m) {
  nb::class_<DecodePlan>(m, "DecodePlan", "msa::DecodePlan; see msa.DecodePlan.")
      .def(nb::init<>())
      .def_static(
          "workspace_bytes",
          [](nb::args args, nb::kwargs kw) {
            Args a(call_arguments(args, std::move(kw), "DecodePlan.workspace_bytes"),
                   "DecodePlan.workspace_bytes");
            const DecodeShape s = decode_shape(a);
            a.finish();
            return DecodePlan::workspace_bytes(s);
          },
          "Workspace bytes run() needs for the shape given as keywords.")
      .def(
          "plan",
          [](DecodePlan& self, nb::args args, nb::kwargs kw) {
            Args a(call_arguments(args, std::move(kw), "DecodePlan.plan"), "DecodePlan.plan");
            const DecodeShape s = decode_shape(a);
            const Tensor lengths = a.tensor("seqused_k");
            const Tensor workspace = a.tensor("workspace", Access::write);
            cudaStream_t stream = a.stream();
            a.finish();
            if (lengths.defined()) {
              MSA_CHECK(!lengths.is_cuda() && lengths.dtype == DType::i32 &&
                            lengths.is_contiguous() && lengths.numel() == s.batch,
                        "seqused_k: plan() takes host lengths, a contiguous int32 CPU array [",
                        s.batch, "], got ", lengths.describe());
            }
            nb::gil_scoped_release unlocked;
            self.plan(s, lengths.defined() ? lengths.ptr<int32_t>() : nullptr, workspace, stream);
          },
          "Validates and records the batch shape (keywords), sizing the split-KV work list.")
      .def(
          "run",
          [](const DecodePlan& self, nb::args args, nb::kwargs kw) {
            Args a(call_arguments(args, std::move(kw), "DecodePlan.run"), "DecodePlan.run");
            AttentionArgs x = a.attention();
            x.params.kv_block_size = self.shape().kv_block_size;
            x.status = a.tensor("status", Access::write);
            cudaStream_t stream = a.stream();
            a.finish();
            nb::gil_scoped_release unlocked;
            self.run(x, stream);
          },
          "Runs decode attention for the planned shape; allocates and synchronizes nothing.")
      .def_prop_ro("planned", &DecodePlan::planned);
}

}  // namespace msa::py
