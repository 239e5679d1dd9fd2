// The CUDA decode planner (plan.h): geometry and workspace bounds from the shape alone, then the
// split-KV work list from the host lengths. Host only; launch.cu uploads the result.
#include "cuda/sm90/decode/plan.h"
#include "cuda/sm90/decode/traits.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <numeric>
#include <queue>

#include "msa/error.h"

namespace msa::cuda::decode {
namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Planned keys of a request round up to whole tiles: a length may later grow inside its last
// tile without a new plan (the kernel checks it against this capacity).
int64_t key_capacity(const DecodeShape& s, int64_t length) {
  const int64_t cap = std::min<int64_t>(int64_t(s.max_pages) * s.page_size, INT32_MAX);
  return std::min(cap, ceil_div(length, kTileKeys) * kTileKeys);
}

// Tiles of one (request, chunk) given the request's planned key capacity. Chunk c holds queries
// from (c / head_chunks) * queries_per_chunk (head chunks: one query, a share of its heads).
int64_t unit_tiles(const DecodeShape& s, const Geometry& g, int64_t cap, int chunk) {
  if (!g.sparse) return ceil_div(cap, kTileKeys);
  const int64_t q0 = int64_t(chunk / g.head_chunks) * g.queries_per_chunk;
  const int64_t queries =
      std::min<int64_t>(g.queries_per_chunk, s.max_queries_per_request - q0);
  const int64_t entries = std::min(queries * s.topk, ceil_div(cap, s.kv_block_size));
  return ceil_div(entries, g.entries_per_tile);
}

// Cost of one CTA in tile loads of a CTA alone on its SM: the tiles (slowed by the CTAs sharing
// the SM's bandwidth) plus a fixed prologue/epilogue, plus the partial write and its share of
// the combine when the unit is split.
double cta_cost(int64_t tiles, bool split, int ctas_per_sm) {
  return double(tiles) * ctas_per_sm + 1.0 + (split ? 0.25 : 0.0);
}

// Shared memory of a 4-warp CTA of the shape's KV kind and head dim (has_kernels holds).
size_t narrow_smem_bytes(const DecodeShape& s, int bitmap_words) {
  const bool fp8 = s.kv_dtype == DType::fp8_e4m3;
  switch (s.head_dim) {
    case 64: return smem_bytes<KV::native, 4, 64>(bitmap_words);
    case 256:
      return fp8 ? smem_bytes<KV::fp8, 4, 256>(bitmap_words)
                 : smem_bytes<KV::native, 4, 256>(bitmap_words);
    default:
      return fp8                          ? smem_bytes<KV::fp8, 4, 128>(bitmap_words)
             : s.kv_dtype == DType::fp4x2 ? smem_bytes<KV::nvfp4, 4, 128>(bitmap_words)
                                          : smem_bytes<KV::native, 4, 128>(bitmap_words);
  }
}

struct Candidate {
  std::vector<int64_t> unit_splits;  // per unit
  double makespan = 0;
  int64_t ctas = 0;
};

// Split every unit into ceil(tiles / c) near-equal parts, order the parts largest first and
// simulate the hardware's in-order CTA dispatch onto the slots.
Candidate evaluate(const std::vector<int64_t>& tiles, int64_t c, int hkv, const Geometry& g) {
  Candidate r;
  r.unit_splits.resize(tiles.size());
  std::vector<std::pair<int64_t, bool>> parts;  // (tiles, split)
  for (size_t i = 0; i < tiles.size(); ++i) {
    const int64_t n = std::max<int64_t>(1, ceil_div(tiles[i], c));
    r.unit_splits[i] = n;
    for (int64_t j = 0; j < n; ++j)
      parts.push_back({tiles[i] * (j + 1) / n - tiles[i] * j / n, n > 1});
  }
  std::stable_sort(parts.begin(), parts.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < g.slots; ++i) free_at.push(0.0);
  for (const auto& [t, split] : parts)
    for (int h = 0; h < hkv; ++h) {
      const double start = free_at.top();
      free_at.pop();
      const double end = start + cta_cost(t, split, g.ctas_per_sm);
      r.makespan = std::max(r.makespan, end);
      free_at.push(end);
    }
  r.ctas = int64_t(parts.size()) * hkv;
  return r;
}

}  // namespace

