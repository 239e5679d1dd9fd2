// CPU backend of build_k2q_csr (msa/csr.h), called by api/csr.cpp after argument validation:
// check the q2k ids, then write the k2q CSR and, if requested, the work schedule.
#include "api/validate.h"
#include "backend.h"
#include "cpu/k2q.h"

namespace msa::cpu {

void build_k2q_csr(const CsrBuildArgs& a, const ProblemShape& s) {
  const BatchGeometry g =
      batch_geometry(a.cu_seqlens_q, api::host_key_lengths(a.kv, s), s.kv_block_size);
  check_q2k_ids(a.q2k, g);
  int32_t* row_ptr = a.out.row_ptr.ptr<int32_t>();
  const int64_t rows = a.out.row_ptr.shape[1] - 1;  // checked >= g.total_rows()
  fill_k2q(a.q2k, g, rows, row_ptr, a.out.q_idx.ptr<int32_t>());
  if (a.out.schedule.defined()) fill_schedule(row_ptr, s.num_kv_heads, rows, a.out.schedule);
}

}  // namespace msa::cpu
