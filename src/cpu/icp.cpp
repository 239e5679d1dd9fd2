// CPU reference of the ICP indexer (icp.h): per-rank partial block scores over the rank's shard,
// its candidate lists, and the owner's merge. Scores follow block_scores' reference (fp64 dot
// products of the dequantized rows, the max over a block's visible keys, NaN propagating, then
// float), so a block's score is the max of the ranks' partial scores bit for bit.
#include "cpu/icp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "cpu/access.h"

namespace msa::cpu::icp {
namespace {

constexpr int64_t kBlock = 128;  // B128: the logical block the scores and ids count

// Per token: its batch, its batch-local index, Lq and Lk of the batch.
struct TokenInfo {
  int64_t batch, local, lq, lk;
};
std::vector<TokenInfo> token_infos(const RankArgs& a) {
  const std::vector<int64_t> q_start = host_offsets(a.cu_seqlens_q);
  const int64_t batch = int64_t(q_start.size()) - 1;
  const int64_t max_keys = a.page_table.shape[1] * a.sharding.page_rows();
  std::vector<TokenInfo> out;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lk = a.seqused_k.defined() ? a.seqused_k.ptr<int32_t>()[b] : max_keys;
    for (int64_t i = 0; i < q_start[b + 1] - q_start[b]; ++i)
      out.push_back({b, i, q_start[b + 1] - q_start[b], lk});
  }
  return out;
}

int64_t visible_blocks(const TokenInfo& ti, bool causal) {
  return num_blocks(visible_key_end(ti.local, ti.lq, ti.lk, causal), kBlock);
}

// Whether block kb is forced for a token seeing nvis blocks (sinks, then the local window).
bool forced(int64_t kb, int64_t nvis, const RankArgs& a) {
  return kb < std::min<int64_t>(a.sink_blocks, nvis) || kb >= nvis - a.local_blocks;
}
int64_t forced_count(int64_t nvis, const RankArgs& a) {
  int64_t n = 0;
  for (int64_t kb = 0; kb < nvis; ++kb) n += forced(kb, nvis, a);
  return n;
}

}  // namespace

