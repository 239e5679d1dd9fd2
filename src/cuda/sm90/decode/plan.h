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

constexpr int kHeadDim = 128;
constexpr int kTileKeys = 128;          // key slots per tile (traits.h builds on this)
constexpr int kMaxRows = 128;           // query rows (queries x G) per CTA: 8 warps x 16
constexpr int kNarrowRows = 64;         // up to this many rows a CTA has 4 warps (traits.h)
constexpr int kSparseRows = 16;         // sparse: one m16 row tile, so all warps split keys
constexpr int kMaxItemEntries = 512;    // sparse: union entries one item may cover (smem ids/masks)
constexpr int kMaxBitmapWords = 2048;   // sparse: union bitmap words (65536 blocks per request)

struct Geometry {
  bool sparse = false;
  int group = 1;
  int queries_per_chunk = 1;   // queries of one request a CTA serves
  int chunks = 1;              // ceil(max_queries_per_request / queries_per_chunk)
  int rows_max = 16;           // queries_per_chunk * G
  int entries_per_tile = 1;    // sparse: 128 / kv_block_size union entries per tile
  int64_t max_tiles_per_item = 0;  // sparse: kMaxItemEntries / entries_per_tile; dense: no cap
  int bitmap_words = 0;        // sparse: ceil(max blocks per request / 32)
  int warps = 8;               // CTA width: 4 when rows_max <= kNarrowRows, else 8
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
// the CTA width, 4 (only where rows_max <= kNarrowRows, else 8) or 8; run() passes the planned
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
