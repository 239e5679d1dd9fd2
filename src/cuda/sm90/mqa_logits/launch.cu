// Host side of the MQA logits (backend.h: cuda::mqa_logits / cuda::paged_mqa_logits): the tiling,
// the TMA maps, the kernel parameters and the grid from arguments api/logits.cpp validated
// (shapes, dtypes, what CUDA supports). No allocation, no synchronization.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend.h"
#include "cuda/device/info.h"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/mqa_logits/launch_kernels.h"
#include "cuda/sm90/mqa_logits/traits.h"

namespace msa::cuda {
namespace {

using mqa_logits_sm90::kBlockN;
using mqa_logits_sm90::kCtaCostBlocks;
using mqa_logits_sm90::kMaxRowGroups;
using mqa_logits_sm90::kMaxTokens;
using mqa_logits_sm90::kTileM;
using mqa_logits_sm90::Params;

// CTA rows per token (H rounded up to a power of two >= 32, so that a group of 128 query rows
// holds whole tokens) and tokens per CTA (at most `want`, within 256 rows).
struct Tiling {
  int hp = 32, tokens = 1;
};
Tiling tiling(int heads, int want) {
  Tiling t;
  t.hp = 32;  // the kernels' smallest (instantiate_*_h32.cu)
  while (t.hp < heads) t.hp *= 2;
  t.tokens = std::max(1, std::min(want, kMaxRowGroups * kTileM / t.hp));
  return t;
}

// The 128-row groups and column lanes of a tiling (traits.h: four consumer warpgroups, each a
// 64-key half of a block against one group of 128 query rows).
void set_groups(Params& p, const Tiling& t) {
  p.groups_n = t.tokens * t.hp > kBlockN ? 2 : 1;
  p.lanes = 2 / p.groups_n;
}

template <bool kPaged, bool kFp4 = false>
void dispatch(int hp, const CUtensorMap& tq, const CUtensorMap& tk, const Params& p, unsigned ctas,
              cudaStream_t stream) {
  if (hp == 32) mqa_logits_sm90::launch<kPaged, 32, kFp4>(tq, tk, p, ctas, stream);
  else if (hp == 64) mqa_logits_sm90::launch<kPaged, 64, kFp4>(tq, tk, p, ctas, stream);
  else mqa_logits_sm90::launch<kPaged, 128, kFp4>(tq, tk, p, ctas, stream);
}

// A [d0, d1, 128] byte view (e4m3 for the TMA map) with element strides s0, s1.
Tensor rows_view(void* data, int64_t d0, int64_t d1, int64_t s0, int64_t s1, Device device) {
  return Tensor(data, DType::fp8_e4m3, std::vector<int64_t>{d0, d1, 128},
                std::vector<int64_t>{s0, s1, 1}, device);
}

}  // namespace

void mqa_logits(const MqaLogitsArgs& a, cudaStream_t stream, int64_t report_base) {
  const Tensor& q = a.q.values;
  const Tensor& k = a.k.values;
  const int64_t rows = q.shape[0], s_keys = k.shape[0];
  if (rows == 0) return;
  const Tiling t = tiling(int(q.shape[1]), kMaxTokens);
  Params p;
  p.weights = a.weights.ptr<float>();
  p.w_stride = a.weights.strides[0];
  p.logits = a.logits.ptr<float>();
  p.out_stride = a.logits.strides[0];
  p.rows = int32_t(rows);
  p.heads = int32_t(q.shape[1]);
  p.tokens_per_cta = t.tokens;
  p.cols = int32_t(s_keys);
  p.clean = a.clean_logits ? 1 : 0;
  p.status = a.status.ptr<int32_t>();
  p.report_base = report_base;
  p.ks = a.ks.ptr<int32_t>();
  p.ke = a.ke.ptr<int32_t>();
  p.k_scale = a.k.scale.defined() ? a.k.scale.ptr<float>() : nullptr;
  const CUtensorMap tq = make_tma_3d(q, 128, uint32_t(t.hp), 1, "mqa_logits");
  // An empty key tensor still gets a map (of one stand-in row); no block is ever loaded then.
  const CUtensorMap tk = make_tma_3d(
      rows_view(k.data, std::max<int64_t>(1, s_keys), 1, k.strides[0], 128, k.device), 128, 1,
      kBlockN, "mqa_logits");
  const unsigned ctas = unsigned((rows + t.tokens - 1) / t.tokens);
  set_groups(p, t);
  dispatch<false>(t.hp, tq, tk, p, ctas, stream);
}

void paged_mqa_logits(const PagedMqaLogitsArgs& a, cudaStream_t stream, int64_t report_base) {
  const Tensor& q = a.q;
  const int64_t batch = q.shape[0], next_n = q.shape[1], heads = q.shape[2];
  if (batch == 0) return;
  const Tensor& kv = a.kv_fused;
  const int64_t block_size = kv.shape[1], num_blocks = kv.shape[0];
  const Tiling t = tiling(int(heads), int(next_n));
  Params p;
  p.weights = a.weights.ptr<float>();
  p.w_stride = a.weights.strides[0];
  p.logits = a.logits.ptr<float>();
  p.out_stride = a.logits.strides[0];
  p.rows = int32_t(batch * next_n);
  p.heads = int32_t(heads);
  p.tokens_per_cta = t.tokens;
  p.cols = int32_t(a.max_seq_len);
  p.clean = a.clean_logits ? 1 : 0;
  p.status = a.status.ptr<int32_t>();
  p.report_base = report_base;
  p.pool = static_cast<const uint8_t*>(kv.data);
  p.block_bytes = kv.strides[0];
  p.block_size = int32_t(block_size);
  p.block_shift = block_size == 32 ? 5 : block_size == 64 ? 6 : 7;
  p.num_blocks = int32_t(num_blocks);
  p.block_tables = a.block_tables.ptr<int32_t>();
  p.bt_stride = a.block_tables.strides[0];
  p.bt_cols = int32_t(a.block_tables.shape[1]);
  p.seq_lens = a.seq_lens.ptr<int32_t>();
  p.sl_stride = a.seq_lens.strides[0];
  p.next_n = int32_t(next_n);
  p.groups = int32_t((next_n + t.tokens - 1) / t.tokens);
  // Column ranges per request: the split count whose waves of resident CTAs times (blocks per CTA
  // + kCtaCostBlocks) is least, the fewest CTAs among equals; at least 4 blocks a CTA. A CTA's
  // start (barriers, Q, weights, table window) and its empty pipeline cost about 4 blocks' time:
  // MQAL-PAGED-B64 (H200) ran 108.8 / 110.8 / 118.3 / 131.7 us at 2 / 4 / 8 / 16 splits (1 / 2 /
  // 4 / 8 waves of 128 / 64 / 32 / 16 blocks), i.e. 0.83 us a block and 3.3 us a CTA. Without the
  // term the model picked 37 splits (18 waves of 7 blocks), 1.5x slower than 2.
  const int64_t col_blocks = std::max<int64_t>(1, (a.max_seq_len + kBlockN - 1) / kBlockN);
  const int64_t sms = current_sm_count();  // one resident CTA each (traits.h Cfg)
  const int64_t units = batch * p.groups;
  int64_t splits = 1, best = INT64_MAX;
  for (int64_t sp = 1; sp <= std::clamp<int64_t>(col_blocks / 4, 1, 1024); ++sp) {
    const int64_t per = (col_blocks + sp - 1) / sp;
    const int64_t cost = (units * sp + sms - 1) / sms * (per + kCtaCostBlocks);
    if (cost < best) {
      best = cost;
      splits = sp;
    }
  }
  const int64_t blocks_per_split = (col_blocks + splits - 1) / splits;
  splits = (col_blocks + blocks_per_split - 1) / blocks_per_split;
  p.splits = int32_t(splits);
  p.cols_per_split = int32_t(blocks_per_split * kBlockN);
  const unsigned ctas = unsigned(batch * p.groups * splits);
  set_groups(p, t);
  if (q.dtype == DType::fp4x2) {  // MXFP4: the producers read q, q_sf and the pool themselves
    p.q4 = static_cast<const uint8_t*>(q.data);
    p.q4_stride_row = q.strides[1];
    p.q4_stride_h = q.strides[2];
    p.q_sf = static_cast<const uint8_t*>(a.q_sf.data);
    p.sf_stride_row = a.q_sf.strides[1];
    p.sf_stride_h = a.q_sf.strides[2];
    const CUtensorMap unused{};
    dispatch<true, true>(t.hp, unused, unused, p, ctas, stream);
    return;
  }
  // q as [B * next_n, H, D] (validated: the next_n and B dims merge); the pool's values as
  // [num_blocks, block_size, 128] rows, one box per pool block.
  const Tensor q_rows(q.data, DType::fp8_e4m3, std::vector<int64_t>{batch * next_n, heads, 128},
                      std::vector<int64_t>{q.strides[1], q.strides[2], 1}, q.device);
  const CUtensorMap tq = make_tma_3d(q_rows, 128, uint32_t(t.hp), 1, "paged_mqa_logits");
  const CUtensorMap tk =
      make_tma_3d(rows_view(kv.data, num_blocks, block_size, kv.strides[0], 128, kv.device), 128,
                  uint32_t(block_size), 1, "paged_mqa_logits");
  dispatch<true>(t.hp, tq, tk, p, ctas, stream);
}

}  // namespace msa::cuda
