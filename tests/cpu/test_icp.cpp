// The ICP indexer's CPU reference (src/cpu/icp.h) with simulated ranks: the index key pool sharded
// over 2 or 4 ranks (P128 interleaved rows, P256 contiguous parts), each rank's candidate lists
// from its own shard, and the owner's merge, against block_topk on the unsharded pool: the same
// ids exactly, over random and tie-heavy scores, every selection-head count, causal and not, FP8
// keys with per-slot scales. A NaN score is reported by the merge, never silently merged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/codecs.h"
#include "cpu/icp.h"
#include "support/host_tensor.h"
#include "msa/msa.h"

namespace msa::test {
namespace {

constexpr int64_t kD = 128, kHi = 4;

struct Case {
  std::vector<int32_t> lq, lk;
  cpu::icp::Sharding sharding;
  int64_t hsel = 4;
  int topk = 4, sink = 1, local = 1;
  bool causal = true, fp8 = false, ties = false;
  unsigned seed = 1;
};

// A value: small integers (many equal block scores: the tie rule decides) or normal noise.
float value(std::mt19937& rng, bool ties) {
  if (ties) return float(int(rng() % 3) - 1);
  return std::normal_distribution<float>()(rng);
}

void put(const HostTensor& t, int64_t i, float v) {
  if (t.t.dtype == DType::fp8_e4m3) t.data<uint8_t>()[i] = codec::float_to_e4m3(v);
  else t.data<uint16_t>()[i] = codec::float_to_bf16(v);
}

struct Pool {
  HostTensor values, scale, table, used;
};

// The unsharded index key pool of a case: pages of page_rows() rows, handed out in a random
// order; FP8 with a scale per pool slot.
Pool make_pool(const Case& c, std::mt19937& rng) {
  const int64_t P = c.sharding.page_rows(), B = int64_t(c.lk.size());
  int64_t max_pages = 1, pages = 0;
  for (int32_t l : c.lk) {
    max_pages = std::max<int64_t>(max_pages, (l + P - 1) / P);
    pages += (l + P - 1) / P;
  }
  pages += 2;  // spare pages nobody's table names
  Pool p{HostTensor(c.fp8 ? DType::fp8_e4m3 : DType::bf16, {pages, P, 1, kD}),
         HostTensor(DType::f32, {pages * P}), HostTensor(DType::i32, {B, max_pages}),
         HostTensor(DType::i32, {B})};
  for (int64_t i = 0; i < p.values.t.numel(); ++i) put(p.values, i, value(rng, c.ties));
  for (int64_t i = 0; i < pages * P; ++i) p.scale.data<float>()[i] = c.ties ? 1.f : 0.5f + float(rng() % 4) * 0.25f;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t b = 0, next = 0; b < B; ++b) {
    p.used.data<int32_t>()[b] = c.lk[size_t(b)];
    for (int64_t col = 0; col < max_pages; ++col)
      p.table.data<int32_t>()[b * max_pages + col] =
          col * P < c.lk[size_t(b)] ? order[size_t(next++)] : order[size_t(pages - 1)];
  }
  return p;
}

// Rank r's shard of the pool: [pages, rows_per_rank, 1, D], its rows and slot scales moved.
Pool shard_of(const Pool& p, const cpu::icp::Sharding& s, int rank) {
  const int64_t pages = p.values.t.shape[0], R = s.rows_per_rank(), P = s.page_rows();
  Pool out{HostTensor(p.values.t.dtype, {pages, R, 1, kD}), HostTensor(DType::f32, {pages * R}),
           HostTensor(DType::i32, {1}), HostTensor(DType::i32, {1})};
  const size_t es = dtype_size(p.values.t.dtype);
  for (int64_t page = 0; page < pages; ++page)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t row = s.page_row(rank, int(r));
      std::memcpy(out.values.data<uint8_t>() + ((page * R + r) * kD) * es,
                  p.values.data<uint8_t>() + ((page * P + row) * kD) * es, kD * es);
      out.scale.data<float>()[page * R + r] = p.scale.data<float>()[page * P + row];
    }
  return out;
}

QTensor keys_of(const Pool& p, bool fp8) {
  return fp8 ? QTensor(p.values.t, p.scale.t) : QTensor(p.values.t);
}