RankLists rank_candidates(const RankArgs& a) {
  const Sharding& sh = a.sharding;
  const Tensor& q = a.index_q.values;
  const Tensor& pool = a.shard.values;
  const int64_t total_q = q.shape[0], hi = q.shape[1], D = q.shape[2], hik = pool.shape[2];
  const int64_t hsel = a.selection_heads, per_sel = hi / hsel, per_key = hi / hik;
  MSA_CHECK(pool.ndim == 4 && pool.shape[1] == sh.rows_per_rank(), "icp: the shard must be [pages, ",
            sh.rows_per_rank(), ", Hik, D], got ", pool.describe());
  MSA_CHECK(pool.dtype != DType::fp4x2, "icp: the CPU reference reads bf16, f16 and FP8 shards");
  const RowDecoder qdec(a.index_q, D), kdec(a.shard, D);
  const std::vector<TokenInfo> tokens = token_infos(a);
  const int32_t* table = a.page_table.ptr<int32_t>();
  const int64_t table_stride = a.page_table.strides[0];

  RankLists lists;
  lists.rows.resize(size_t(hsel * total_q));
  std::vector<double> qrows(size_t(hi * D)), krows(size_t(hik * D));
  for (int64_t t = 0; t < total_q; ++t) {
    const TokenInfo& ti = tokens[size_t(t)];
    const int64_t end = visible_key_end(ti.local, ti.lq, ti.lk, a.causal), nvis = num_blocks(end, kBlock);
    for (int64_t h = 0; h < hi; ++h) qdec.decode(t * q.strides[0] + h * q.strides[1], t, h, &qrows[size_t(h * D)]);
    // Partial scores [hi][kb] over this rank's visible keys: -inf where it holds none.
    std::vector<double> part(size_t(hi * nvis), -std::numeric_limits<double>::infinity());
    std::vector<bool> held(size_t(nvis), false);
    for (int64_t j = 0; j < end; ++j) {
      const int row = int(j % sh.page_rows());
      if (sh.rank_of(row) != a.rank) continue;
      const int64_t page = table[ti.batch * table_stride + j / sh.page_rows()];
      const int64_t srow = sh.shard_row(row), kb = j / kBlock;
      held[size_t(kb)] = true;
      for (int64_t x = 0; x < hik; ++x)  // the slot's scale: its pool slot (per-slot FP8 scales)
        kdec.decode(page * pool.strides[0] + srow * pool.strides[1] + x * pool.strides[2],
                    page * sh.rows_per_rank() + srow, x, &krows[size_t(x * D)]);
      for (int64_t h = 0; h < hi; ++h) {
        const double* qr = &qrows[size_t(h * D)];
        const double* kr = &krows[size_t((h / per_key) * D)];
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
        double& m = part[size_t(h * nvis + kb)];  // NaN propagates, as in block_scores
        if (std::isnan(dot) || (!std::isnan(m) && dot > m)) m = dot;
      }
    }
    const int64_t want = std::max<int64_t>(0, a.topk - forced_count(nvis, a));
    for (int64_t h = 0; h < hsel; ++h) {
      std::vector<Candidate> row;
      for (int64_t kb = 0; kb < nvis; ++kb) {
        if (!held[size_t(kb)] || forced(kb, nvis, a)) continue;
        float g = NAN;  // fmax over the head's index heads: NaN only when every one is
        for (int64_t x = h * per_sel; x < (h + 1) * per_sel; ++x) {
          const float v = float(part[size_t(x * nvis + kb)]);
          lists.nan |= std::isnan(v);
          g = std::fmax(g, v);
        }
        row.push_back({int32_t(kb), g});
      }
      std::sort(row.begin(), row.end(), [](const Candidate& x, const Candidate& y) {
        return block_ranks_before(x.score, x.block, y.score, y.block);
      });
      if (int64_t(row.size()) > want) row.resize(size_t(want));
      lists.rows[size_t(h * total_q + t)] = std::move(row);
    }
  }
  return lists;
}

bool merge(const std::vector<RankLists>& ranks, const RankArgs& shape, const Tensor& q2k) {
  const std::vector<TokenInfo> tokens = token_infos(shape);
  const int64_t total_q = int64_t(tokens.size()), hsel = shape.selection_heads;
  bool finite = true;
  for (const RankLists& r : ranks) finite &= !r.nan;
  for (int64_t h = 0; h < hsel; ++h)
    for (int64_t t = 0; t < total_q; ++t) {
      const int64_t nvis = visible_blocks(tokens[size_t(t)], shape.causal);
      std::vector<int32_t> chosen;
      for (int64_t kb = 0; kb < nvis; ++kb)
        if (forced(kb, nvis, shape)) chosen.push_back(int32_t(kb));
      std::map<int32_t, float> best;  // block -> its best listed score
      for (const RankLists& r : ranks)
        for (const Candidate& c : r.rows[size_t(h * total_q + t)]) {
          auto [it, fresh] = best.emplace(c.block, c.score);
          if (!fresh && block_ranks_before(c.score, c.block, it->second, c.block)) it->second = c.score;
        }
      std::vector<Candidate> merged;
      for (const auto& [kb, s] : best) merged.push_back({kb, s});
      std::sort(merged.begin(), merged.end(), [](const Candidate& x, const Candidate& y) {
        return block_ranks_before(x.score, x.block, y.score, y.block);
      });
      for (size_t i = 0; i < merged.size() && int64_t(chosen.size()) < shape.topk; ++i)
        chosen.push_back(merged[i].block);
      std::sort(chosen.begin(), chosen.end());
      int32_t* out = q2k.ptr<int32_t>() + h * q2k.strides[0] + t * q2k.strides[1];
      for (int64_t k = 0; k < shape.topk; ++k)
        out[k * q2k.strides[2]] = k < int64_t(chosen.size()) ? chosen[size_t(k)] : -1;
    }
  return finite;
}

}  // namespace msa::cpu::icp