Geometry geometry(const DecodeShape& s, const DeviceLimits& d, int warps) {
  MSA_CHECK(warps == 0 || warps == 4 || warps == 8, "decode geometry: width 0, 4 or 8, got ", warps);
  MSA_CHECK(has_kernels(s.kv_dtype, s.head_dim), "decode geometry: no CUDA decode kernels for ",
            dtype_name(s.kv_dtype), " KV at head_dim ", s.head_dim,
            " (api/decode.cpp refuses such shapes)");
  Geometry g;
  g.sparse = s.topk > 0;
  g.group = s.num_q_heads / s.num_kv_heads;
  g.head_dim = s.head_dim;
  g.sm_count = std::max(1, d.sm_count);
  // Sparse over kv blocks with G dividing 16: one 16-row tile of whole queries per CTA, so every
  // warp works on every selected block (a request's queries select mostly different blocks;
  // sharing a CTA would idle warps). Dense: all queries of the request (up to max_rows(D) rows)
  // share each K/V load; a group larger than that (D = 256, G > 64) splits into near-equal
  // chunks of a query's heads, each a CTA that reads the K/V once more.
  //
  // Token ids (kv_block_size 1), and sparse groups that do not divide 16: one query per CTA with
  // all of its G rows, tiled as a dense plan's (16-row tiles of its heads, head chunks past
  // max_rows(D)). Such a CTA attends every entry of its union and needs no query mask (kernel.cuh
  // passes none for one query), so any G up to 128 runs. Token plans take it at every G: the
  // consumers apply a union entry's query mask to a whole attend window of up to 64 slots
  // (kernel.cuh consume), which holds one block of 64 or 128 keys but 64 entries of one key each
  // (several queries per CTA would need a mask per slot). Block plans take it for the groups
  // that do not divide 16, which their 16-row tiles of whole queries were not built for.
  const bool one_query = g.sparse && (s.kv_block_size == 1 || kSparseRows % g.group != 0);
  const int rows = g.sparse && !one_query ? kSparseRows : max_rows(s.head_dim);
  g.head_chunks = int(ceil_div(g.group, rows));
  g.heads_per_chunk = int(ceil_div(g.group, g.head_chunks));
  g.queries_per_chunk =
      one_query ? 1 : std::min(std::max(1, rows / g.heads_per_chunk), s.max_queries_per_request);
  g.chunks = int(ceil_div(s.max_queries_per_request, g.queries_per_chunk)) * g.head_chunks;
  g.rows_max = g.queries_per_chunk * g.heads_per_chunk;
  const int64_t cap_keys = int64_t(s.max_pages) * s.page_size;
  int64_t tiles_max = ceil_div(cap_keys, kTileKeys);
  if (g.sparse) {
    g.entries_per_tile = kTileKeys / s.kv_block_size;
    g.max_tiles_per_item = kMaxItemEntries / g.entries_per_tile;
    const int64_t blocks = ceil_div(cap_keys, s.kv_block_size);
    if (s.kv_block_size == 1) {
      // Token ids: the bitmap covers up to kMaxBitmapWords x 32 keys, and build_work_list refuses
      // a request whose planned capacity exceeds that, so a shape with a larger max_pages x
      // page_size still plans requests that fit.
      g.bitmap_words = int(std::min<int64_t>(ceil_div(blocks, 32), kMaxBitmapWords));
    } else {
      MSA_CHECK(ceil_div(blocks, 32) <= kMaxBitmapWords,
                "decode shape: sparse CUDA decode supports up to ", int64_t(kMaxBitmapWords) * 32,
                " kv blocks per request (max_pages * page_size / ", "kv_block_size), got ", blocks);
      g.bitmap_words = int(ceil_div(blocks, 32));
    }
    tiles_max = ceil_div(std::min<int64_t>(int64_t(g.queries_per_chunk) * s.topk, blocks),
                         g.entries_per_tile);
  } else {
    g.max_tiles_per_item = std::max<int64_t>(1, tiles_max);
  }
  // CTA width, and how many CTAs of it an SM holds (the 8-warp CTA takes most of an SM's smem).
  // 4 warps pay off where two CTAs per SM hide each other's prologue and epilogue, i.e. with
  // several waves of them (DEC-MTP 365 -> 292 us, DEC-B2048 3.2 -> 3.9 TB/s). With fewer
  // (request, chunk, kv head) units than two per CTA slot, an 8-warp CTA per SM streams its unit
  // with twice the bytes in flight (DEC-B32 59 vs 64 us, DEC-B32-dense 278 vs 292-320 us).
  const int64_t unit_ctas = int64_t(s.batch) * g.chunks * s.num_kv_heads;
  const int narrow = narrow_rows(s.head_dim);
  g.warps = g.rows_max <= narrow && unit_ctas >= 4 * int64_t(g.sm_count) ? 4 : 8;
  if (warps != 0) g.warps = warps == 4 && g.rows_max <= narrow ? 4 : 8;
  if (g.warps == 4) {
    const size_t cta = narrow_smem_bytes(s, g.bitmap_words) + d.smem_reserved_cta;
    g.ctas_per_sm = int(std::clamp<size_t>(d.smem_per_sm / cta, 1, 2));
  }
  g.slots = g.sm_count * g.ctas_per_sm;
  // Splitting aims at up to max_waves CTAs per slot (256 / rows_max per SM); fewer for wide
  // CTAs, whose partials are larger.
  g.max_waves = std::max(2, 256 / g.rows_max / g.ctas_per_sm);
  const int64_t units = int64_t(s.batch) * g.chunks;
  const int64_t spread = ceil_div(int64_t(g.max_waves) * g.slots, s.num_kv_heads) + 1;
  // Units longer than max_tiles_per_item (sparse, huge topk) split regardless of the balance.
  const int64_t forced = g.sparse && tiles_max > g.max_tiles_per_item
                             ? ceil_div(tiles_max, g.max_tiles_per_item)
                             : 0;
  // Bounds (build_work_list asserts them): items <= units + T / c and split items
  // <= 2 T / c, where T / c <= max_waves * slots / Hkv for the balance candidates.
  g.max_items = units + spread + units * forced;
  g.max_partials = std::min(g.max_items, 2 * spread + 2 * units * forced);
  g.max_jobs = g.max_partials / 2;
  const int64_t hkv = s.num_kv_heads;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  g.off_offence = take(2 * sizeof(unsigned long long));  // offence key, then the CTA counter
  g.off_items = take(size_t(g.max_items) * sizeof(DecodeItem));
  g.off_jobs = take(size_t(g.max_jobs) * sizeof(CombineJob));
  g.off_job_done = take(size_t(g.max_jobs) * hkv * sizeof(uint32_t));  // zero between runs
  g.off_caps = take(size_t(s.batch) * sizeof(int32_t));
  g.off_part_lse = take(size_t(g.max_partials) * hkv * g.rows_max * sizeof(float));
  g.off_part_o =
      take(size_t(g.max_partials) * hkv * g.rows_max * size_t(s.head_dim) * sizeof(float));
  g.bytes = off;
  return g;
}