// The merged selection of every rank, and whether the merge saw only finite scores.
std::pair<std::vector<int32_t>, bool> sharded_selection(const Case& c, const HostTensor& q,
                                                        const HostTensor& cu_q, const Pool& pool) {
  cpu::icp::RankArgs a;
  a.sharding = c.sharding;
  a.index_q = QTensor(q.t);
  a.page_table = pool.table.t;
  a.seqused_k = pool.used.t;
  a.cu_seqlens_q = cu_q.t;
  a.selection_heads = c.hsel;
  a.topk = c.topk;
  a.sink_blocks = c.sink;
  a.local_blocks = c.local;
  a.causal = c.causal;
  std::vector<cpu::icp::RankLists> lists;
  for (int rank = 0; rank < c.sharding.world; ++rank) {
    const Pool shard = shard_of(pool, c.sharding, rank);
    a.rank = rank;
    a.shard = keys_of(shard, c.fp8);
    lists.push_back(cpu::icp::rank_candidates(a));
    for (const auto& row : lists.back().rows)
      EXPECT_LE(int64_t(row.size()), c.topk) << "a rank listed more than topk blocks";
  }
  const int64_t tq = q.t.shape[0];
  HostTensor out(DType::i32, {c.hsel, tq, c.topk});
  const bool finite = cpu::icp::merge(lists, a, out.t);
  return {std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + out.t.numel()), finite};
}

// block_topk on the unsharded pool (DESIGN section 13: Hsel selection heads over the 4 index heads).
std::vector<int32_t> unsharded_selection(const Case& c, const HostTensor& q, const HostTensor& cu_q,
                                         const Pool& pool) {
  const int64_t tq = q.t.shape[0];
  HostTensor out(DType::i32, {c.hsel, tq, c.topk});
  BlockTopKArgs a;
  a.q = QTensor(q.t);
  a.kv.k = keys_of(pool, c.fp8);
  a.kv.layout = KVLayout::paged_nhd;
  a.kv.page_table = pool.table.t;
  a.kv.seqused_k = pool.used.t;
  a.cu_seqlens_q = cu_q.t;
  a.causal = c.causal;
  a.kv_block_size = 128;
  a.topk = c.topk;
  a.sink_blocks = c.sink;
  a.local_blocks = c.local;
  a.q2k = out.t;
  block_topk(a);
  return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + out.t.numel());
}

void expect_same_ids(const Case& c) {
  std::mt19937 rng(c.seed);
  const int64_t tq = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  HostTensor q(c.fp8 ? DType::fp8_e4m3 : DType::bf16, {tq, kHi, kD});  // FP8 keys: FP8 queries
  for (int64_t i = 0; i < q.t.numel(); ++i) put(q, i, value(rng, c.ties));
  std::vector<int32_t> cu(c.lq.size() + 1, 0);
  for (size_t b = 0; b < c.lq.size(); ++b) cu[b + 1] = cu[b] + c.lq[b];
  HostTensor cu_q(DType::i32, {int64_t(cu.size())});
  std::memcpy(cu_q.data<int32_t>(), cu.data(), cu.size() * 4);
  const Pool pool = make_pool(c, rng);
  const auto [got, finite] = sharded_selection(c, q, cu_q, pool);
  EXPECT_TRUE(finite);
  EXPECT_EQ(got, unsharded_selection(c, q, cu_q, pool));
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
  HostTensor q(DType::bf16, {8, kHi, kD});
  for (int64_t i = 0; i < q.t.numel(); ++i) put(q, i, value(rng, false));
  HostTensor cu_q(DType::i32, {2});
  cu_q.data<int32_t>()[0] = 0;
  cu_q.data<int32_t>()[1] = 8;
  Pool pool = make_pool(c, rng);
  // Key 300 (visible to every query: causal bottom-right over 600 keys), one NaN element.
  const int64_t page = pool.table.data<int32_t>()[300 / 128], row = 300 % 128;
  pool.values.data<uint16_t>()[(page * 128 + row) * kD + 5] = 0x7fc0;  // bf16 NaN
  const auto [got, finite] = sharded_selection(c, q, cu_q, pool);
  EXPECT_FALSE(finite) << "a NaN score must be reported by the merge";
  for (int32_t id : got) EXPECT_TRUE(id >= -1 && id < 5);  // still ids of visible blocks
}

}  // namespace
}  // namespace msa::test
