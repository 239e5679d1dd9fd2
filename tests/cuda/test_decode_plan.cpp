// The CUDA decode planner (src/cuda/sm90/decode/plan.cpp), host code that needs no device: the CTA
// width heuristic and CTAs per SM on the benchmark shapes (H200 limits), and, over random shapes
// and lengths with either width, that the split-KV work list covers every (request, query chunk)
// unit's tiles exactly once in contiguous items, that its jobs and partial slots are consistent,
// that it is flagged as the identity exactly when it is one, and that it fits the workspace the
// shape alone sizes; the same at head dims 64 and 256, with 256's chunks of a query's heads, for
// token ids (kv_block_size 1: one query per CTA, the union bitmap's limit per request), and for
// sparse groups up to 128 (token ids, and blocks whose group does not divide 16: one query per
// CTA with all of its heads).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "cuda/sm90/decode/plan.h"
#include "msa/error.h"

namespace msa::cuda::decode {
namespace {

const DeviceLimits kH200{132, 233472, 1024};  // SMs, smem per SM, reserved per CTA

DecodeShape shape(int batch, int queries, int64_t keys, int topk, DType kv = DType::bf16) {
  DecodeShape s;
  s.batch = batch;
  s.max_queries_per_request = queries;
  s.num_q_heads = 64;
  s.num_kv_heads = 4;
  s.page_size = 128;
  s.max_pages = int((keys + 127) / 128);
  s.topk = topk;
  s.kv_dtype = kv;
  return s;
}

TEST(DecodePlan, WidthOnBenchmarkShapes) {
  struct Case {
    const char* name;
    DecodeShape s;
    int warps, ctas_per_sm;
  };
  const Case cases[] = {
      {"DEC-B32", shape(32, 1, 16384, 16), 8, 1},
      {"DEC-B32-dense", shape(32, 1, 16384, 0), 8, 1},
      {"DEC-MTP bf16", shape(30, 8, 67584, 16), 4, 2},
      {"DEC-MTP fp8", shape(30, 8, 67584, 16, DType::fp8_e4m3), 4, 2},
      {"DEC-SKEW", shape(30, 8, 270336, 16), 4, 2},
      {"DEC-B2048", shape(2048, 1, 4096, 16), 4, 2},
      {"dense, 8 queries x G 16 = 128 rows", shape(512, 8, 4096, 0), 8, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Geometry g = geometry(c.s, kH200);
    EXPECT_EQ(g.warps, c.warps);
    EXPECT_EQ(g.ctas_per_sm, c.ctas_per_sm);
    EXPECT_EQ(g.slots, 132 * c.ctas_per_sm);
    EXPECT_LE(g.bytes, workspace_bytes(c.s, kH200));
  }
  // A given width holds where the rows allow it.
  EXPECT_EQ(geometry(shape(32, 1, 16384, 16), kH200, 4).warps, 4);
  EXPECT_EQ(geometry(shape(512, 8, 4096, 0), kH200, 4).warps, 8);  // 128 rows need 8 warps
  EXPECT_EQ(geometry(shape(2048, 1, 4096, 16), kH200, 8).warps, 8);
  // DEC-B32 plans one unsplit 16-tile item per (request, kv head): the identity list.
  const DecodeShape b32 = shape(32, 1, 16384, 16);
  const WorkList b32_list = build_work_list(b32, geometry(b32, kH200), std::vector<int64_t>(32, 16384));
  EXPECT_EQ(b32_list.identity_tiles, 16);
  // L2 evict_first only for sparse one-chunk plans of one wave: DEC-B32 (128 CTAs on 132 slots),
  // not its dense twin, DEC-B2048 (many waves) or DEC-MTP (eight chunks per request).
  const auto evicts = [](const DecodeShape& s, int64_t keys) {
    const Geometry g = geometry(s, kH200);
    const WorkList w = build_work_list(s, g, std::vector<int64_t>(s.batch, keys));
    return kv_evict_first(g, int64_t(w.items.size()), s.num_kv_heads);
  };
  EXPECT_TRUE(evicts(b32, 16384));
  EXPECT_FALSE(evicts(shape(32, 1, 16384, 0), 16384));
  EXPECT_FALSE(evicts(shape(2048, 1, 4096, 16), 4096));
  EXPECT_FALSE(evicts(shape(30, 8, 67584, 16), 67584));
  EXPECT_THROW(geometry(shape(32, 1, 16384, 16), kH200, 6), Error);
}

// Checks the work list of `s` (width `warps`) for `lengths` against the geometry's bounds.
void expect_valid_work_list(const DecodeShape& s, int warps, const std::vector<int64_t>& lengths) {
  const Geometry g = geometry(s, kH200, warps);
  ASSERT_LE(g.bytes, workspace_bytes(s, kH200));
  const WorkList w = build_work_list(s, g, lengths);
  EXPECT_LE(int64_t(w.items.size()), g.max_items);
  EXPECT_LE(int64_t(w.jobs.size()), g.max_jobs);
  EXPECT_LE(w.partials, g.max_partials);
  ASSERT_EQ(int(w.key_cap.size()), s.batch);
  for (int b = 0; b < s.batch; ++b) {
    const int64_t all = int64_t(s.max_pages) * s.page_size;
    EXPECT_EQ(w.key_cap[b], std::min(all, (lengths[b] + 127) / 128 * 128)) << "request " << b;
  }
  // Items per unit: contiguous from tile 0, none empty unless the unit is one empty item.
  std::map<std::pair<int, int>, std::vector<DecodeItem>> units;
  std::set<int> partials;
  for (const DecodeItem& it : w.items) {
    ASSERT_GE(it.batch, 0);
    ASSERT_LT(it.batch, s.batch);
    ASSERT_GE(it.chunk, 0);
    ASSERT_LT(it.chunk, g.chunks);
    units[{it.batch, it.chunk}].push_back(it);
    if (it.partial >= 0) {
      EXPECT_TRUE(partials.insert(it.partial).second) << "partial slot " << it.partial << " twice";
      EXPECT_LT(it.partial, w.partials);
    }
  }
  EXPECT_EQ(int64_t(units.size()), int64_t(s.batch) * g.chunks) << "every unit has items";
  // The identity flag (the kernel then derives items from CTA indices) exactly when the list is
  // one unsplit item per unit in natural order; identity_tiles bounds every item's tiles.
  bool natural = w.partials == 0 && !w.items.empty() &&
                 int64_t(w.items.size()) == int64_t(s.batch) * g.chunks;
  int32_t largest = 0;
  for (size_t i = 0; natural && i < w.items.size(); ++i) {
    natural = w.items[i].batch == int(i / g.chunks) && w.items[i].chunk == int(i % g.chunks);
    largest = std::max(largest, w.items[i].tile_end);
  }
  if (natural) {
    EXPECT_EQ(w.identity_tiles, std::max(largest, 1));
    for (const DecodeItem& it : w.items) {
      EXPECT_EQ(it.tile_begin, 0);
      EXPECT_EQ(it.partial, -1);
    }
  } else {
    EXPECT_EQ(w.identity_tiles, 0);
  }
  for (auto& [key, items] : units) {
    std::sort(items.begin(), items.end(),
              [](const DecodeItem& a, const DecodeItem& b) { return a.tile_begin < b.tile_begin; });
    EXPECT_EQ(items.front().tile_begin, 0);
    for (size_t i = 1; i < items.size(); ++i)
      EXPECT_EQ(items[i].tile_begin, items[i - 1].tile_end) << "unit (" << key.first << ", "
                                                            << key.second << ")";
    if (items.size() == 1) {
      EXPECT_EQ(items[0].partial, -1);
      EXPECT_EQ(items[0].job, -1);
      continue;
    }
    // A split unit: one job naming it, its splits' partial slots in order.
    const int job = items[0].job;
    ASSERT_GE(job, 0);
    ASSERT_LT(job, int(w.jobs.size()));
    const CombineJob& j = w.jobs[job];
    EXPECT_EQ(j.batch, key.first);
    EXPECT_EQ(j.chunk, key.second);
    EXPECT_EQ(j.num_splits, int(items.size()));
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_GT(items[i].tile_end, items[i].tile_begin) << "empty split";
      EXPECT_EQ(items[i].job, job);
      EXPECT_EQ(items[i].partial, j.first_partial + int(i));
    }
  }
}

// Random shapes and lengths, either width, against expect_valid_work_list. other_dims: head dims
// 64 and 256 with dense groups up to 128 (D = 256: chunks of a query's heads past 64), else
// D = 128 with G 1..16.
void expect_valid_random_work_lists(unsigned seed, int trials, bool other_dims) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const int batch = 1 + int(rng() % (trial % 10 == 0 ? 3000 : 40));
    const int queries = 1 + int(rng() % 9);
    const int64_t keys = 1 + int64_t(rng() % 300000);
    const int topk = trial % 2 == 0 ? 0 : 1 + int(rng() % 64);
    const int d = !other_dims ? 128 : trial % 3 == 0 ? 64 : 256;
    const bool fp8 = other_dims ? d == 256 && trial % 4 == 1 : trial % 3 == 0;
    DecodeShape s = shape(batch, queries, keys, topk, fp8 ? DType::fp8_e4m3 : DType::bf16);
    s.head_dim = d;
    const int g = other_dims && topk == 0 ? 1 + int(rng() % 128) : 1 << (rng() % 5);
    s.num_kv_heads = 1 + int(rng() % 4);
    s.num_q_heads = g * s.num_kv_heads;
    s.kv_block_size = trial % 4 == 1 ? 64 : 128;
    std::vector<int64_t> lengths(batch);
    for (int64_t& l : lengths)
      l = rng() % 5 == 0 ? 0 : int64_t(rng() % (int64_t(s.max_pages) * s.page_size + 1));
    for (int warps : {4, 8}) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << ": D " << d << " B " << batch
                                      << " q " << queries << " keys " << keys << " topk " << topk
                                      << " G " << g << " width " << warps);
      expect_valid_work_list(s, warps, lengths);
    }
  }
}

