// Host side of the CUDA decode plan: the geometry a DecodeShape implies (query chunks, rows per
// CTA, workspace layout with shape-only bounds) and the split-KV work list for given lengths.
// Called by launch.cu (DecodePlan::plan / run through backend.h). Pure host code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/sm90/decode/params.h"
#include "msa/decode.h"

namespace msa::cuda::decode {

constexpr int kTileKeys = 128;          // key slots per tile (traits.h builds on this)
// Sparse plans of kv blocks with G dividing 16: one m16 row tile of whole queries per CTA, so all
// warps split keys. Token plans (kv_block_size 1), and block plans of other groups, serve one
// query per CTA with all of its G rows instead (up to max_rows(D), head chunks past that, as
// dense plans; plan.cpp geometry).
constexpr int kSparseRows = 16;
constexpr int kMaxItemEntries = 512;    // sparse: union entries one item may cover (smem ids/masks)
// sparse: union bitmap words, 65536 blocks per request (token ids: 65536 keys, which
// build_work_list checks on every request's planned capacity)
constexpr int kMaxBitmapWords = 2048;

// The head dims the kernels are compiled for (launch_kernels.h lists the instantiations).
constexpr bool is_decode_head_dim(int d) { return d == 64 || d == 128 || d == 256; }
// Whether kernels exist for KV of dtype kv at head dim d: bf16 / f16 at every head dim, FP8 e4m3
// at 128 and 256 (its 64-byte rows at D = 64 fill half a 128-byte line, traits.h), NVFP4 at 128
// (its producers convert 64-byte packed rows, load_fp4.cuh).
constexpr bool has_kernels(DType kv, int d) {
  if (kv == DType::fp8_e4m3) return d == 128 || d == 256;
  if (kv == DType::fp4x2) return d == 128;
  return is_decode_head_dim(d);
}
// Consumer warps that share one 16-row tile, each holding the O accumulators of D / parts head
// dims: 2 at D = 256, where a warp's 16 x 256 f32 O (128 registers) beside its Q fragments (64)
// and S (32) would not fit the consumers' 200-216 registers (traits.h). Both warps of a tile form
// the whole S (Q K^T over all D), and each multiplies P by its half of V.
constexpr int dim_parts(int d) { return d == 256 ? 2 : 1; }
// Query rows (queries x G, or a chunk of a query's heads) per CTA: 16 per consumer warp and dim
// part, 8 warps (128 rows; 64 at D = 256).
constexpr int max_rows(int d) { return 8 * 16 / dim_parts(d); }
// Up to this many rows a CTA may have 4 consumer warps (64; 32 at D = 256).
constexpr int narrow_rows(int d) { return 4 * 16 / dim_parts(d); }

struct Geometry {
  bool sparse = false;
  int group = 1;
  int head_dim = 128;
  int queries_per_chunk = 1;   // queries of one request a CTA serves
  // G > max_rows(D) (D = 256, G > 64; dense or one-query sparse plans): a query's heads split into
  // head_chunks chunks of heads_per_chunk (the last one shorter), queries_per_chunk is 1. Else 1
  // and G.
  int head_chunks = 1, heads_per_chunk = 1;
  int chunks = 1;              // ceil(max_queries_per_request / queries_per_chunk) * head_chunks
  int rows_max = 16;           // queries_per_chunk * heads_per_chunk
  int entries_per_tile = 1;    // sparse: 128 / kv_block_size union entries per tile
  int64_t max_tiles_per_item = 0;  // sparse: kMaxItemEntries / entries_per_tile; dense: no cap
  int bitmap_words = 0;        // sparse: ceil(max blocks per request / 32)
  int warps = 8;               // CTA width: 4 when rows_max <= narrow_rows(D), else 8
  int sm_count = 1;
  int ctas_per_sm = 1;         // resident CTAs per SM (4 warps: 2 when the smem allows)
  int slots = 1;               // sm_count * ctas_per_sm
  int max_waves = 1;           // split candidates aim at up to this many CTAs per slot
  int64_t max_items = 0, max_jobs = 0, max_partials = 0;
  // Workspace byte offsets (256-aligned) and total.
  size_t off_offence = 0, off_items = 0, off_jobs = 0, off_job_done = 0, off_caps = 0,
         off_part_lse = 0, off_part_o = 0, bytes = 0;
};

// What the device offers the main kernel (launch.cu queries it).
struct DeviceLimits {
  int sm_count = 1;
  size_t smem_per_sm = 0;        // shared memory of an SM
  size_t smem_reserved_cta = 0;  // shared memory the driver reserves per CTA
};

// Throws msa::Error naming the limit when the shape exceeds what the kernels support. `warps`:
// the CTA width, 4 (only where rows_max <= narrow_rows(D), else 8) or 8; run() passes the planned
// one, tests and bench_decode --warps a forced one. 0: the heuristic.
Geometry geometry(const DecodeShape& s, const DeviceLimits& d, int warps = 0);

// Workspace bytes that cover the plan of either CTA width.
size_t workspace_bytes(const DecodeShape& s, const DeviceLimits& d);

struct WorkList {
  std::vector<DecodeItem> items;  // launch order: larger items first
  std::vector<CombineJob> jobs;
  std::vector<int32_t> key_cap;   // [B]
  int64_t partials = 0;
  // > 0 when the list is the identity: one unsplit item per (request, chunk) in their natural
  // order (item i = request i / chunks, chunk i % chunks, tiles [0, identity_tiles)), where
  // identity_tiles is the largest unit's tile count. The kernel then derives its item from its
  // CTA index instead of loading it: one dependent global load less before the first K/V byte.
  int32_t identity_tiles = 0;
};

// Whether the main kernel loads K/V under an L2 evict_first policy (sm90::l2_evict_first_policy):
// for a sparse plan with one query chunk per request (every K/V line is read by one CTA, once)
// whose items x Hkv CTAs fit one wave. Measured on the H200: DEC-B32
// 51.3 -> 49.3 us, as the lines an earlier kernel left in L2 (the benchmark's flush leaves 60 MB
// of dirty ones) stay there; worse for dense plans (DEC-B32-dense +6.5%) and many waves
// (DEC-B2048 +0.6%), and several chunks of a request share blocks through L2 (DEC-MTP).
bool kv_evict_first(const Geometry& g, int64_t items, int num_kv_heads);

// Splits every (request, query chunk) into items so that items x Hkv CTAs finish together on
// the device's CTA slots (list scheduling in launch order over a few split sizes). lengths[b]: the
// planned keys of request b.
WorkList build_work_list(const DecodeShape& s, const Geometry& g,
                         const std::vector<int64_t>& lengths);

}  // namespace msa::cuda::decode
