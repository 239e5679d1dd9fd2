// CUDA kernels of the ICP indexer (msa/icp.h; semantics in docs/semantics.md, ICP indexer), the
// same lists and q2k as the CPU reference (src/cpu/icp.cpp):
// - icp_rank_lists: the indexer kernel's shard mode, fused, keeps each (selection head, token)'s
//   list as block_topk does and writes the rank's lists (icp_shard_scores: where the lists fit,
//   icp_lists_fuse); otherwise it writes the rank's partial block scores [Hi, max_pages, total_q]
//   into the workspace, then list_kernel keeps, per (selection head, token), the best non-forced
//   visible blocks by group score (one thread a row, its list sorted in shared memory by
//   insertion);
// - icp_merge: merge_kernel, one thread a (head, token) row: checks each rank's row (a bad entry
//   is reported and skipped), keeps each block's best listed score, takes the best up to the
//   quota and writes the forced and taken blocks ascending.
// Ranking is top-K's (topk_select.cuh: rank_key): higher score first, NaN last, ties toward the
// lower block id.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend.h"
#include "cuda/common/icp_shard.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/topk_select.cuh"
#include "cuda/device/check.h"

namespace msa::cuda {
namespace {

constexpr int kMaxList = 64;     // topk on CUDA
constexpr int kListThreads = 32;  // rows per CTA; each row's list in shared memory
constexpr int kMaxRanks = 4;
constexpr int kMaxEntries = kMaxRanks * kMaxList;  // a merged row's candidates

// A token's view of its request: the visible global keys and blocks; false for a token whose
// batch cu_seqlens_q does not contain (flagged).
struct TokenView {
  int64_t end, nvis;
};
__device__ bool token_view(const int32_t* cu_q, int64_t batch, KeyLengths keys, bool causal,
                           int64_t t, int32_t* status, TokenView& v) {
  if (batch <= 0) return false;
  const int64_t b = find_batch(cu_q, batch, t);
  const int64_t q0 = cu_q[b], lq = int64_t(cu_q[b + 1]) - q0;
  if (t < q0 || t - q0 >= lq) {
    flag_status(status, int32_t(StatusCode::bad_cu_seqlens), 0, b, 0);
    return false;
  }
  int64_t lk = batch_keys(keys, b);
  if (lk < 0 || lk > keys.max_keys) {  // the merge's own check (the lists' op checked its own)
    flag_status(status, int32_t(StatusCode::kv_length_past_table), b, lk, keys.max_keys);
    lk = lk < 0 ? 0 : keys.max_keys;
  }
  int64_t end = causal ? t - q0 + lk - lq + 1 : lk;
  v.end = end < 0 ? 0 : (end > lk ? lk : end);
  v.nvis = (v.end + 127) / 128;
  return true;
}

struct ListParams {
  const float* plane;  // [Hi, nsb, total_q]: partial scores over the shard's visible keys
  int32_t* ids;        // [Hsel, total_q, topk]
  float* scores;       // [Hsel, total_q, topk]
  const int32_t* cu_seqlens_q;
  KeyLengths keys;     // global lengths (the unsharded pool's)
  int32_t* status;
  ShardMap shard;
  SelectRule rule;
  int64_t total_q, nsb, batch;
  int per_sel;         // index heads per selection head
  bool causal;
};

__global__ void __launch_bounds__(kListThreads) list_kernel(const ListParams p) {
  __shared__ uint64_t keys[kMaxList][kListThreads];  // row i of a list: keys[i][thread]
  const int64_t t = int64_t(blockIdx.x) * kListThreads + threadIdx.x, h = blockIdx.y;
  if (t >= p.total_q) return;
  TokenView v{0, 0};
  const bool ok = token_view(p.cu_seqlens_q, p.batch, p.keys, p.causal, t, p.status, v);
  const int quota = ok ? max(0, p.rule.topk - forced_count(p.rule, v.nvis)) : 0;
  const int64_t shard_end = shard_keys(p.shard, v.end);
  int64_t pages = (shard_end + (1 << p.shard.rows_shift) - 1) >> p.shard.rows_shift;
  pages = pages < p.nsb ? pages : p.nsb;
  uint64_t* list = &keys[0][threadIdx.x];  // list[i * kListThreads]
  int n = 0;
  for (int64_t i = 0; quota > 0 && i < pages; ++i) {
    const int64_t kb = shard_page_block(p.shard, i);
    if (is_forced(p.rule, kb, v.nvis)) continue;
    float g = NAN;  // fmax over the head's index heads: NaN only when every one is
    bool nan = false;
    for (int x = int(h) * p.per_sel; x < int(h + 1) * p.per_sel; ++x) {
      const float s = p.plane[(int64_t(x) * p.nsb + i) * p.total_q + t];
      nan |= s != s;
      g = fmaxf(g, s);
    }
    if (nan) flag_status(p.status, int32_t(StatusCode::icp_nan_score), t, h, kb);
    const uint64_t key = rank_key(g, kb);
    if (n == quota && key <= list[(n - 1) * kListThreads]) continue;
    int j = n < quota ? n++ : n - 1;  // insertion into the list sorted best first
    for (; j > 0 && list[(j - 1) * kListThreads] < key; --j)
      list[j * kListThreads] = list[(j - 1) * kListThreads];
    list[j * kListThreads] = key;
  }
  int32_t* ids = p.ids + (h * p.total_q + t) * p.rule.topk;
  float* scores = p.scores + (h * p.total_q + t) * p.rule.topk;
  for (int k = 0; k < p.rule.topk; ++k) {
    const bool in = k < n;
    const int64_t kb = in ? key_block(list[k * kListThreads]) : -1;
    ids[k] = int32_t(kb);
    // The score itself, re-read: the key keeps its order, not its bits (-0 and NaN payloads).
    float g = NAN;
    for (int x = int(h) * p.per_sel; in && x < int(h + 1) * p.per_sel; ++x) {
      g = fmaxf(g, p.plane[(int64_t(x) * p.nsb + block_shard_page(p.shard, kb)) * p.total_q + t]);
    }
    scores[k] = in ? g : -INFINITY;
  }
}

struct MergeParams {
  const int32_t* ids;  // [world, Hsel, total_q, topk]
  const float* scores;
  int32_t* q2k;        // [Hsel, total_q, topk]
  const int32_t* cu_seqlens_q;
  KeyLengths keys;
  int32_t* status;
  SelectRule rule;
  int64_t total_q, batch;
  int world, hsel;
  bool causal;
};

__global__ void __launch_bounds__(kListThreads) merge_kernel(const MergeParams p) {
  const int64_t t = int64_t(blockIdx.x) * kListThreads + threadIdx.x, h = blockIdx.y;
  if (t >= p.total_q) return;
  TokenView v{0, 0};
  const bool ok = token_view(p.cu_seqlens_q, p.batch, p.keys, p.causal, t, p.status, v);
  const int64_t nsink = ok ? forced_sinks(p.rule, v.nvis) : 0, lo = ok ? local_start(p.rule, v.nvis) : 0;
  const int quota = ok ? max(0, p.rule.topk - forced_count(p.rule, v.nvis)) : 0;
  const int64_t row = h * p.total_q + t;
  // Candidates: every valid entry of every rank's row, as ranking keys (0: none).
  uint64_t cand[kMaxEntries];
  int n = 0;
  for (int w = 0; w < p.world; ++w) {
    const int64_t base = (int64_t(w) * p.hsel * p.total_q + row) * p.rule.topk;
    bool ended = false;
    int listed = 0;
    for (int k = 0; k < p.rule.topk; ++k) {
      const int32_t id = p.ids[base + k];
      const float s = p.scores[base + k];
      bool good;
      if (ended || id < 0) {
        good = id == -1;
        ended = true;
      } else {
        good = id >= nsink && id < lo && s == s && ++listed <= quota;
        for (int k2 = 0; good && k2 < k; ++k2) good = p.ids[base + k2] != id;
      }
      if (!good) {
        flag_status(p.status, int32_t(StatusCode::icp_list_invalid), w, row, k);
        continue;
      }
      if (!ended) cand[n++] = rank_key(s, id);
    }
  }
  // Each block once, with its best key (ties between equal keys: the first).
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n && cand[i] != 0; ++j)
      if (j != i && cand[j] != 0 && key_block(cand[j]) == key_block(cand[i]) &&
          (cand[j] > cand[i] || (cand[j] == cand[i] && j < i)))
        cand[i] = 0;
  // The best `quota` (keys of distinct blocks are distinct), then the row ascending.
  int32_t taken[kMaxList];
  int m = 0;
  for (uint64_t below = ~0ull; m < quota;) {
    uint64_t best = 0;
    for (int i = 0; i < n; ++i) best = cand[i] < below && cand[i] > best ? cand[i] : best;
    if (best == 0) break;
    taken[m++] = int32_t(key_block(best));
    below = best;
  }
  for (int i = 1; i < m; ++i)  // insertion sort, ascending
    for (int j = i; j > 0 && taken[j - 1] > taken[j]; --j) {
      const int32_t x = taken[j];
      taken[j] = taken[j - 1];
      taken[j - 1] = x;
    }
  int32_t* out = p.q2k + row * p.rule.topk;
  int k = 0;
  for (int64_t b = 0; b < nsink; ++b) out[k++] = int32_t(b);
  for (int i = 0; i < m; ++i) out[k++] = taken[i];
  for (int64_t b = lo; ok && b < v.nvis; ++b) out[k++] = int32_t(b);
  for (; k < p.rule.topk; ++k) out[k] = -1;
}

KeyLengths global_lengths(const Tensor& page_table, const Tensor& seqused_k, int page_rows) {
  KeyLengths k;
  k.seqused_k = seqused_k.defined() ? seqused_k.ptr<int32_t>() : nullptr;
  k.max_keys = page_table.shape[1] * page_rows;
  return k;
}

}  // namespace

