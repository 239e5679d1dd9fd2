// The ICP indexer (msa/icp.h: icp_rank_lists, icp_merge; their reference src/cpu/icp.h) with
// simulated ranks: the index key pool sharded over 2 or 4 ranks (P128 interleaved rows, P256
// contiguous parts), each rank's lists from its own shard, an exchange of the lists, and the
// owner's merge, against block_topk on the unsharded pool: the same ids exactly, over random and
// tie-heavy scores, every selection-head count, causal and not, FP8 keys with per-slot scales;
// each rank's public lists equal to the reference's. A NaN score is reported (the reference's
// merge returns false, icp_rank_lists raises), never silently merged; corrupt lists and bad
// arguments are msa::Errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "cpu/icp.h"
#include "support/expect_error.h"
#include "support/icp_case.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

// The reference's merged selection over every rank, and whether the merge saw only finite scores.
std::pair<std::vector<int32_t>, bool> reference_selection(const Case& c, const HostTensor& q,
                                                          const HostTensor& cu_q, const Pool& pool) {
  cpu::icp::RankArgs a = reference_args(c, q, cu_q, pool);
  std::vector<cpu::icp::RankLists> lists;
  for (int rank = 0; rank < c.sharding.world; ++rank) {
    const Pool shard = shard_of(pool, c.sharding, rank);
    a.rank = rank;
    a.shard = keys_of(shard, c.fp8);
    lists.push_back(cpu::icp::rank_candidates(a));
  }
  const int64_t tq = q.t.shape[0];
  HostTensor out(DType::i32, {c.hsel, tq, c.topk});
  const bool finite = cpu::icp::merge(lists, a, out.t);
  return {std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + out.t.numel()), finite};
}

// Rank `rank`'s public icp_rank_lists arguments on host tensors.
IcpRankListsArgs rank_args(const Case& c, const HostTensor& q, const HostTensor& cu_q,
                           const Pool& pool, const Pool& shard, int rank, const HostTensor& ids,
                           const HostTensor& scores) {
  return rank_args(c, rank, q.t, keys_of(shard, c.fp8), host_views(pool, cu_q), ids.t, scores.t);
}

// Every rank's public lists ([world, Hsel, total_q, topk], as an all-to-all leaves them on an
// owner that merges every head), each rank's checked against the reference's lists.
std::pair<HostTensor, HostTensor> exchanged_lists(const Case& c, const HostTensor& q,
                                                  const HostTensor& cu_q, const Pool& pool) {
  const int64_t tq = q.t.shape[0], W = c.sharding.world, row = c.hsel * tq * c.topk;
  HostTensor all_ids(DType::i32, {W, c.hsel, tq, c.topk}), all_scores(DType::f32, {W, c.hsel, tq, c.topk});
  cpu::icp::RankArgs ref = reference_args(c, q, cu_q, pool);
  for (int rank = 0; rank < W; ++rank) {
    const Pool shard = shard_of(pool, c.sharding, rank);
    HostTensor ids(DType::i32, {c.hsel, tq, c.topk}), scores(DType::f32, {c.hsel, tq, c.topk});
    icp_rank_lists(rank_args(c, q, cu_q, pool, shard, rank, ids, scores));
    ref.rank = rank;
    ref.shard = keys_of(shard, c.fp8);
    expect_lists(cpu::icp::rank_candidates(ref), ids.data<int32_t>(), scores.data<float>(), c.topk,
                 rank);
    std::memcpy(all_ids.data<int32_t>() + rank * row, ids.data<int32_t>(), size_t(row) * 4);
    std::memcpy(all_scores.data<float>() + rank * row, scores.data<float>(), size_t(row) * 4);
  }
  return {std::move(all_ids), std::move(all_scores)};
}

IcpMergeArgs merge_args(const Case& c, const HostTensor& cu_q, const Pool& pool,
                        const HostTensor& ids, const HostTensor& scores, const HostTensor& q2k) {
  return merge_args(c, host_views(pool, cu_q), ids.t, scores.t, q2k.t);
}

