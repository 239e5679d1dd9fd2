// CPU backend of build_k2q_csr (msa/csr.h) and of the reference converter k2q_to_q2k_cpu, called
// by api/csr.cpp after argument validation: check the q2k ids, then write the k2q CSR and, if
// requested, the work schedule; or the inverse.
#include "backend.h"
#include "cpu/k2q.h"

namespace msa::cpu {

void build_k2q_csr(const CsrBuildArgs& a, const ProblemShape& s) {
  const BatchGeometry g =
      batch_geometry(a.cu_seqlens_q, host_key_lengths(a.kv, s), s.kv_block_size);
  check_q2k_ids(a.q2k, g);
  int32_t* row_ptr = a.out.row_ptr.ptr<int32_t>();
  const int64_t rows = a.out.row_ptr.shape[1] - 1;  // checked >= g.total_rows()
  fill_k2q(a.q2k, g, rows, row_ptr, a.out.q_idx.ptr<int32_t>());
  if (a.out.schedule.defined()) fill_schedule(row_ptr, s.num_kv_heads, rows, a.out.schedule);
}

void k2q_to_q2k(const K2QIndex& k2q, const Tensor& cu_seqlens_q, const KVCache& kv,
                const ProblemShape& s, const Tensor& q2k) {
  const BatchGeometry g = batch_geometry(cu_seqlens_q, host_key_lengths(kv, s), s.kv_block_size);
  fill_q2k(k2q.row_ptr.ptr<int32_t>(), k2q.q_idx.ptr<int32_t>(), k2q.row_ptr.shape[1] - 1, g, q2k);
}

}  // namespace msa::cpu