TEST(DecodePlan, WorkListsCoverEveryUnitOnce) { expect_valid_random_work_lists(17, 200, false); }

// Head dims 64 and 256 (plan.h dim_parts): D = 64 plans as D = 128 (128 rows, 64 at 4 warps);
// D = 256 CTAs hold 64 rows (32 at 4 warps), and a larger group splits into chunks of its heads
// (head_chunks), each a unit of its own. Partials scale with D; kinds without kernels at a head
// dim are refused.
TEST(DecodePlan, HeadDims) {
  struct Case {
    int d, g, queries;
    int rows_max, head_chunks, heads_per_chunk, chunks;
    bool narrow;  // a plan of 4 warps holds (forced)
  };
  const Case cases[] = {
      {64, 16, 8, 128, 1, 16, 1, false},  {64, 16, 4, 64, 1, 16, 1, true},
      {64, 128, 3, 128, 1, 128, 3, false}, {128, 5, 30, 125, 1, 5, 2, false},
      {256, 16, 8, 64, 1, 16, 2, false},  {256, 8, 4, 32, 1, 8, 1, true},
      {256, 5, 30, 60, 1, 5, 3, false},   {256, 64, 2, 64, 1, 64, 2, false},
      {256, 65, 2, 33, 2, 33, 4, false},  {256, 96, 3, 48, 2, 48, 6, false},
      {256, 128, 1, 64, 2, 64, 2, false}, {256, 1, 40, 40, 1, 1, 1, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "D " << c.d << " G " << c.g << " queries " << c.queries);
    DecodeShape s = shape(64, c.queries, 4096, 0);
    s.head_dim = c.d;
    s.num_kv_heads = 2;
    s.num_q_heads = c.g * 2;
    const Geometry g = geometry(s, kH200, 8);
    EXPECT_EQ(g.rows_max, c.rows_max);
    EXPECT_EQ(g.head_chunks, c.head_chunks);
    EXPECT_EQ(g.heads_per_chunk, c.heads_per_chunk);
    EXPECT_EQ(g.chunks, c.chunks);
    EXPECT_EQ(geometry(s, kH200, 4).warps, c.narrow ? 4 : 8);
    // Every (query, head) row in exactly one chunk: chunks x rows cover queries x G.
    EXPECT_GE(int64_t(g.chunks) * g.rows_max, int64_t(c.queries) * c.g);
    EXPECT_LE(g.rows_max, max_rows(c.d));
    // part_o holds rows_max x D floats per (partial, kv head).
    EXPECT_EQ(g.bytes - g.off_part_o,
              (size_t(g.max_partials) * 2 * g.rows_max * c.d * sizeof(float) + 255) / 256 * 256);
    expect_valid_work_list(s, 8, std::vector<int64_t>(64, 4096));
  }
  // Two 4-warp CTAs share an SM at every head dim (stages of the same bytes).
  for (int d : {64, 256}) {
    DecodeShape s = shape(2048, 1, 4096, 16);
    s.head_dim = d;
    const Geometry g = geometry(s, kH200);
    EXPECT_EQ(g.warps, 4) << "D " << d;
    EXPECT_EQ(g.ctas_per_sm, 2) << "D " << d;
    s.kv_dtype = DType::fp4x2;
    EXPECT_THROW(geometry(s, kH200), Error) << "NVFP4 KV at D " << d;
  }
  DecodeShape s = shape(4, 1, 4096, 0, DType::fp8_e4m3);
  s.head_dim = 64;
  EXPECT_THROW(geometry(s, kH200), Error) << "FP8 KV at D 64";
  s.head_dim = 256;
  EXPECT_EQ(geometry(s, kH200).head_dim, 256);
  s.head_dim = 96;
  s.kv_dtype = DType::bf16;
  EXPECT_THROW(geometry(s, kH200), Error) << "D 96";
}