size_t workspace_bytes(const DecodeShape& s, const DeviceLimits& d) {
  const Geometry wide = geometry(s, d, 8);
  return wide.rows_max <= narrow_rows(s.head_dim) ? std::max(wide.bytes, geometry(s, d, 4).bytes)
                                                  : wide.bytes;
}

bool kv_evict_first(const Geometry& g, int64_t items, int num_kv_heads) {
  return g.sparse && g.chunks == 1 && items * num_kv_heads <= g.slots;
}

WorkList build_work_list(const DecodeShape& s, const Geometry& g,
                         const std::vector<int64_t>& lengths) {
  WorkList w;
  w.key_cap.resize(s.batch);
  std::vector<int64_t> tiles;
  tiles.reserve(size_t(s.batch) * g.chunks);
  int64_t total = 0, largest = 1;
  for (int b = 0; b < s.batch; ++b) {
    const int64_t cap = key_capacity(s, lengths[b]);
    // Token ids: the union bitmap has a bit per key of the request (geometry's bitmap_words), and
    // the kernel attends at most a request's planned capacity, so that capacity must fit it.
    MSA_CHECK(!g.sparse || s.kv_block_size != 1 || cap <= int64_t(g.bitmap_words) * 32,
              "decode: sparse CUDA decode with token ids (kv_block_size 1) takes up to ",
              int64_t(kMaxBitmapWords) * 32, " keys per request; request ", b, " has ",
              lengths[b], " keys (planned capacity ", cap,
              ": the length rounded up to a multiple of 128, or max_pages * page_size when "
              "seqused_k_host is null)");
    w.key_cap[b] = int32_t(cap);
    for (int c = 0; c < g.chunks; ++c) {
      tiles.push_back(unit_tiles(s, g, cap, c));
      total += tiles.back();
      largest = std::max(largest, tiles.back());
    }
  }
  if (tiles.empty()) return w;
  // Candidate split sizes: no split, and the sizes that give k CTAs per slot (k <= max_waves).
  std::vector<int64_t> sizes = {largest};
  for (int k = 1; k <= g.max_waves; ++k)
    sizes.push_back(ceil_div(total * s.num_kv_heads, int64_t(k) * g.slots));
  Candidate best;
  int64_t best_c = 0;
  for (int64_t c : sizes) {
    c = std::clamp<int64_t>(c, 1, g.max_tiles_per_item);
    if (c == best_c) continue;
    Candidate r = evaluate(tiles, c, s.num_kv_heads, g);
    const bool better = best_c == 0 || r.makespan < best.makespan - 1e-9 ||
                        (r.makespan < best.makespan + 1e-9 && r.ctas < best.ctas);
    if (better) {
      best = std::move(r);
      best_c = c;
    }
  }
  // Materialise the chosen split in the order evaluate() simulated (largest parts first).
  struct Part {
    DecodeItem item;
    int64_t tiles;
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const int64_t n = best.unit_splits[i];
    const int b = int(i / g.chunks), c = int(i % g.chunks);
    if (n > 1) {
      w.jobs.push_back({b, c, int32_t(w.partials), int32_t(n)});
    }
    for (int64_t j = 0; j < n; ++j) {
      Part p;
      p.item.batch = b;
      p.item.chunk = c;
      p.item.tile_begin = int32_t(tiles[i] * j / n);
      p.item.tile_end = int32_t(tiles[i] * (j + 1) / n);
      p.item.partial = n > 1 ? int32_t(w.partials + j) : -1;
      p.item.job = n > 1 ? int32_t(w.jobs.size() - 1) : -1;
      p.tiles = p.item.tile_end - p.item.tile_begin;
      parts.push_back(p);
    }
    if (n > 1) w.partials += n;
  }
  std::stable_sort(parts.begin(), parts.end(),
                   [](const Part& a, const Part& b) { return a.tiles > b.tiles; });
  w.items.reserve(parts.size());
  for (const Part& p : parts) w.items.push_back(p.item);
  bool identity = w.partials == 0;
  for (size_t i = 0; identity && i < w.items.size(); ++i)
    identity =
        w.items[i].batch == int32_t(i / g.chunks) && w.items[i].chunk == int32_t(i % g.chunks);
  if (identity) w.identity_tiles = int32_t(std::min<int64_t>(largest, INT32_MAX));
  MSA_CHECK(int64_t(w.items.size()) <= g.max_items && w.partials <= g.max_partials &&
                int64_t(w.jobs.size()) <= g.max_jobs,
            "decode: internal error: work list (", w.items.size(), " items, ", w.partials,
            " partials, ", w.jobs.size(), " jobs) exceeds its workspace bound (", g.max_items,
            ", ", g.max_partials, ", ", g.max_jobs, ")");
  return w;
}

}  // namespace msa::cuda::decode
