// Synthetic tok/blk selections and pair counts (see patterns.h). Plain host code: a 48K-token
// selection takes milliseconds, so it is generated fresh by every benchmark run.
#include "workloads/patterns.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <stdexcept>

#include "workloads/inputs.h"

namespace msa::bench {
namespace {

// A counter-based stream: the draws of one row depend only on (seed, head, row key), so rows can
// be generated in any order or in parallel and still give the same selection.
class RowRng {
 public:
  RowRng(uint64_t seed, uint64_t head, uint64_t row)
      : state_(mix64(mix64(seed) ^ mix64(head * 0x100000001b3ull + row))) {}
  uint64_t next() { return mix64(state_++); }

 private:
  uint64_t state_;
};

bool contains(const int32_t* row, int n, int32_t id) { return std::find(row, row + n, id) != row + n; }

// One selection row for a query whose visible keys are [0, vis_end) of a batch with lk keys and
// whose diagonal key is diag_pos: forced blocks 0, diagonal, diagonal - 1, then random visible
// blocks; ascending and -1 padded. Rows of queries that see nothing are all -1.
void draw_row(int64_t vis_end, int64_t diag_pos, int blk, int topk, RowRng rng, int32_t* row) {
  std::fill(row, row + topk, -1);
  if (vis_end <= 0) return;
  const int64_t nvis = (vis_end + blk - 1) / blk;
  int n = 0;
  if (nvis <= topk) {
    for (int64_t kb = 0; kb < nvis; ++kb) row[n++] = static_cast<int32_t>(kb);
    return;
  }
  const int64_t diag = diag_pos / blk;
  for (int64_t kb : {int64_t{0}, diag, diag - 1}) {
    if (n < topk && kb >= 0 && kb < nvis && !contains(row, n, static_cast<int32_t>(kb)))
      row[n++] = static_cast<int32_t>(kb);
  }
  while (n < topk) {  // nvis > topk, so a free block always exists
    const auto kb = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(nvis));
    if (!contains(row, n, kb)) row[n++] = kb;
  }
  std::sort(row, row + n);
}

// One Pattern::ids row for a query that sees keys [0, vis_end): the most recent min(topk,
// kRecentKeys), then distinct random earlier keys by rejection on the bitset `seen` (at least
// (vis_end - recent + 63) / 64 words, all zero; left zero), written in ascending order from it, so
// a row costs its draws plus vis_end / 64 words, not a sort. Near vis_end = topk + 1 the draws run
// into repeats (about m ln m for m = 1921), which stays small next to the long rows.
void draw_ids_row(int64_t vis_end, int topk, RowRng rng, std::vector<uint64_t>& seen, int32_t* row) {
  std::fill(row, row + topk, -1);
  if (vis_end <= 0) return;
  if (vis_end <= topk) {
    for (int64_t j = 0; j < vis_end; ++j) row[j] = static_cast<int32_t>(j);
    return;
  }
  const int recent = std::min(topk, kRecentKeys);
  const int64_t m = vis_end - recent;  // > topk - recent: enough keys to draw from
  for (int n = recent; n < topk;) {
    const auto x = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(m));
    uint64_t& word = seen[static_cast<size_t>(x >> 6)];
    const uint64_t bit = uint64_t{1} << (x & 63);
    if (!(word & bit)) word |= bit, ++n;
  }
  int n = 0;
  for (int64_t w = 0; w < (m + 63) / 64; ++w) {
    for (uint64_t bits = seen[static_cast<size_t>(w)]; bits != 0; bits &= bits - 1)
      row[n++] = static_cast<int32_t>(w * 64 + std::countr_zero(bits));
    seen[static_cast<size_t>(w)] = 0;
  }
  for (int64_t j = m; j < vis_end; ++j) row[n++] = static_cast<int32_t>(j);
}

// Pattern::ids: rows of (kv head, query) spread over the threads (a 32K request of one kv head is
// a single (head, batch) pair), each thread with its own bitset.
std::vector<int32_t> make_token_ids(const SelectionShape& s) {
  if (s.kv_block_size != 1)
    throw std::invalid_argument("make_selection(ids): token ids need kv_block_size 1, got " +
                                std::to_string(s.kv_block_size));
  const int64_t batch = static_cast<int64_t>(s.cu_seqlens_q.size()) - 1;
  const int64_t total_q = batch > 0 ? s.cu_seqlens_q[batch] : 0;
  int64_t max_k = 0;
  for (int64_t b = 0; b < batch; ++b) max_k = std::max(max_k, s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b]);
  std::vector<int32_t> q2k(static_cast<size_t>(s.num_kv_heads) * total_q * s.topk);
  const int64_t rows = s.num_kv_heads * total_q;
