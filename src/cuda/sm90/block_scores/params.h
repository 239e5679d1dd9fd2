// Kernel parameters of the sm_90a indexer (plain POD; shapes on every pointer).
#pragma once

#include <cstdint>

#include "cuda/common/icp_shard.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/topk_select.cuh"
#include "cuda/common/paged_kv.cuh"

namespace msa::cuda::indexer_sm90 {

// FP4 rows (fp4.cuh): packed e2m1 [.., 64] bytes (D = 128, element 2i in the low nibble) and
// their byte scales [.., 8] (NVFP4: e4m3 per 16 values) or [.., 4] (MXFP4: e8m0 per 32). Row
// (a, b, head) starts at a * stride[0] + b * stride[1] + head * stride[2] bytes: q and flat K
// (token, 0, head); a page pool (page, slot, head) in either layout. Value rows 16-byte
// aligned, scale rows 4-byte aligned (launch.cu).
// Preordered scales (docs/semantics.md, Quantized formats; common/fp4_scale_layout.h): the row
// (a, b, head) is matrix l = head (q, flat K: m = a, the token) or a * heads + head (a pool:
// m = b, the slot) of a [L, rest_m, rest_g, 32, 4, 4] tensor; s_stride is then unused.
struct Fp4Rows {
  const uint8_t* values;
  const uint8_t* scales;
  int64_t v_stride[3], s_stride[3];
  int32_t nvfp4;       // 1: e4m3 scales per 16 values, 0: e8m0 per 32
  int32_t preordered;  // 1: scales in the preordered layout
  int32_t pool;        // 1: a page pool (rows are (page, slot, head))
  int32_t heads, rest_g;
  int64_t rest_m;
};
struct Fp4Params {
  Fp4Rows q, k;
  float global;  // NVFP4 global scales of q and k multiplied (1 for MXFP4), applied to each score
};

struct Params {
  const int32_t* cu_seqlens_q;  // [B+1]
  KeyLengths keys;              // flat: cu_seqlens_k [B+1]; paged: seqused_k [B] (nullable)
                                // and max_keys = max_pages * page_size
  PagedKV paged;                // page_table null: flat K; else K is a page pool (4-D map)
  const float* q_scale;         // fp8 only, nullable: [1] | [total_q] | [total_q, Hq]
  const float* k_scale;         // fp8 only, nullable: [1] | [total_k] | [total_k, Hkv] (paged: [1])
  int q_scale_kind, k_scale_kind;  // 0 none, 1 per tensor, 2 per token, 3 per token and head
  Fp4Params fp4;                // FP4 inputs only
  float* scores;                // [Hq, nblk_max, total_q] or null (fused)
  int32_t* q2k;                 // [Hsel, total_q, topk] (fused) or null; a fused shard: the
                                // rank's list ids, best first, -1 after
  float* list_scores;           // a fused shard: the lists' group scores, -inf after
  int32_t* status;              // int32[4]
  SelectRule rule;              // fused only
  ShardMap shard;               // an ICP rank's shard (paged: icp_rank_lists): lengths and
                                // causal limits count the unsharded pool's keys, the kernel walks
                                // the shard's (work.cuh); zero otherwise
  int64_t total_q, total_k, batch, nblk_max;
  int num_q_heads, num_kv_heads, group;
  int row_groups, tokens_per_cta;
  // Fused: the lists (traits.h): each token's 2^list_shift lists select by sel_group =
  // 2^sel_shift consecutive heads each (list_shift + sel_shift = log2 group); list l of the CTA
  // is token l >> list_shift's, q2k row h * 2^list_shift + (l & (2^list_shift - 1)).
  // cta_lists = the CTA's lists (tokens_per_cta << list_shift), list_cap = the keys each holds.
  int sel_group, sel_shift, list_shift, cta_lists, list_cap;
  // Grid z = seg_groups x item_splits (launch.cu). seg_groups: the CTAs of a token tile that
  // holds many short batches (decode) each take a share of its batches (group_tokens, work.cuh);
  // item_splits (unfused only): each takes a share of those batches' items (cta_items).
  int seg_groups, item_splits;
  bool causal;
};

}  // namespace msa::cuda::indexer_sm90