// The public ops' merged selection.
std::vector<int32_t> sharded_selection(const Case& c, const HostTensor& q, const HostTensor& cu_q,
                                       const Pool& pool) {
  const auto [ids, scores] = exchanged_lists(c, q, cu_q, pool);
  HostTensor out(DType::i32, {c.hsel, q.t.shape[0], c.topk});
  icp_merge(merge_args(c, cu_q, pool, ids, scores, out));
  return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + out.t.numel());
}

// A case's index queries, drawn from rng (FP8 when its keys are FP8), and its cu_seqlens_q.
struct Queries {
  HostTensor q, cu_q;
};
Queries make_queries(const Case& c, std::mt19937& rng) {
  const int64_t tq = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  HostTensor q(c.fp8 ? DType::fp8_e4m3 : DType::bf16, {tq, kHi, kD});
  for (int64_t i = 0; i < q.t.numel(); ++i) put(q, i, value(rng, c.ties));
  std::vector<int32_t> cu(c.lq.size() + 1, 0);
  for (size_t b = 0; b < c.lq.size(); ++b) cu[b + 1] = cu[b] + c.lq[b];
  HostTensor cu_q(DType::i32, {int64_t(cu.size())});
  std::memcpy(cu_q.data<int32_t>(), cu.data(), cu.size() * 4);
  return {std::move(q), std::move(cu_q)};
}

void expect_same_ids(const Case& c) {
  std::mt19937 rng(c.seed);
  const Queries in = make_queries(c, rng);
  const HostTensor &q = in.q, &cu_q = in.cu_q;
  const Pool pool = make_pool(c, rng);
  const std::vector<int32_t> want = unsharded_selection(c, q, cu_q, pool);
  const auto [ref, finite] = reference_selection(c, q, cu_q, pool);
  EXPECT_TRUE(finite);
  EXPECT_EQ(ref, want) << "the reference's merge";
  EXPECT_EQ(sharded_selection(c, q, cu_q, pool), want) << "icp_rank_lists + icp_merge";
}

using cpu::icp::Layout;

TEST(IcpCpu, ShardedIdsEqualUnsharded) {
  for (const Layout layout : {Layout::p128, Layout::p256})
    for (const int world : {2, 4})
      for (const int64_t hsel : {4, 2, 1}) {
        SCOPED_TRACE(std::string(layout == Layout::p128 ? "P128" : "P256") + " TP" +
                     std::to_string(world) + " Hsel " + std::to_string(hsel));
        Case c{{40, 200, 1}, {700, 1500, 90}, {layout, world}, hsel};
        c.seed = unsigned(world * 10 + hsel);
        expect_same_ids(c);
      }
}

TEST(IcpCpu, TiesNonCausalFp8AndWideSelections) {
  for (const Layout layout : {Layout::p128, Layout::p256})
    for (const int world : {2, 4}) {
      SCOPED_TRACE(std::string(layout == Layout::p128 ? "P128" : "P256") + " TP" + std::to_string(world));
      Case ties{{30, 64}, {900, 2049}, {layout, world}, 4};
      ties.ties = true;  // block scores equal across blocks: the lower id must win on every rank
      expect_same_ids(ties);
      Case nc{{50}, {1300}, {layout, world}, 2, 6, 2, 2};
      nc.causal = false;
      nc.fp8 = true;  // per-slot scales, moved with their rows
      nc.seed = 7;
      expect_same_ids(nc);
      Case wide{{20, 3}, {600, 130}, {layout, world}, 1, 16, 1, 1};  // topk >= visible blocks
      wide.seed = 9;
      expect_same_ids(wide);
    }
}