#pragma omp parallel
  {
    std::vector<uint64_t> seen(static_cast<size_t>((max_k + 63) / 64), 0);
    int64_t b = 0;
#pragma omp for schedule(dynamic, 256)
    for (int64_t r = 0; r < rows; ++r) {
      const int h = static_cast<int>(r / total_q);
      const int64_t t = r % total_q;
      if (t < s.cu_seqlens_q[b] || t >= s.cu_seqlens_q[b + 1]) b = 0;  // a new chunk
      while (s.cu_seqlens_q[b + 1] <= t) ++b;
      const int64_t lq = s.cu_seqlens_q[b + 1] - s.cu_seqlens_q[b];
      const int64_t lk = s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b];
      const int64_t vis_end = visible_key_end(t - s.cu_seqlens_q[b], lq, lk, s.causal);
      draw_ids_row(vis_end, s.topk, RowRng(s.seed, h, static_cast<uint64_t>(t)), seen,
                   q2k.data() + r * s.topk);
    }
  }
  return q2k;
}

}  // namespace

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::tok: return "tok";
    case Pattern::blk: return "blk";
    case Pattern::idx: return "idx";
    case Pattern::ids: return "ids";
  }
  return "?";
}

bool parse_pattern(std::string_view name, Pattern* out) {
  for (Pattern p : {Pattern::tok, Pattern::blk, Pattern::idx}) {
    if (name == pattern_name(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

int64_t visible_key_end(int64_t i, int64_t lq, int64_t lk, bool causal) {
  if (!causal) return lk;
  return std::clamp<int64_t>(i + lk - lq + 1, 0, lk);
}

std::vector<int32_t> make_selection(Pattern p, const SelectionShape& s) {
  if (p == Pattern::ids) return make_token_ids(s);
  const int64_t batch = static_cast<int64_t>(s.cu_seqlens_q.size()) - 1;
  const int64_t total_q = batch > 0 ? s.cu_seqlens_q[batch] : 0;
  const int blk = s.kv_block_size;
  std::vector<int32_t> q2k(static_cast<size_t>(s.num_kv_heads) * total_q * s.topk);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int h = 0; h < s.num_kv_heads; ++h) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
      const int64_t lk = s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b];
      for (int64_t i = 0; i < lq; ++i) {
        // blk: the whole query block (s.blk_queries queries, 128 unless a case says otherwise,
        // whatever the kv block size) takes the selection of its last query, the one that sees
        // the most keys, drawn from the block's own stream.
        const int64_t kQBlock = s.blk_queries;
        const int64_t rep = p == Pattern::blk ? std::min((i / kQBlock + 1) * kQBlock, lq) - 1 : i;
        const uint64_t key = p == Pattern::blk ? (uint64_t(b) << 40) + uint64_t(i / kQBlock)
                                               : uint64_t(q0 + i);
        const int64_t vis_end = visible_key_end(rep, lq, lk, s.causal);
        const int64_t diag_pos = std::clamp<int64_t>(rep + lk - lq, 0, lk > 0 ? lk - 1 : 0);
        int32_t* row = q2k.data() + (static_cast<int64_t>(h) * total_q + q0 + i) * s.topk;
        draw_row(vis_end, diag_pos, blk, s.topk, RowRng(s.seed, h, key), row);
      }
    }
  }
  return q2k;
}

PairCounts count_pairs(const std::vector<int32_t>& q2k, const SelectionShape& s, int group) {
  const int64_t batch = static_cast<int64_t>(s.cu_seqlens_q.size()) - 1;
  const int64_t total_q = batch > 0 ? s.cu_seqlens_q[batch] : 0;
  const int64_t blk = s.kv_block_size;
  int64_t attended = 0, visible = 0, selected = 0;
#pragma omp parallel for collapse(2) reduction(+ : attended, visible, selected)
  for (int h = 0; h < s.num_kv_heads; ++h) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
      const int64_t lk = s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b];
      std::vector<char> chosen(static_cast<size_t>((lk + blk - 1) / blk), 0);
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t vis_end = visible_key_end(i, lq, lk, s.causal);
        visible += vis_end;
        const int32_t* row = q2k.data() + (static_cast<int64_t>(h) * total_q + q0 + i) * s.topk;
        for (int j = 0; j < s.topk; ++j) {
          if (row[j] < 0) continue;
          const int64_t lo = row[j] * blk, hi = std::min(lo + blk, vis_end);
          if (hi > lo) attended += hi - lo;
          if (static_cast<size_t>(row[j]) < chosen.size()) chosen[row[j]] = 1;
        }
      }
      for (size_t kb = 0; kb < chosen.size(); ++kb)
        if (chosen[kb]) selected += std::min<int64_t>(blk, lk - static_cast<int64_t>(kb) * blk);
    }
  }
  return {attended * group, visible * group, selected};
}

std::string dense_selection_warning(const PairCounts& p, const SelectionShape& s) {
  int64_t key_blocks = 0;
  for (size_t b = 0; b + 1 < s.cu_seqlens_k.size(); ++b)
    key_blocks = std::max(key_blocks, (s.cu_seqlens_k[b + 1] - s.cu_seqlens_k[b] + s.kv_block_size - 1) /
                                          s.kv_block_size);
  const double density = p.visible > 0 ? double(p.attended) / double(p.visible) : 0.0;
  const bool all_blocks = s.topk >= key_blocks;
  if (density < 0.9 && !all_blocks) return "";
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * density);
  std::string w = std::string("warning: the selection is dense: it covers ") + pct +
                  " of the causally visible (head, key) pairs";
  if (all_blocks)
    w += " (topK " + std::to_string(s.topk) + " >= " + std::to_string(key_blocks) + " key blocks)";
  return w + ", so this times dense attention, not sparse; use a longer sequence or a smaller topK";
}

}  // namespace msa::bench