// The same at head dims 64 and 256.
TEST(DecodePlan, HeadDimWorkLists) { expect_valid_random_work_lists(23, 120, true); }

// Token ids (kv_block_size 1): one query per CTA at every G (the consumers' masks cover whole
// 64-slot windows; groups past 16: SparseLargeAndOddGroups), 128 union entries per tile, so
// K = 2048 splits every unit into at least four items (kMaxItemEntries = 512); the union bitmap
// covers up to 65536 keys per request, which build_work_list checks on each request's planned
// capacity (not on max_pages * page_size).
TEST(DecodePlan, TokenIds) {
  for (int g : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE(testing::Message() << "G " << g);
    DecodeShape s = shape(8, 4, 20000, 2048);
    s.kv_block_size = 1;
    s.num_kv_heads = 2;
    s.num_q_heads = 2 * g;
    const Geometry geo = geometry(s, kH200);
    EXPECT_EQ(geo.queries_per_chunk, 1);
    EXPECT_EQ(geo.chunks, 4);
    EXPECT_EQ(geo.rows_max, g);
    EXPECT_EQ(geo.entries_per_tile, 128);
    EXPECT_EQ(geo.max_tiles_per_item, 4);
    EXPECT_EQ(geo.bitmap_words, (20096 + 31) / 32);  // 157 pages of 128
    const WorkList w = build_work_list(s, geo, std::vector<int64_t>(8, 20000));
    for (const DecodeItem& it : w.items) EXPECT_LE(it.tile_end - it.tile_begin, 4);
    EXPECT_GE(w.items.size(), size_t(8 * 4 * 4));
    expect_valid_work_list(s, 4, std::vector<int64_t>(8, 20000));
    expect_valid_work_list(s, 8, std::vector<int64_t>(8, 20000));
  }
  // Capacity past the bitmap: the shape sizes a full bitmap and plans requests that fit.
  DecodeShape s = shape(3, 2, int64_t(1) << 20, 64);
  s.kv_block_size = 1;
  const Geometry geo = geometry(s, kH200);
  EXPECT_EQ(geo.bitmap_words, kMaxBitmapWords);
  EXPECT_LE(geo.bytes, workspace_bytes(s, kH200));
  expect_valid_work_list(s, 8, {65536, 0, 65409});  // capacities 65536, 0, 65536
  try {
    build_work_list(s, geo, {100, 65537, 3});
    ADD_FAILURE() << "a request of 65537 keys planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "decode: sparse CUDA decode with token ids (kv_block_size 1) takes up to 65536 "
                  "keys per request; request 1 has 65537 keys (planned capacity 65664"),
              std::string::npos)
        << e.what();
  }
  // Without host lengths every request has max_pages * page_size keys.
  EXPECT_THROW(build_work_list(s, geo, std::vector<int64_t>(3, int64_t(1) << 20)), Error);
  // Blocks of 64 and 128 keep their shape-level check.
  s.kv_block_size = 64;
  s.max_pages = 2048 * 32 * 64 / 128 + 1;
  EXPECT_THROW(geometry(s, kH200), Error);
}