TEST(IcpCpu, NanScoreIsReported) {
  Case c{{8}, {600}, {Layout::p128, 2}, 4};
  std::mt19937 rng(3);
  const Queries in = make_queries(c, rng);
  const HostTensor &q = in.q, &cu_q = in.cu_q;
  Pool pool = make_pool(c, rng);
  // Key 300 (visible to every query: causal bottom-right over 600 keys), one NaN element.
  const int64_t page = pool.table.data<int32_t>()[300 / 128], row = 300 % 128;
  pool.values.data<uint16_t>()[(page * 128 + row) * kD + 5] = 0x7fc0;  // bf16 NaN
  const auto [got, finite] = reference_selection(c, q, cu_q, pool);
  EXPECT_FALSE(finite) << "a NaN score must be reported by the merge";
  for (int32_t id : got) EXPECT_TRUE(id >= -1 && id < 5);  // still ids of visible blocks
  // The public op of the rank that holds key 300 (P128 TP2: row 44, rank 0) raises; the other
  // rank's lists are fine.
  HostTensor ids(DType::i32, {4, 8, 4}), scores(DType::f32, {4, 8, 4});
  const Pool shard0 = shard_of(pool, c.sharding, 0), shard1 = shard_of(pool, c.sharding, 1);
  expect_error([&] { icp_rank_lists(rank_args(c, q, cu_q, pool, shard0, 0, ids, scores)); },
               "group score is NaN on rank 0");
  icp_rank_lists(rank_args(c, q, cu_q, pool, shard1, 1, ids, scores));
}

// Valid arguments of a small case, for the argument-error tests.
struct Small {
  Case c{{6, 3}, {700, 300}, {Layout::p128, 2}, 2};
  std::mt19937 rng{5};
  HostTensor q{DType::bf16, {9, kHi, kD}};
  HostTensor cu_q{DType::i32, {3}};
  Pool pool = make_pool(c, rng);
  Pool shard = shard_of(pool, c.sharding, 1);
  HostTensor ids{DType::i32, {2, 9, 4}}, scores{DType::f32, {2, 9, 4}};
  Small() {
    for (int64_t i = 0; i < q.t.numel(); ++i) put(q, i, value(rng, false));
    cu_q.data<int32_t>()[0] = 0;
    cu_q.data<int32_t>()[1] = 6;
    cu_q.data<int32_t>()[2] = 9;
  }
};

TEST(IcpCpu, RankListsArgumentErrors) {
  Small s;
  const IcpRankListsArgs ok = rank_args(s.c, s.q, s.cu_q, s.pool, s.shard, 1, s.ids, s.scores);
  const auto op = [](const IcpRankListsArgs& a) { icp_rank_lists(a); };
  icp_rank_lists(ok);
  expect_arg_error(op, ok, [](auto& a) { a.world = 3; }, "world: must be 2 or 4");
  expect_arg_error(op, ok, [](auto& a) { a.rank = 2; }, "rank: must be in [0, world = 2)");
  expect_arg_error(op, ok, [](auto& a) { a.layout = IcpLayout::p256; }, "rows_per_rank = 128");
  HostTensor odd(DType::bf16, {s.pool.values.t.shape[0], 64, 3, kD});
  expect_arg_error(op, ok, [&](auto& a) { a.shard = QTensor(odd.t); }, "(q: index_q; k: the shard");
  HostTensor f16(DType::f16, {s.pool.values.t.shape[0], 64, 1, kD});
  expect_arg_error(op, ok, [&](auto& a) { a.shard = QTensor(f16.t); }, "dtype must equal q's");
  HostTensor bad_table(DType::i32, {2, 6});
  std::memcpy(bad_table.data<int32_t>(), s.pool.table.data<int32_t>(), 2 * 6 * 4);
  bad_table.data<int32_t>()[1] = 1000;  // a page past the pool, read by request 0
  expect_arg_error(op, ok, [&](auto& a) { a.page_table = bad_table.t; }, "page");
  HostTensor narrow(DType::i32, {2, 9, 3});
  expect_arg_error(op, ok, [&](auto& a) { a.ids = narrow.t; }, "ids: shape must be [Hsel, total_q, topk]");
  HostTensor three(DType::i32, {3, 9, 4}), three_s(DType::f32, {3, 9, 4});
  expect_arg_error(op, ok, [&](auto& a) { a.ids = three.t; a.scores = three_s.t; },
                   "must divide index_q's heads (4)");
  expect_arg_error(op, ok, [&](auto& a) { a.scores = s.ids.t; }, "scores: dtype");
  expect_arg_error(op, ok, [](auto& a) { a.topk = 1; a.sink_blocks = 1; a.local_blocks = 1; },
                   "sink_blocks + local_blocks: must be <= topk");
}