void icp_rank_lists(const IcpRankListsArgs& a, const ProblemShape& s, cudaStream_t stream) {
  MSA_CHECK(a.topk <= kMaxList, "icp_rank_lists: topk must be at most ", kMaxList, " on CUDA, got ",
            a.topk);
  if (icp_lists_fuse(s.num_q_heads, s.num_kv_heads, a.ids.shape[0], a.topk, a.sink_blocks,
                     a.local_blocks))
    return icp_shard_scores(a, s, nullptr, stream);  // the lists straight from the kernel
  float* plane = static_cast<float*>(a.workspace.data);
  icp_shard_scores(a, s, plane, stream);
  if (s.total_q == 0 || s.batch == 0) return;
  ListParams p{};
  p.plane = plane;
  p.ids = a.ids.ptr<int32_t>();
  p.scores = a.scores.ptr<float>();
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  p.keys = global_lengths(a.page_table, a.seqused_k, int(s.page_size));
  p.status = a.status.ptr<int32_t>();
  p.shard = make_shard_map(a.world, a.rank, int(a.shard.values.shape[1]), a.layout == IcpLayout::p128);
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.total_q = s.total_q;
  p.nsb = s.max_pages;
  p.batch = s.batch;
  p.per_sel = int(s.num_q_heads / a.ids.shape[0]);
  p.causal = a.causal;
  const dim3 grid(unsigned((s.total_q + kListThreads - 1) / kListThreads), unsigned(a.ids.shape[0]));
  list_kernel<<<grid, kListThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void icp_merge(const IcpMergeArgs& a, cudaStream_t stream) {
  MergeParams p{};
  p.world = int(a.ids.shape[0]);
  p.hsel = int(a.ids.shape[1]);
  p.total_q = a.ids.shape[2];
  p.batch = a.cu_seqlens_q.shape[0] - 1;
  if (p.total_q == 0 || p.hsel == 0 || p.batch <= 0) return;
  p.ids = a.ids.ptr<int32_t>();
  p.scores = a.scores.ptr<float>();
  p.q2k = a.q2k.ptr<int32_t>();
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  p.keys = global_lengths(a.page_table, a.seqused_k, a.layout == IcpLayout::p128 ? 128 : 256);
  p.status = a.status.ptr<int32_t>();
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.causal = a.causal;
  const dim3 grid(unsigned((p.total_q + kListThreads - 1) / kListThreads), unsigned(p.hsel));
  merge_kernel<<<grid, kListThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
