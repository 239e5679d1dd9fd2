// ICP indexer test cases (tests/cpu/test_icp.cpp, tests/cuda/test_icp_gpu.cu): an unsharded
// paged index key pool (pages handed out in a random order, FP8 with a scale per pool slot) and a
// rank's shard of it, rows and slot scales moved as msa/icp.h lays them out; the ops' arguments
// for a case, and the check of a rank's lists against the reference's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/codecs.h"
#include "cpu/icp.h"
#include "support/host_tensor.h"

namespace msa::test {

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
inline float value(std::mt19937& rng, bool ties) {
  if (ties) return float(int(rng() % 3) - 1);
  return std::normal_distribution<float>()(rng);
}

inline void put(const HostTensor& t, int64_t i, float v) {
  if (t.t.dtype == DType::fp8_e4m3) t.data<uint8_t>()[i] = codec::float_to_e4m3(v);
  else t.data<uint16_t>()[i] = codec::float_to_bf16(v);
}

struct Pool {
  HostTensor values, scale, table, used;
};

// The unsharded index key pool of a case: pages of page_rows() rows, handed out in a random
// order; FP8 with a scale per pool slot.
inline Pool make_pool(const Case& c, std::mt19937& rng) {
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
inline Pool shard_of(const Pool& p, const cpu::icp::Sharding& s, int rank) {
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

inline QTensor keys_of(const Pool& p, bool fp8) {
  return fp8 ? QTensor(p.values.t, p.scale.t) : QTensor(p.values.t);
}

// The views an op reads a case's pool lengths through (host or device tensors).
struct PoolViews {
  Tensor table, used, cu_q;
};
inline PoolViews host_views(const Pool& p, const HostTensor& cu_q) {
  return {p.table.t, p.used.t, cu_q.t};
}

// The fields every ICP argument struct shares (the reference's, the public ops'), from a case.
template <typename A>
A shared_args(const Case& c, const PoolViews& v) {
  A a;
  a.page_table = v.table;
  a.seqused_k = v.used;
  a.cu_seqlens_q = v.cu_q;
  a.topk = c.topk;
  a.sink_blocks = c.sink;
  a.local_blocks = c.local;
  a.causal = c.causal;
  return a;
}

// The reference's arguments for a case (its rank and shard are the caller's).
inline cpu::icp::RankArgs reference_args(const Case& c, const HostTensor& q, const HostTensor& cu_q,
                                         const Pool& pool) {
  auto a = shared_args<cpu::icp::RankArgs>(c, host_views(pool, cu_q));
  a.sharding = c.sharding;
  a.index_q = QTensor(q.t);
  a.selection_heads = c.hsel;
  return a;
}

// Rank `rank`'s icp_rank_lists arguments, writing into ids / scores.
inline IcpRankListsArgs rank_args(const Case& c, int rank, const Tensor& q, const QTensor& shard,
                                  const PoolViews& v, const Tensor& ids, const Tensor& scores) {
  auto a = shared_args<IcpRankListsArgs>(c, v);
  a.layout = c.sharding.layout;
  a.world = c.sharding.world;
  a.rank = rank;
  a.index_q = QTensor(q);
  a.shard = shard;
  a.ids = ids;
  a.scores = scores;
  return a;
}

inline IcpMergeArgs merge_args(const Case& c, const PoolViews& v, const Tensor& ids,
                               const Tensor& scores, const Tensor& q2k) {
  auto m = shared_args<IcpMergeArgs>(c, v);
  m.layout = c.sharding.layout;
  m.ids = ids;
  m.scores = scores;
  m.q2k = q2k;
  return m;
}

// block_topk on the unsharded pool (DESIGN section 13: Hsel selection heads over the 4 index heads).
inline std::vector<int32_t> unsharded_selection(const Case& c, const HostTensor& q,
                                                const HostTensor& cu_q, const Pool& pool) {
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

// A rank's lists ([rows, topk] ids and scores, -1 / -inf after each list) equal to the
// reference's; the first few differences reported.
inline void expect_lists(const cpu::icp::RankLists& want, const int32_t* ids, const float* scores,
                         int topk, int rank) {
  int64_t bad = 0;
  for (size_t r = 0; r < want.rows.size(); ++r)
    for (int k = 0; k < topk; ++k) {
      const auto& list = want.rows[r];
      const bool in = k < int(list.size());
      const int32_t id = ids[r * size_t(topk) + size_t(k)], want_id = in ? list[size_t(k)].block : -1;
      const float sc = scores[r * size_t(topk) + size_t(k)], want_sc = in ? list[size_t(k)].score : -INFINITY;
      if ((id != want_id || sc != want_sc) && bad++ < 5)
        ADD_FAILURE() << "rank " << rank << " row " << r << " entry " << k << ": (" << id << ", "
                      << sc << "), reference (" << want_id << ", " << want_sc << ")";
    }
  EXPECT_EQ(bad, 0) << "rank " << rank << ": list entries unlike the reference's";
}

}  // namespace msa::test