// Token ids at any group up to 128, and sparse blocks whose group does not divide 16: one query
// per CTA with all of its G rows, as a dense query's (16-row tiles of its heads; D = 256 splits a
// group past 64 into chunks of its heads), so 4 warps hold it up to 64 rows (32 at D = 256).
// Blocks whose group divides 16 keep 16-row tiles of 16 / G whole queries.
TEST(DecodePlan, SparseLargeAndOddGroups) {
  struct Case {
    int blk, d, g, queries;
    int queries_per_chunk, rows_max, head_chunks, heads_per_chunk, chunks;
    bool narrow;  // a plan of 4 warps holds (forced)
  };
  const Case cases[] = {
      {1, 128, 64, 2, 1, 64, 1, 64, 2, true},     {1, 128, 128, 2, 1, 128, 1, 128, 2, false},
      {1, 128, 32, 3, 1, 32, 1, 32, 3, true},     {1, 128, 24, 2, 1, 24, 1, 24, 2, true},
      {1, 128, 5, 4, 1, 5, 1, 5, 4, true},        {1, 128, 4, 8, 1, 4, 1, 4, 8, true},
      {1, 64, 128, 1, 1, 128, 1, 128, 1, false},  {1, 64, 48, 2, 1, 48, 1, 48, 2, true},
      {1, 256, 96, 2, 1, 48, 2, 48, 4, false},    {1, 256, 128, 2, 1, 64, 2, 64, 4, false},
      {1, 256, 65, 1, 1, 33, 2, 33, 2, false},    {1, 256, 32, 2, 1, 32, 1, 32, 2, true},
      {1, 256, 64, 1, 1, 64, 1, 64, 1, false},    {128, 128, 3, 4, 1, 3, 1, 3, 4, true},
      {64, 128, 64, 2, 1, 64, 1, 64, 2, true},    {128, 128, 128, 1, 1, 128, 1, 128, 1, false},
      {64, 256, 128, 1, 1, 64, 2, 64, 2, false},  {128, 128, 16, 4, 1, 16, 1, 16, 4, true},
      {64, 128, 4, 8, 4, 16, 1, 4, 2, true},      {128, 256, 2, 8, 8, 16, 1, 2, 1, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "kv_block_size " << c.blk << " D " << c.d << " G " << c.g
                                    << " queries " << c.queries);
    DecodeShape s = shape(64, c.queries, 4096, c.blk == 1 ? 2048 : 16);
    s.kv_block_size = c.blk;
    s.head_dim = c.d;
    s.num_kv_heads = 1;
    s.num_q_heads = c.g;
    const Geometry g = geometry(s, kH200, 8);
    EXPECT_EQ(g.queries_per_chunk, c.queries_per_chunk);
    EXPECT_EQ(g.rows_max, c.rows_max);
    EXPECT_EQ(g.head_chunks, c.head_chunks);
    EXPECT_EQ(g.heads_per_chunk, c.heads_per_chunk);
    EXPECT_EQ(g.chunks, c.chunks);
    EXPECT_EQ(geometry(s, kH200, 4).warps, c.narrow ? 4 : 8);
    EXPECT_GE(int64_t(g.chunks) * g.rows_max, int64_t(c.queries) * c.g);
    EXPECT_LE(g.rows_max, max_rows(c.d));
    // part_o holds rows_max x D floats per (partial, kv head).
    EXPECT_EQ(g.bytes - g.off_part_o,
              (size_t(g.max_partials) * g.rows_max * c.d * sizeof(float) + 255) / 256 * 256);
    // Every chunk, head chunks included, covers its queries' union: min(queries x topk, the
    // request's blocks) entries, 128 / blk a tile.
    const WorkList w = build_work_list(s, g, std::vector<int64_t>(64, 4096));
    std::vector<int64_t> tiles(size_t(g.chunks), 0);
    for (const DecodeItem& it : w.items)
      if (it.batch == 0) tiles[size_t(it.chunk)] += it.tile_end - it.tile_begin;
    for (int ch = 0; ch < g.chunks; ++ch) {
      const int nq = std::min(g.queries_per_chunk,
                              c.queries - (ch / g.head_chunks) * g.queries_per_chunk);
      const int64_t entries = std::min<int64_t>(int64_t(nq) * s.topk, 4096 / c.blk);
      EXPECT_EQ(tiles[size_t(ch)], (entries + 128 / c.blk - 1) / (128 / c.blk)) << "chunk " << ch;
    }
    for (int warps : {4, 8}) {
      expect_valid_work_list(s, warps, std::vector<int64_t>(64, 4096));
      std::vector<int64_t> lengths(64);
      for (int b = 0; b < 64; ++b) lengths[b] = (b * 977) % 4097;
      expect_valid_work_list(s, warps, lengths);
    }
  }
}

