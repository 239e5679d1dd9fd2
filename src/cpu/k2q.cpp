// q2k checking, q2k -> k2q CSR construction and the work schedule on the host (cpu/k2q.h).
// Plain serial loops where order defines the answer (the first offending id); one head per
// OpenMP thread where heads are independent.
#include "cpu/k2q.h"

#include <algorithm>

#include "backend.h"
#include "common/schedule.h"

namespace msa::cpu {

int64_t BatchGeometry::max_blocks() const {
  int64_t m = 0;
  for (int64_t b = 0; b < batch(); ++b) m = std::max(m, num_blocks(b));
  return m;
}

BatchGeometry batch_geometry(const Tensor& cu_seqlens_q, std::vector<int64_t> key_len,
                             int64_t kv_block_size) {
  BatchGeometry g;
  g.kv_block_size = kv_block_size;
  g.key_len = std::move(key_len);
  const int64_t batch = g.batch();
  const int32_t* cu = cu_seqlens_q.ptr<int32_t>();
  g.q_start.assign(cu, cu + batch + 1);
  g.row_start.assign(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b)
    g.row_start[b + 1] = g.row_start[b] + num_blocks(g.key_len[b], kv_block_size);
  g.token_batch.resize(g.total_q());
  for (int64_t b = 0; b < batch; ++b)
    std::fill(g.token_batch.begin() + g.q_start[b], g.token_batch.begin() + g.q_start[b + 1], b);
  return g;
}

namespace {
[[noreturn]] void report(StatusCode code, int64_t head, int64_t token, int64_t slot) {
  const int32_t st[4] = {int32_t(code), int32_t(head), int32_t(token), int32_t(slot)};
  throw Error(describe_status(st));
}
}  // namespace

void check_q2k_ids(const Tensor& q2k, const BatchGeometry& g) {
  const int64_t hkv = q2k.shape[0], total_q = q2k.shape[1], topk = q2k.shape[2];
  const int32_t* ids = q2k.ptr<int32_t>();
  // seen[kb] = the last (head, token) row that selected block kb: a repeat within a row is a
  // hit on the current row number, so the array never needs clearing.
  std::vector<int64_t> seen(g.max_blocks(), -1);
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t t = 0; t < total_q; ++t) {
      const int64_t row = h * total_q + t;
      const int64_t nblk = g.num_blocks(g.token_batch[t]);
      for (int64_t slot = 0; slot < topk; ++slot) {
        const int64_t id = ids[row * topk + slot];
        if (id == -1) continue;
        if (id < -1 || id >= nblk) report(StatusCode::block_id_out_of_range, h, t, slot);
        if (seen[id] == row) report(StatusCode::block_id_repeated, h, t, slot);
        seen[id] = row;
      }
    }
  }
}

void fill_k2q(const Tensor& q2k, const BatchGeometry& g, int64_t rows, int32_t* row_ptr,
              int32_t* q_idx) {
  const int64_t hkv = q2k.shape[0], total_q = q2k.shape[1], topk = q2k.shape[2];
  const int64_t slots = total_q * topk;
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < hkv; ++h) {
    const int32_t* ids = q2k.ptr<int32_t>() + h * slots;
    int32_t* rp = row_ptr + h * (rows + 1);
    int32_t* qi = q_idx + h * slots;
    // Count the queries of each row, turn the counts into offsets, then place the queries.
    // Tokens are visited in ascending order, so each row's ids come out ascending.
    std::vector<int64_t> fill(rows + 1, 0);
    for (int64_t t = 0; t < total_q; ++t)
      for (int64_t slot = 0; slot < topk; ++slot)
        if (ids[t * topk + slot] >= 0) ++fill[g.row_start[g.token_batch[t]] + ids[t * topk + slot] + 1];
    for (int64_t r = 0; r < rows; ++r) fill[r + 1] += fill[r];
    for (int64_t r = 0; r <= rows; ++r) rp[r] = int32_t(fill[r]);
    for (int64_t t = 0; t < total_q; ++t) {
      const int64_t b = g.token_batch[t];
      for (int64_t slot = 0; slot < topk; ++slot) {
        const int32_t id = ids[t * topk + slot];
        if (id >= 0) qi[fill[g.row_start[b] + id]++] = int32_t(t - g.q_start[b]);
      }
    }
    std::fill(qi + rp[rows], qi + slots, -1);
  }
}

