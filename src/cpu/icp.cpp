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
// FP8 per-slot scales ([slots] or [slots, Hik]) are finite and >= 0 where a key is read (a
// negative one flips the block's maximum; the slots that hold no key may hold anything).
void check_slot_scale(const Tensor& sc, int64_t slot) {
  for (int64_t x = 0; x < (sc.ndim == 2 ? sc.shape[1] : 1); ++x) {
    const float v = sc.ptr<float>()[slot * sc.strides[0] + (sc.ndim == 2 ? x * sc.strides[1] : 0)];
    MSA_CHECK(v >= 0.f && std::isfinite(v), "shard: scale of slot ", slot, " (head ", x,
              ") must be finite and >= 0, got ", v);
  }
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
  const bool slot_scales = a.shard.scale.defined() && a.shard.scale.numel() > 1;

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
      const int64_t srow = sh.shard_row(row), kb = j / kBlock, slot = page * sh.rows_per_rank() + srow;
      held[size_t(kb)] = true;
      if (slot_scales) check_slot_scale(a.shard.scale, slot);
      for (int64_t x = 0; x < hik; ++x)  // the slot's scale: its pool slot (per-slot FP8 scales)
        kdec.decode(page * pool.strides[0] + srow * pool.strides[1] + x * pool.strides[2], slot, x,
                    &krows[size_t(x * D)]);
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

std::vector<std::vector<Candidate>> read_rows(const RankArgs& shape, const int32_t* ids,
                                              const float* scores, int64_t rank) {
  const std::vector<TokenInfo> tokens = token_infos(shape);
  const int64_t total_q = int64_t(tokens.size()), hsel = shape.selection_heads, K = shape.topk;
  std::vector<std::vector<Candidate>> rows(size_t(hsel * total_q));
  for (int64_t t = 0; t < total_q; ++t) {
    const int64_t nvis = visible_blocks(tokens[size_t(t)], shape.causal);
    const int64_t quota = std::max<int64_t>(0, K - forced_count(nvis, shape));  // once a token
    for (int64_t h = 0; h < hsel; ++h) {
      const int32_t* id = ids + (h * total_q + t) * K;
      const float* sc = scores + (h * total_q + t) * K;
      std::vector<Candidate>& row = rows[size_t(h * total_q + t)];
      for (int64_t k = 0; k < K; ++k) {
        const bool listed = id[k] >= 0 && int64_t(row.size()) == k;  // before the first -1
        const bool ok = listed ? id[k] < nvis && !forced(id[k], nvis, shape) && !std::isnan(sc[k])
                               : id[k] == -1;
        MSA_CHECK(ok, "icp_merge: ids[", rank, ", ", h, ", ", t, ", ", k, "] = ", id[k], " (score ",
                  sc[k], ") is not a list entry: rows list distinct visible, not forced blocks with "
                  "non-NaN scores, then -1");
        if (!listed) continue;
        for (const Candidate& c : row)
          MSA_CHECK(c.block != id[k], "icp_merge: ids[", rank, ", ", h, ", ", t, "] lists block ",
                    id[k], " twice");
        row.push_back({id[k], sc[k]});
      }
      MSA_CHECK(int64_t(row.size()) <= quota, "icp_merge: ids[", rank, ", ", h, ", ", t, "] lists ",
                row.size(), " blocks, more than topk minus the token's forced blocks (", quota, ")");
    }
  }
  return rows;
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

// The reference's view of either op's arguments (IcpRankListsArgs, IcpMergeArgs).
template <typename A>
icp::RankArgs shape_args(const A& a, int world, int64_t hsel) {
  icp::RankArgs r;
  r.sharding = {a.layout, world};
  r.page_table = a.page_table;
  r.seqused_k = a.seqused_k;
  r.cu_seqlens_q = a.cu_seqlens_q;
  r.selection_heads = hsel;
  r.topk = a.topk;
  r.sink_blocks = a.sink_blocks;
  r.local_blocks = a.local_blocks;
  r.causal = a.causal;
  return r;
}

}  // namespace

void icp_rank_lists(const IcpRankListsArgs& a) {
  icp::RankArgs r = shape_args(a, a.world, a.ids.shape[0]);
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
  const int64_t world = a.ids.shape[0], hsel = a.ids.shape[1];
  const icp::RankArgs r = shape_args(a, int(world), hsel);
  std::vector<icp::RankLists> ranks(static_cast<size_t>(world));
  for (int64_t w = 0; w < world; ++w)
    ranks[size_t(w)].rows = icp::read_rows(r, a.ids.ptr<int32_t>() + w * a.ids.strides[0],
                                           a.scores.ptr<float>() + w * a.scores.strides[0], w);
  // Every row is a rank's list (read_rows): no NaN score, so the merge is exact.
  icp::merge(ranks, r, a.q2k);
}

}  // namespace msa::cpu