// Random sparse plans of token ids (K up to 2048, lengths up to 65536) and blocks at groups
// 1..128 (one kv head past the divisors of 16), 1-9 queries a request, every head dim, against
// expect_valid_work_list and the one-query rule.
TEST(DecodePlan, SparseAnyGroupWorkLists) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + int(rng() % (trial % 10 == 0 ? 2000 : 40));
    const int queries = 1 + int(rng() % 9);
    const int64_t keys = 1 + int64_t(rng() % 65536);
    const int blk = trial % 3 == 0 ? 64 : trial % 3 == 1 ? 1 : 128;
    const int topk =
        blk == 1 ? (trial % 2 == 0 ? 2048 : 1 + int(rng() % 600)) : 1 + int(rng() % 64);
    const int d = trial % 4 == 0 ? 64 : trial % 4 == 1 ? 256 : 128;
    const int g = 1 + int(rng() % 128);
    DecodeShape s = shape(batch, queries, keys, topk, trial % 5 == 1 && d > 64 ? DType::fp8_e4m3
                                                                             : DType::bf16);
    s.head_dim = d;
    s.kv_block_size = blk;
    s.num_kv_heads = 16 % g == 0 ? 1 + int(rng() % 4) : 1;
    s.num_q_heads = g * s.num_kv_heads;
    std::vector<int64_t> lengths(batch);
    for (int64_t& l : lengths)
      l = rng() % 5 == 0 ? 0 : int64_t(rng() % (int64_t(s.max_pages) * s.page_size + 1));
    for (int warps : {4, 8}) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << ": blk " << blk << " D " << d
                                      << " B " << batch << " q " << queries << " keys " << keys
                                      << " topk " << topk << " G " << g << " width " << warps);
      const Geometry geo = geometry(s, kH200, warps);
      if (blk == 1 || 16 % g != 0) EXPECT_EQ(geo.queries_per_chunk, 1);
      EXPECT_LE(geo.rows_max, max_rows(d));
      EXPECT_GE(int64_t(geo.chunks) * geo.rows_max, int64_t(queries) * g);
      expect_valid_work_list(s, warps, lengths);
    }
  }
}

}  // namespace
}  // namespace msa::cuda::decode