TEST(IcpCpu, NegativeSlotScaleOfAReadKeyIsAnError) {
  Case c{{4}, {300}, {Layout::p128, 2}, 4};
  c.fp8 = true;
  std::mt19937 rng(9);
  const Queries in = make_queries(c, rng);
  const HostTensor &q = in.q, &cu_q = in.cu_q;
  const Pool pool = make_pool(c, rng);
  Pool shard = shard_of(pool, c.sharding, 0);
  HostTensor ids(DType::i32, {4, 4, 4}), scores(DType::f32, {4, 4, 4});
  const int32_t* table = pool.table.data<int32_t>();  // [1, 3]: 300 keys in pages of 128
  int64_t spare = 0;  // a page the table does not name: its slots are never read
  while (std::find(table, table + 3, int32_t(spare)) != table + 3) ++spare;
  shard.scale.data<float>()[spare * 64] = -1.f;
  icp_rank_lists(rank_args(c, q, cu_q, pool, shard, 0, ids, scores));
  const int64_t page = table[0];  // key 0: rank 0, shard row 0 of the request's first page
  shard.scale.data<float>()[page * 64] = -1.f;
  expect_error([&] { icp_rank_lists(rank_args(c, q, cu_q, pool, shard, 0, ids, scores)); },
               "shard: scale of slot");
}

TEST(IcpCpu, MergeRefusesCorruptLists) {
  Small s;
  // Named references, not a structured binding: the lambdas below capture them (clang < 16
  // cannot capture a binding).
  const auto lists = exchanged_lists(s.c, s.q, s.cu_q, s.pool);
  const HostTensor &ids = lists.first, &scores = lists.second;
  HostTensor q2k(DType::i32, {2, 9, 4});
  const IcpMergeArgs ok = merge_args(s.c, s.cu_q, s.pool, ids, scores, q2k);
  icp_merge(ok);
  const auto op = [](const IcpMergeArgs& a) { icp_merge(a); };
  // Token 5 of request 0 (700 keys, 6 queries): sees all 6 blocks; forced 0 and 5; quota 2.
  const int64_t at = ((1 * 2 + 0) * 9 + 5) * 4;  // rank 1, head 0, token 5
  auto corrupt = [&](int k, int32_t id, float score, const std::string& needle) {
    HostTensor i2(DType::i32, {2, 2, 9, 4}), s2(DType::f32, {2, 2, 9, 4});
    std::memcpy(i2.data<int32_t>(), ids.data<int32_t>(), ids.bytes());
    std::memcpy(s2.data<float>(), scores.data<float>(), scores.bytes());
    i2.data<int32_t>()[at + k] = id;
    s2.data<float>()[at + k] = score;
    expect_arg_error(op, ok, [&](auto& a) { a.ids = i2.t; a.scores = s2.t; }, needle);
  };
  const int32_t first = ids.data<int32_t>()[at], second = ids.data<int32_t>()[at + 1];
  // Rank 1 holds half of every block's keys (P128 TP2), so it fills its quota: 2 of blocks 1-4.
  ASSERT_TRUE(first >= 1 && first <= 4 && second >= 1 && second <= 4 && first != second);
  ASSERT_EQ(ids.data<int32_t>()[at + 2], -1);
  int32_t unlisted = 1;
  while (unlisted == first || unlisted == second) ++unlisted;
  corrupt(0, 0, 1.f, "is not a list entry");         // a forced (sink) block
  corrupt(0, 5, 1.f, "is not a list entry");         // a forced (local) block
  corrupt(0, 6, 1.f, "is not a list entry");         // past the visible blocks
  corrupt(0, first, NAN, "is not a list entry");     // a NaN score
  corrupt(1, first, 1.f, "twice");                   // a repeated block
  corrupt(3, unlisted, 1.f, "is not a list entry");  // an entry after the list's -1
  corrupt(2, unlisted, 1.f, "more than topk minus the token's forced blocks (2)");
  HostTensor short_q2k(DType::i32, {2, 9, 3});
  expect_arg_error(op, ok, [&](auto& a) { a.q2k = short_q2k.t; }, "q2k");
  HostTensor used(DType::i32, {2});
  used.data<int32_t>()[0] = 700;
  used.data<int32_t>()[1] = 100000;
  expect_arg_error(op, ok, [&](auto& a) { a.seqused_k = used.t; }, "seqused_k[1] must be in");
}

}  // namespace
}  // namespace msa::test
