// Public entry points of the k2q CSR family (msa/csr.h): validate, then dispatch to the CPU or
// CUDA backend; plus the argument rules of api/k2q.h and the host reference converters.
#include <climits>
#include <string>

#include "api/k2q.h"
#include "api/validate.h"
#include "common/schedule.h"

namespace msa {
namespace api {

int64_t check_k2q_index(const K2QIndex& k2q, const char* name, const KVCache& kv,
                        const ProblemShape& s, Device device) {
  const std::string rp_name = std::string(name) + ".row_ptr";
  const std::string qi_name = std::string(name) + ".q_idx";
  const std::string sc_name = std::string(name) + ".schedule";
  const Tensor& rp = k2q.row_ptr;
  check_defined(rp, rp_name.c_str());
  check_dtype(rp, rp_name.c_str(), {DType::i32});
  check_ndim(rp, rp_name.c_str(), 2);
  MSA_CHECK(rp.shape[0] == s.num_kv_heads && rp.shape[1] >= 1, rp_name,
            ": shape must be [Hkv, total_rows + 1] with Hkv = ", s.num_kv_heads, ", got ",
            rp.describe());
  check_contiguous(rp, rp_name.c_str());
  MSA_CHECK(rp.device == device, rp_name, ": must be on ", device_name(device));
  const int64_t total_rows = rp.shape[1] - 1;
  MSA_CHECK(total_rows <= INT32_MAX, rp_name, ": total_rows ", total_rows, " must fit int32");
  if (device.type == DeviceType::cpu) {
    int64_t want = 0;
    for (int64_t lk : host_key_lengths(kv, s)) want += num_blocks(lk, s.kv_block_size);
    MSA_CHECK(total_rows >= want, rp_name, ": second dim must be at least total_rows + 1 = ",
              want + 1, " (total_rows = sum over batches of ceil(Lk_b / kv_block_size) = ", want,
              "), got ", rp.describe());
  }
  const Tensor& qi = k2q.q_idx;
  check_defined(qi, qi_name.c_str());
  check_dtype(qi, qi_name.c_str(), {DType::i32});
  check_shape(qi, qi_name.c_str(), {s.num_kv_heads, s.total_q * s.topk});
  check_contiguous(qi, qi_name.c_str());
  MSA_CHECK(qi.device == device, qi_name, ": must be on ", device_name(device));
  const Tensor& sc = k2q.schedule;
  if (sc.defined()) {
    check_dtype(sc, sc_name.c_str(), {DType::i32});
    check_ndim(sc, sc_name.c_str(), 1);
    check_contiguous(sc, sc_name.c_str());
    MSA_CHECK(sc.device == device, sc_name, ": must be on ", device_name(device));
    const int64_t need = k2q_schedule_size(s.num_kv_heads, total_rows, s.total_q, s.topk);
    MSA_CHECK(sc.numel() >= need, sc_name, ": needs at least k2q_schedule_size(...) = ", need,
              " int32 elements, got ", sc.describe());
  }
  return total_rows;
}

// q2k, cu_seqlens_q and the KV lengths of a CSR build or conversion; the device is q2k's.
static ProblemShape check_q2k_problem(const Tensor& q2k, const Tensor& cu_seqlens_q,
                                      const KVCache& kv, int kv_block_size) {
  check_defined(q2k, "q2k");
  check_dtype(q2k, "q2k", {DType::i32});
  check_ndim(q2k, "q2k", 3);
  check_contiguous(q2k, "q2k");
  MSA_CHECK(q2k.shape[0] >= 1 && q2k.shape[2] >= 1,
            "q2k: shape must be [Hkv, total_q, topk] with Hkv >= 1 and topk >= 1, got ",
            q2k.describe());
  MSA_CHECK(q2k.shape[1] * q2k.shape[2] <= INT32_MAX, "q2k: total_q * topk = ",
            q2k.shape[1] * q2k.shape[2], " must fit the int32 row_ptr");
  MSA_CHECK(kv_block_size == 64 || kv_block_size == 128,
            "kv_block_size: must be 64 or 128, got ", kv_block_size);
  const Device device = q2k.device;
  MSA_CHECK(cu_seqlens_q.defined() && cu_seqlens_q.ndim == 1 && cu_seqlens_q.shape[0] >= 1,
            "cu_seqlens_q: must be a 1-D int32 tensor [B+1]");
  const int64_t batch = cu_seqlens_q.shape[0] - 1;
  check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", batch, q2k.shape[1], device);
  ProblemShape s = check_kv_lengths(kv, batch, device);
  s.total_q = q2k.shape[1];
  s.num_kv_heads = q2k.shape[0];
  s.topk = q2k.shape[2];
  s.kv_block_size = kv_block_size;
  return s;
}

}  // namespace api

int64_t k2q_schedule_size(int64_t num_kv_heads, int64_t total_rows, int64_t total_q,
                          int64_t topk) {
  MSA_CHECK(num_kv_heads >= 0 && total_rows >= 0 && total_q >= 0 && topk >= 0,
            "k2q_schedule_size: sizes must be >= 0, got (", num_kv_heads, ", ", total_rows, ", ",
            total_q, ", ", topk, ")");
  return sched::max_schedule_ints(num_kv_heads, total_rows);
}

size_t csr_workspace_bytes(int64_t num_kv_heads, int64_t total_rows, int64_t total_q,
                           int64_t topk) {
  return cuda::csr_workspace_bytes(num_kv_heads, total_rows, total_q, topk);
}

void build_k2q_csr(const CsrBuildArgs& a, cudaStream_t stream) {
  const ProblemShape s = api::check_q2k_problem(a.q2k, a.cu_seqlens_q, a.kv, a.kv_block_size);
  const Device device = a.q2k.device;
  const int64_t rows = api::check_k2q_index(a.out, "out", a.kv, s, device);
  if (device.type == DeviceType::cpu) return cpu::build_k2q_csr(a, s);
  const size_t need = csr_workspace_bytes(s.num_kv_heads, rows, s.total_q, s.topk);
  if (need > 0) {
    check_defined(a.workspace, "workspace");
    check_dtype(a.workspace, "workspace", {DType::u8});
    MSA_CHECK(a.workspace.device == device, "workspace: must be on ", device_name(device));
    MSA_CHECK(size_t(a.workspace.numel()) >= need, "workspace: needs csr_workspace_bytes(...) = ",
              need, " bytes, got ", a.workspace.describe());
  }
  api::check_status_arg(a.status, device, "build_k2q_csr");
  cuda::build_k2q_csr(a, s, stream);
}

void q2k_to_k2q_cpu(const Tensor& q2k, const Tensor& cu_seqlens_q, const KVCache& kv,
                    int kv_block_size, const Tensor& row_ptr, const Tensor& q_idx) {
  MSA_CHECK(!q2k.is_cuda(), "q2k_to_k2q_cpu: q2k must be a CPU tensor");
  CsrBuildArgs a;
  a.q2k = q2k;
  a.cu_seqlens_q = cu_seqlens_q;
  a.kv = kv;
  a.kv_block_size = kv_block_size;
  a.out.row_ptr = row_ptr;
  a.out.q_idx = q_idx;
  build_k2q_csr(a);
}

void k2q_to_q2k_cpu(const Tensor& row_ptr, const Tensor& q_idx, const Tensor& cu_seqlens_q,
                    const KVCache& kv, int kv_block_size, const Tensor& q2k) {
  MSA_CHECK(!q2k.is_cuda(), "k2q_to_q2k_cpu: q2k must be a CPU tensor");
  const ProblemShape s = api::check_q2k_problem(q2k, cu_seqlens_q, kv, kv_block_size);
  K2QIndex k2q;
  k2q.row_ptr = row_ptr;
  k2q.q_idx = q_idx;
  api::check_k2q_index(k2q, "k2q", kv, s, q2k.device);
  cpu::k2q_to_q2k(k2q, cu_seqlens_q, kv, s, q2k);
}

}  // namespace msa
