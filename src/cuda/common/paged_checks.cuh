// Device-side checks of a paged KV cache (docs/semantics.md: Paged KV, Errors), shared by the ops
// that read page pools: seqused_k in [0, max_pages * page_size], and every page id that a batch's
// length uses in [0, num_pages). The first offence goes to the status buffer (lengths by batch,
// then page ids by (batch, column)); nothing reads outside the page table's used columns.
// Two forms, both enqueued before the op's main kernel (kernels in paged_checks.cu):
// - launch_paged_checks_with_offsets (sm90/sparse_fwd/launch.cu, which has workspace): also
//   writes the clamped lengths as a flat cu_seqlens_k (key_offsets) that the rest of that launch
//   uses;
// - launch_paged_check_block (sm90/block_scores/launch.cu, no workspace): one block finds the
//   first offence by a reduction; the op's kernel clamps the lengths itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace msa::cuda {

// Inputs of the checks. With workspace, lengths are clamped to [0, max_keys] and written as a
// flat cu_seqlens_k (key_offsets), so that op's later kernels see paged batches like flat ones.
struct PagedCheckParams {
  const int32_t* page_table = nullptr;  // [B, max_pages], row stride page_table_stride
  int64_t page_table_stride = 0;
  const int32_t* seqused_k = nullptr;   // [B] or null (every batch has max_keys keys)
  int64_t batch = 0, max_pages = 0, num_pages = 0;
  int32_t page_size = 0;
  int64_t max_keys = 0;                 // max_pages * page_size (B * max_keys < 2^31: host check)
  int32_t* key_offsets = nullptr;       // out [B+1]: exclusive prefix of the clamped lengths
  unsigned long long* offence = nullptr;  // scratch: first offence key, ~0 = none
  int32_t* status = nullptr;            // int32[4]
};

// Needs key_offsets and offence (workspace); returns nothing, key_offsets holds the result.
void launch_paged_checks_with_offsets(const PagedCheckParams& c, cudaStream_t stream);
// key_offsets and offence unused.
void launch_paged_check_block(const PagedCheckParams& c, cudaStream_t stream);

}  // namespace msa::cuda
