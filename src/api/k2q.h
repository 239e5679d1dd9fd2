// Argument rules for the k2q CSR family, shared by api/csr.cpp (builder outputs, converters) and
// api/attention.cpp (the optional K2QIndex input). Each check throws msa::Error naming the
// argument and the rule.
#pragma once

#include "api/validate.h"

namespace msa::api {

// A K2QIndex for a problem with s.num_kv_heads, s.total_q, s.topk (row_ptr, q_idx required;
// schedule optional, at least k2q_schedule_size elements). `name` prefixes messages ("out",
// "k2q"). row_ptr's total_rows may exceed sum_b nblk_b (an upper bound such as
// total_k / kv_block_size + B; the rows past it are empty); on CPU it is checked to be at least
// that sum, on CUDA the device reports a shortfall. Returns total_rows.
int64_t check_k2q_index(const K2QIndex& k2q, const char* name, const KVCache& kv,
                        const ProblemShape& s, Device device);

}  // namespace msa::api