void fill_q2k(const int32_t* row_ptr, const int32_t* q_idx, int64_t rows, const BatchGeometry& g,
              const Tensor& q2k) {
  const int64_t hkv = q2k.shape[0], total_q = q2k.shape[1], topk = q2k.shape[2];
  const int64_t slots = total_q * topk;
  int32_t* out = q2k.ptr<int32_t>();
  std::fill(out, out + hkv * slots, -1);
  std::vector<int64_t> used(total_q);  // blocks written so far per token
  for (int64_t h = 0; h < hkv; ++h) {
    const int32_t* rp = row_ptr + h * (rows + 1);
    const int32_t* qi = q_idx + h * slots;
    MSA_CHECK(rp[0] == 0, "row_ptr: head ", h, " must start at 0, got ", rp[0]);
    std::fill(used.begin(), used.end(), 0);
    // Rows of a batch are its blocks in ascending order, so each token's blocks arrive sorted.
    for (int64_t b = 0; b < g.batch(); ++b) {
      for (int64_t kb = 0; kb < g.num_blocks(b); ++kb) {
        const int64_t r = g.row_start[b] + kb;
        MSA_CHECK(rp[r + 1] >= rp[r] && rp[r + 1] <= slots, "row_ptr: head ", h, " row ", r,
                  ": entries must be non-decreasing and <= ", slots, ", got ", rp[r], " then ",
                  rp[r + 1]);
        for (int64_t i = rp[r]; i < rp[r + 1]; ++i) {
          const int64_t q = qi[i];
          MSA_CHECK(q >= 0 && q < g.q_len(b), "q_idx: query id ", q, " at (head ", h, ", row ", r,
                    ") outside [0, ", g.q_len(b), ") (batch ", b, ")");
          MSA_CHECK(i == rp[r] || q > qi[i - 1], "q_idx: ids of (head ", h, ", row ", r,
                    ") must be strictly ascending");
          const int64_t t = g.q_start[b] + q;
          MSA_CHECK(used[t] < topk, "q2k: token ", t, " of head ", h, " has more than topk = ",
                    topk, " blocks in the CSR");
          out[(h * total_q + t) * topk + used[t]++] = int32_t(kb);
        }
      }
    }
    for (int64_t r = g.total_rows(); r < rows; ++r)
      MSA_CHECK(rp[r + 1] == rp[r], "row_ptr: head ", h, " row ", r, " lies past the ",
                g.total_rows(), " rows of the batches' blocks and must be empty, got ", rp[r],
                " then ", rp[r + 1]);
  }
}

void fill_schedule(const int32_t* row_ptr, int64_t num_kv_heads, int64_t total_rows,
                   const Tensor& schedule) {
  int32_t* out = schedule.ptr<int32_t>();
  auto* items = reinterpret_cast<sched::WorkItem*>(out + sched::kHeaderInts);
  int64_t n = 0;
  for (int64_t h = 0; h < num_kv_heads; ++h) {
    const int32_t* rp = row_ptr + h * (total_rows + 1);
    for (int64_t r = 0; r < total_rows; ++r)
      if (rp[r + 1] > rp[r]) items[n++] = {int32_t(h), int32_t(r), rp[r], rp[r + 1]};
  }
  out[0] = sched::kMagic;
  out[1] = int32_t(n);
}

void check_schedule(const Tensor& schedule, const int32_t* row_ptr, int64_t num_kv_heads,
                    int64_t total_rows) {
  const int32_t* in = schedule.ptr<int32_t>();
  const int64_t capacity = (schedule.numel() - sched::kHeaderInts) / sched::kItemInts;
  MSA_CHECK(schedule.numel() >= sched::kHeaderInts && in[0] == sched::kMagic,
            "schedule: not written by build_k2q_csr (bad header)");
  const int64_t present = in[1];
  MSA_CHECK(present >= 0 && present <= capacity, "schedule: item count ", present,
            " outside [0, ", capacity, "] (the buffer's capacity)");
  std::vector<uint8_t> covered(num_kv_heads * total_rows, 0);
  int64_t expected = 0;
  for (int64_t h = 0; h < num_kv_heads; ++h)
    for (int64_t r = 0; r < total_rows; ++r)
      expected += row_ptr[h * (total_rows + 1) + r + 1] > row_ptr[h * (total_rows + 1) + r];
  const auto* items = reinterpret_cast<const sched::WorkItem*>(in + sched::kHeaderInts);
  for (int64_t i = 0; i < present; ++i) {
    const sched::WorkItem& w = items[i];
    MSA_CHECK(w.head >= 0 && w.head < num_kv_heads && w.row >= 0 && w.row < total_rows,
              "schedule: item ", i, " names (head ", w.head, ", row ", w.row,
              ") outside [0, ", num_kv_heads, ") x [0, ", total_rows, ")");
    const int32_t* rp = row_ptr + w.head * (total_rows + 1);
    MSA_CHECK(w.q_begin == rp[w.row] && w.q_end == rp[w.row + 1] && w.q_end > w.q_begin,
              "schedule: item ", i, " slice [", w.q_begin, ", ", w.q_end, ") of (head ", w.head,
              ", row ", w.row, ") does not match the non-empty row_ptr slice [", rp[w.row], ", ",
              rp[w.row + 1], ")");
    uint8_t& c = covered[w.head * total_rows + w.row];
    MSA_CHECK(!c, "schedule: (head ", w.head, ", row ", w.row, ") covered twice (item ", i, ")");
    c = 1;
  }
  if (present != expected) {
    const int32_t st[4] = {int32_t(StatusCode::schedule_incomplete), int32_t(expected),
                           int32_t(present), 0};
    throw Error(describe_status(st));
  }
}

}  // namespace msa::cpu
