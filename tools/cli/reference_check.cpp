// fp64 recomputation of sampled attention rows for `msa demo` (see reference_check.h). It reads
// only the host inputs and the selection, never the library's CPU backend, so it also checks
// the CPU backend itself.
#include "reference_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "workloads/inputs.h"

namespace msa::cli {
namespace {

struct RowRef {
  std::vector<double> out;
  double lse = -std::numeric_limits<double>::infinity();  // -inf: no attended key
};

struct RowId {
  int64_t t, hq;
};

// The attended keys of (t, hq) are the keys of its kv head's selected blocks that t can see.
RowRef reference_row(const Shape& s, const HostInputs& in, const std::vector<int32_t>& q2k, RowId r) {
  const int64_t hq_n = s.num_q_heads, hkv_n = s.num_kv_heads, d_n = s.head_dim;
  const int64_t h = r.hq / (hq_n / hkv_n), total = in.cu_seqlens.back();
  const auto& cu = in.cu_seqlens;
  const int64_t b = std::upper_bound(cu.begin(), cu.end(), r.t) - cu.begin() - 1;
  const int64_t q0 = cu[b], len = cu[b + 1] - q0, i = r.t - q0;
  const int64_t vis_end = bench::visible_key_end(i, len, len, s.causal);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_n));
  const uint16_t* q = in.q.data() + (r.t * hq_n + r.hq) * d_n;
  std::vector<int64_t> keys;
  std::vector<double> logits;
  const int32_t* row = q2k.data() + (h * total + r.t) * s.topk;
  for (int slot = 0; slot < s.topk; ++slot) {
    if (row[slot] < 0) continue;
    const int64_t lo = int64_t{row[slot]} * s.kv_block_size;
    for (int64_t j = lo; j < std::min(lo + s.kv_block_size, vis_end); ++j) {
      const uint16_t* k = in.k.data() + ((q0 + j) * hkv_n + h) * d_n;
      double dot = 0;
      for (int64_t d = 0; d < d_n; ++d) dot += double(bench::bf16_to_float(q[d])) * bench::bf16_to_float(k[d]);
      keys.push_back(q0 + j);
      logits.push_back(scale * dot);
    }
  }
  RowRef ref;
  ref.out.assign(static_cast<size_t>(d_n), 0.0);
  if (keys.empty()) return ref;
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - m));
  for (size_t n = 0; n < keys.size(); ++n) {
    const uint16_t* v = in.v.data() + (keys[n] * hkv_n + h) * d_n;
    for (int64_t d = 0; d < d_n; ++d) ref.out[d] += logits[n] / sum * bench::bf16_to_float(v[d]);
  }
  ref.lse = m + std::log(sum);
  return ref;
}

// Sinks and the local (diagonal) block are forced by select_topk whenever visible
// (docs/semantics.md, Top-K selection).
bool forced_blocks_present(const Shape& s, const HostInputs& in, const std::vector<int32_t>& q2k, RowId r) {
  const auto& cu = in.cu_seqlens;
  const int64_t total = cu.back(), h = r.hq / (s.num_q_heads / s.num_kv_heads);
  const int64_t b = std::upper_bound(cu.begin(), cu.end(), r.t) - cu.begin() - 1;
  const int64_t len = cu[b + 1] - cu[b];
  const int64_t vis_end = bench::visible_key_end(r.t - cu[b], len, len, s.causal);
  if (vis_end == 0) return true;
  const int32_t* row = q2k.data() + (h * total + r.t) * s.topk;
  auto has = [&](int64_t kb) { return std::find(row, row + s.topk, kb) != row + s.topk; };
  const int64_t diag = (vis_end - 1) / s.kv_block_size;
  return has(0) && (s.topk < 2 || has(diag));
}

// Row 0 (the first query: one key) and the last row are always sampled; the rest at random.
std::vector<RowId> sample_rows(const Shape& s, int64_t total, int rows) {
  std::vector<RowId> ids;
  if (total == 0) return ids;
  const int64_t n = std::min<int64_t>(rows, total * s.num_q_heads);
  uint64_t state = s.seed * 0x9e3779b97f4a7c15ull + 12345;
  auto next = [&state] {
    uint64_t x = (state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  for (int64_t r = 0; r < n; ++r) {
    if (r == 0) ids.push_back({0, 0});
    else if (r == 1) ids.push_back({total - 1, s.num_q_heads - 1});
    else ids.push_back({static_cast<int64_t>(next() % total), static_cast<int64_t>(next() % s.num_q_heads)});
  }
  return ids;
}

}  // namespace

bool CheckResult::pass() const {
  return out_rel_l2 <= kOutRelTol && lse_max_abs <= kLseAbsTol && special_mismatch == 0 &&
         forced_missing == 0;
}

CheckResult check_sampled_rows(const Shape& s, const HostInputs& in, const std::vector<int32_t>& q2k,
                               const Pipeline& p, int rows) {
  CheckResult res;
  double diff2 = 0, ref2 = 0;
  for (RowId r : sample_rows(s, in.cu_seqlens.back(), rows)) {
    ++res.rows;
    const RowRef ref = reference_row(s, in, q2k, r);
    const std::vector<uint16_t> out = p.out_row(r.t, r.hq);
    const double lse = p.lse(r.t, r.hq);
    if (!forced_blocks_present(s, in, q2k, r)) ++res.forced_missing;
    // No attended key: the answer is out = 0 and lse = -inf (docs/semantics.md, Attention), nothing
    // else.
    const double neg_inf = -std::numeric_limits<double>::infinity();
    bool bad = std::isinf(ref.lse) ? lse != neg_inf : !std::isfinite(lse);
    for (uint16_t o : out) bad = bad || std::isnan(bench::bf16_to_float(o));
    if (bad) {
      ++res.special_mismatch;
      continue;
    }
    for (size_t d = 0; d < out.size(); ++d) {
      const double e = bench::bf16_to_float(out[d]) - ref.out[d];
      diff2 += e * e;
      ref2 += ref.out[d] * ref.out[d];
      res.out_max_abs = std::max(res.out_max_abs, std::abs(e));
    }
    if (std::isfinite(ref.lse)) res.lse_max_abs = std::max(res.lse_max_abs, std::abs(lse - ref.lse));
  }
  res.out_rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return res;
}

}  // namespace msa::cli
