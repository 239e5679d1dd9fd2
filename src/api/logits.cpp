// Public mqa_logits and token_topk (include/msa/logits.h): check every argument on the host (the
// key ranges' values too), then run the CPU reference (no CUDA kernels yet).
#include "msa/logits.h"

#include "api/validate.h"
#include "backend.h"

namespace msa {
namespace {

// ks / ke: [T] int32 on `device`, 0 <= ks[t] <= ke[t] <= S.
void check_ranges(const Tensor& ks_t, const Tensor& ke_t, int64_t t_rows, int64_t s_keys,
                  Device device) {
  for (const auto& [t, name] : {std::pair{&ks_t, "ks"}, std::pair{&ke_t, "ke"}}) {
    check_defined(*t, name);
    check_dtype(*t, name, {DType::i32});
    check_shape(*t, name, {t_rows});
    check_contiguous(*t, name);
    MSA_CHECK(t->device == device, name, ": must be on ", device_name(device), ", got ",
              device_name(t->device));
  }
  const int32_t* ks = ks_t.ptr<int32_t>();
  const int32_t* ke = ke_t.ptr<int32_t>();
  for (int64_t t = 0; t < t_rows; ++t)
    MSA_CHECK(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_keys, "ks, ke: row ", t,
              " must satisfy 0 <= ks <= ke <= S (", s_keys, "), got [", ks[t], ", ", ke[t], ")");
}

}  // namespace

void mqa_logits(const MqaLogitsArgs& a, cudaStream_t /*stream*/) {
  const Tensor& q = a.q.values;
  check_defined(q, "q");
  MSA_CHECK(q.device.type == DeviceType::cpu, "mqa_logits: runs on the CPU only so far (its CUDA "
            "kernel is not written yet); got q on ", device_name(q.device));
  check_dtype(q, "q", {DType::fp8_e4m3, DType::bf16});
  check_ndim(q, "q", 3);
  check_last_dim_contiguous(q, "q");
  MSA_CHECK(!a.q.scale.defined(), "q.scale: must be absent (fold the query scale into weights)");
  const Device device = q.device;
  const int64_t t_rows = q.shape[0], heads = q.shape[1], dim = q.shape[2];
  MSA_CHECK(heads >= 1 && dim >= 1, "q: needs at least one head and one element, got ",
            q.describe());

  const Tensor& k = a.k.values;
  check_defined(k, "k");
  check_dtype(k, "k", {q.dtype});
  check_ndim(k, "k", 2);
  check_last_dim_contiguous(k, "k");
  MSA_CHECK(k.shape[1] == dim, "k: must be [S, ", dim, "] (q's head dim), got ", k.describe());
  MSA_CHECK(k.device == device, "k: must be on ", device_name(device));
  const int64_t s_keys = k.shape[0];
  if (a.k.scale.defined()) {
    MSA_CHECK(k.dtype == DType::fp8_e4m3, "k.scale: only fp8_e4m3 keys take a scale");
    check_dtype(a.k.scale, "k.scale", {DType::f32});
    check_shape(a.k.scale, "k.scale", {s_keys});
    check_contiguous(a.k.scale, "k.scale");
    MSA_CHECK(a.k.scale.device == device, "k.scale: must be on ", device_name(device));
  }

  check_defined(a.weights, "weights");
  check_dtype(a.weights, "weights", {DType::f32});
  check_shape(a.weights, "weights", {t_rows, heads});
  check_last_dim_contiguous(a.weights, "weights");
  MSA_CHECK(a.weights.device == device, "weights: must be on ", device_name(device));
  check_ranges(a.ks, a.ke, t_rows, s_keys, device);

  check_defined(a.logits, "logits");
  check_dtype(a.logits, "logits", {DType::f32});
  check_shape(a.logits, "logits", {t_rows, s_keys});
  check_last_dim_contiguous(a.logits, "logits");
  MSA_CHECK(a.logits.device == device, "logits: must be on ", device_name(device));
  cpu::mqa_logits(a);
}

void token_topk(const TokenTopKArgs& a, cudaStream_t /*stream*/) {
  check_defined(a.logits, "logits");
  MSA_CHECK(a.logits.device.type == DeviceType::cpu, "token_topk: runs on the CPU only so far "
            "(its CUDA kernel is not written yet); got logits on ", device_name(a.logits.device));
  check_dtype(a.logits, "logits", {DType::f32});
  check_ndim(a.logits, "logits", 2);
  check_last_dim_contiguous(a.logits, "logits");
  const int64_t rows = a.logits.shape[0], s_keys = a.logits.shape[1];
  MSA_CHECK(a.ks.defined() == a.ke.defined(), "ks, ke: give both or neither");
  if (a.ks.defined()) check_ranges(a.ks, a.ke, rows, s_keys, a.logits.device);
  MSA_CHECK(a.topk >= 1, "topk: must be >= 1, got ", a.topk);
  check_defined(a.ids, "ids");
  check_dtype(a.ids, "ids", {DType::i32});
  check_shape(a.ids, "ids", {rows, int64_t(a.topk)});
  check_contiguous(a.ids, "ids");
  MSA_CHECK(a.ids.device == a.logits.device, "ids: must be on ", device_name(a.logits.device));
  cpu::token_topk(a);
}

}  // namespace msa
