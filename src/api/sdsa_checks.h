// Argument rules the SDSA indexer's entry points share (src/api/sdsa.cpp, sdsa_rows.cpp). Each
// throws msa::Error naming the argument and the rule broken.
#pragma once

#include "common/problem.h"
#include "msa/sdsa.h"

namespace msa::api {

// [n] int32, contiguous.
void check_i32_vector(const Tensor& t, const char* name, int64_t n);

// Index query or key values with `ndim` dims: bf16 | f16 without a scale, or NVFP4 (fp4x2 with
// an e4m3 scale [leading dims, D / 16] and a finite global scale > 0). Returns D (logical).
int64_t check_index_values(const QTensor& x, const char* name, int ndim);

// The key cache's shapes and dtypes; returns batch, head_dim, page_size, num_pages, max_pages.
ProblemShape check_index_cache(const IndexKeyCache& c);
// The query rows' shapes against the cache's; fills total_q.
void check_index_rows(const IndexQueryRows& r, ProblemShape& s);

// Host values (CPU tensors): every seq_lens[b] in [0, W * page_size] and the page ids it covers
// in [0, num_pages).
void check_cache_values(const IndexKeyCache& c, const ProblemShape& s);
// Host values: each row's request in [0, B) and row_lens[t] in [0, seq_lens[b]]. Returns the
// longest row.
int64_t check_row_values(const IndexQueryRows& r, const IndexKeyCache& c, const ProblemShape& s);

// The candidate stores of T rows: candidates [T, C >= 1, 2], ties [T, Ct], counts [T, 3], int32
// and contiguous.
void check_candidate_stores(const Tensor& candidates, const Tensor& ties, const Tensor& counts,
                            int64_t rows);

}  // namespace msa::api