namespace msa::cpu {
namespace {

icp::RankArgs shape_args(IcpLayout layout, int world, const Tensor& page_table,
                         const Tensor& seqused_k, const Tensor& cu_seqlens_q, int64_t hsel,
                         int topk, int sink, int local, bool causal) {
  icp::RankArgs r;
  r.sharding = {layout, world};
  r.page_table = page_table;
  r.seqused_k = seqused_k;
  r.cu_seqlens_q = cu_seqlens_q;
  r.selection_heads = hsel;
  r.topk = topk;
  r.sink_blocks = sink;
  r.local_blocks = local;
  r.causal = causal;
  return r;
}

}  // namespace

void icp_rank_lists(const IcpRankListsArgs& a) {
  icp::RankArgs r = shape_args(a.layout, a.world, a.page_table, a.seqused_k, a.cu_seqlens_q,
                               a.ids.shape[0], a.topk, a.sink_blocks, a.local_blocks, a.causal);
  r.rank = a.rank;
  r.index_q = a.index_q;
  r.shard = a.shard;
  const icp::RankLists lists = icp::rank_candidates(r);
  const int64_t total_q = a.ids.shape[1];
  for (int64_t h = 0; h < a.ids.shape[0]; ++h)
    for (int64_t t = 0; t < total_q; ++t) {
      const std::vector<icp::Candidate>& row = lists.rows[size_t(h * total_q + t)];
      int32_t* ids = a.ids.ptr<int32_t>() + h * a.ids.strides[0] + t * a.ids.strides[1];
      float* sc = a.scores.ptr<float>() + h * a.scores.strides[0] + t * a.scores.strides[1];
      for (int64_t k = 0; k < a.topk; ++k) {
        const bool in = k < int64_t(row.size());
        ids[k * a.ids.strides[2]] = in ? row[size_t(k)].block : -1;
        sc[k * a.scores.strides[2]] = in ? row[size_t(k)].score : -INFINITY;
      }
    }
  MSA_CHECK(!lists.nan, "icp_rank_lists: a visible block's group score is NaN on rank ", a.rank,
            " (a NaN in index_q or in a key): the sharded selection cannot equal block_topk's, "
            "whose NaN blocks rank last over all ranks' keys");
}

void icp_merge(const IcpMergeArgs& a) {
  const int64_t world = a.ids.shape[0], hsel = a.ids.shape[1], total_q = a.ids.shape[2];
  const icp::RankArgs r = shape_args(a.layout, int(world), a.page_table, a.seqused_k,
                                     a.cu_seqlens_q, hsel, a.topk, a.sink_blocks, a.local_blocks,
                                     a.causal);
  std::vector<icp::RankLists> ranks(static_cast<size_t>(world));
  for (int64_t w = 0; w < world; ++w) {
    ranks[size_t(w)].rows.resize(size_t(hsel * total_q));
    for (int64_t h = 0; h < hsel; ++h)
      for (int64_t t = 0; t < total_q; ++t) {
        const int64_t at = w * a.ids.strides[0] + h * a.ids.strides[1] + t * a.ids.strides[2];
        const int64_t sat = w * a.scores.strides[0] + h * a.scores.strides[1] + t * a.scores.strides[2];
        std::vector<icp::Candidate>& row = ranks[size_t(w)].rows[size_t(h * total_q + t)];
        for (int64_t k = 0; k < a.topk; ++k) {
          const int32_t id = a.ids.ptr<int32_t>()[at + k * a.ids.strides[3]];
          if (id < 0) break;  // validated: the list ends at its first -1
          row.push_back({id, a.scores.ptr<float>()[sat + k * a.scores.strides[3]]});
        }
      }
  }
  // The lists were validated (src/api/icp.cpp): no NaN score, so the merge is exact.
  icp::merge(ranks, r, a.q2k);
}

}  // namespace msa::cpu
