// CPU reference of the index-context-parallel (ICP) indexer (DESIGN section 20, docs/semantics.md
// "ICP indexer"): the index keys of a page pool sharded by context over `world` ranks, each rank
// scoring its own rows, keeping a short candidate list per (selection head, token), and the
// owner merging the ranks' lists into exactly the q2k rows that block_topk gives on the unsharded
// pool. It is the oracle of the per-rank kernels to come; tests drive it with simulated ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"

namespace msa::cpu::icp {

// How each page of index keys is split over the ranks (msa/icp.h, IcpLayout).
using Layout = IcpLayout;

struct Sharding {
  Layout layout = Layout::p128;
  int world = 2;  // 2 or 4

  int page_rows() const { return layout == Layout::p128 ? 128 : 256; }
  int rows_per_rank() const { return page_rows() / world; }
  int rank_of(int row) const { return layout == Layout::p128 ? row % world : row / rows_per_rank(); }
  int shard_row(int row) const {
    return layout == Layout::p128 ? row / world : row % rows_per_rank();
  }
  int page_row(int rank, int shard_row) const {
    return layout == Layout::p128 ? shard_row * world + rank : rank * rows_per_rank() + shard_row;
  }
};

// One rank's inputs: every index query (`index_q [total_q, Hi, D]`, all heads on every rank),
// the rank's shard of the index key pool (`shard [num_pages, rows_per_rank, Hik, D]`, paged_nhd,
// bf16 / f16 / FP8 e4m3 with per-tensor or per-slot scales, slot = page * rows_per_rank + shard
// row) under the shared page table and lengths, and the selection (q2k heads Hsel dividing Hi:
// head h takes the max over index heads [h Hi/Hsel, (h+1) Hi/Hsel), DESIGN section 13).
struct RankArgs {
  Sharding sharding;
  int rank = 0;
  QTensor index_q;
  QTensor shard;
  Tensor page_table, seqused_k, cu_seqlens_q;  // host int32
  int64_t selection_heads = 0;
  int topk = 16, sink_blocks = 1, local_blocks = 1;
  bool causal = true;
};

// A block and the rank's group score for it (section 3's group score over the rank's keys).
struct Candidate {
  int32_t block = -1;
  float score = 0.f;
};

// One rank's lists, [Hsel * total_q] (row h * total_q + t): its best visible blocks by its own
// group score that are not forced, best first (ties toward the lower id), at most topk minus the
// row's forced blocks; a block none of the rank's keys of which t sees is never listed. `nan`:
// some score of a visible block was NaN on this rank (see merge).
struct RankLists {
  std::vector<std::vector<Candidate>> rows;
  bool nan = false;
};
RankLists rank_candidates(const RankArgs& a);

// One rank's rows as the public icp_rank_lists writes them (contiguous [Hsel, total_q, topk] ids
// and scores, -1 after each list), read back as its lists; an msa::Error naming the first entry
// (of rank `rank`) that no rank could have written: a block not visible or forced, a NaN score,
// a repeat, an entry after the first -1, more entries than topk minus the forced blocks.
std::vector<std::vector<Candidate>> read_rows(const RankArgs& shape, const int32_t* ids,
                                              const float* scores, int64_t rank);

// The owner's merge of every rank's lists into q2k [Hsel, total_q, topk] (host int32): the forced
// blocks, then the listed blocks by their best score over the ranks (ties toward the lower id),
// each row ascending and -1 padded. For finite scores this is block_topk's selection on the
// unsharded keys: a block of that selection has its maximum on some rank, and fewer than the
// rank's quota of blocks outrank it there, so that rank lists it with its true score; any other
// block's merged score is at most its true one. A NaN score breaks that argument (NaN ranks
// lowest, and the rank holding it does not list the block), so a merge of lists that saw NaN
// returns false and the caller reports it; the ids are then the merge's, not block_topk's.
bool merge(const std::vector<RankLists>& ranks, const RankArgs& shape, const Tensor& q2k);

}  // namespace msa::cpu::icp
