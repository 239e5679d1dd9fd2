// The ICP (index-context-parallel) indexer (docs/semantics.md, ICP indexer; DESIGN section 20):
// the index keys of a page pool sharded by context over `world` ranks. Each rank lists, per
// (selection head, token), its best blocks from its own shard (icp_rank_lists); the caller moves
// the lists to the rank that owns the head (an all-to-all); the owner merges every rank's lists
// into q2k rows (icp_merge) that equal block_topk's on the unsharded pool. The caller owns every
// buffer and the collective; neither op allocates, and neither reads a tensor on the host unless
// it is a CPU tensor. CUDA (sm_90a): D = 128, bf16 / f16 / FP8 index keys, 4 or more index heads
// per key head, every layout but p128 over 4 ranks (its 32-row shard pages), topk <= 64.
#pragma once

#include "msa/common.h"

namespace msa {

// How each page of index keys is split over the ranks. p128 (pages of 128 keys): rows
// interleaved, page row j on rank j % world at shard row j / world. p256 (pages of 256 keys):
// contiguous parts, page row j on rank j / (256 / world) at shard row j % (256 / world).
enum class IcpLayout { p128, p256 };

// Keys of one page (128 or 256) and rows of a rank's shard page (128 / world or 256 / world);
// world must be 2 or 4 (an msa::Error otherwise).
int icp_page_rows(IcpLayout layout);
int icp_rows_per_rank(IcpLayout layout, int world);

struct IcpRankListsArgs {
  IcpLayout layout = IcpLayout::p128;
  int world = 2;           // 2 or 4
  int rank = 0;            // 0 .. world - 1
  QTensor index_q;         // [total_q, Hi, D]: every index head, on every rank; bf16 | f16 |
                           // fp8_e4m3 (scale per tensor, token, or token and head)
  QTensor shard;           // [num_pages, rows_per_rank, Hik, D] (paged_nhd), q's dtype, Hik
                           // dividing Hi; FP8 scale per tensor [1], per slot [num_pages *
                           // rows_per_rank] or per slot and head (slot = page * rows_per_rank +
                           // shard row: the scales move with their rows)
  Tensor page_table;       // [B, max_pages] int32: the unsharded pool's table, the same on every rank
  Tensor seqused_k;        // [B] int32, optional: keys per request (default max_pages * page rows)
  Tensor cu_seqlens_q;     // [B+1] int32
  int topk = 16;           // the owner's K; sink_blocks + local_blocks <= topk
  int sink_blocks = 1;
  int local_blocks = 1;
  bool causal = true;
  // Out, [Hsel, total_q, topk] (Hsel dividing Hi: head h selects by index heads
  // [h Hi / Hsel, (h + 1) Hi / Hsel)). Row (h, t): the visible, not forced 128-key blocks this
  // rank holds keys of, by this rank's group score (highest first, ties toward the lower id), at
  // most topk minus the token's forced blocks; `ids` -1 and `scores` -inf after the list.
  Tensor ids;              // int32
  Tensor scores;           // f32: each listed block's group score over this rank's keys
  Tensor workspace;        // CUDA: uint8, at least icp_rank_lists_workspace_bytes (none where
                           // the kernel keeps the lists, else the rank's partial block scores);
                           // ignored on the CPU
  Tensor status;           // int32[4], required on CUDA
};

// Bytes of icp_rank_lists' CUDA workspace: 0 where the indexer kernel keeps the lists itself
// (selection heads that split the key heads, topk minus the forced blocks within a list's size:
// block_topk's rule, msa/indexer.h), else Hi * max_pages * total_q * 4; 0 for CPU tensors.
size_t icp_rank_lists_workspace_bytes(const IcpRankListsArgs& args);

// One rank's lists. A NaN group score of a visible block (a NaN in index_q or in a key) makes the
// sharded selection differ from block_topk's (NaN ranks last, so the rank holding it would not
// list the block while another rank's finite part stood in for it): it is an msa::Error (on CUDA
// reported through status, StatusCode::icp_nan_score).
void icp_rank_lists(const IcpRankListsArgs& args, cudaStream_t stream = nullptr);

struct IcpMergeArgs {
  IcpLayout layout = IcpLayout::p128;  // for the default lengths (max_pages * page rows)
  Tensor ids, scores;      // [world, Hsel, total_q, topk]: rank r's icp_rank_lists rows of the
                           // heads this owner merges at [r] (any subset of the selection heads,
                           // the same on every rank)
  Tensor page_table;       // [B, max_pages] int32: only its shape is read (the default lengths)
  Tensor seqused_k;        // [B] int32, optional, as given to icp_rank_lists
  Tensor cu_seqlens_q;     // [B+1] int32
  int topk = 16, sink_blocks = 1, local_blocks = 1;  // as given to icp_rank_lists
  bool causal = true;
  Tensor q2k;              // out: [Hsel, total_q, topk] int32, ascending, -1 padded
  Tensor status;           // int32[4], required on CUDA
};

// The owner's merge: per row, the forced blocks, then the listed blocks by their best score over
// the ranks (ties toward the lower id) up to topk, written ascending. Equal to block_topk's row
// on the unsharded pool with Hsel selection heads when every rank's lists came from the same
// inputs and options. Rows that are not a rank's lists are an msa::Error (on CUDA reported
// through status, StatusCode::icp_list_invalid, and the entry skipped).
void icp_merge(const IcpMergeArgs& args, cudaStream_t stream = nullptr);

}  // namespace msa
