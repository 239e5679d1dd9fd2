// GPU tests of the device-side index checks (src/cuda/common/index_checks.cu): the first bad
// q2k id or cu_seqlens entry lands in the status buffer, the status message names (head, token,
// slot), and nothing is read out of bounds (run under compute-sanitizer on the GPU machine).
// Long rows (the row kernel, and the per-thread kernel above its cap) are checked against the CPU
// reference (cpu::check_q2k_ids) on random rows with injected offences.
#include <algorithm>
#include <climits>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "cpu/k2q.h"
#include "cuda/common/index_checks.cuh"
#include "support/attention_problem.h"
#include "support/gpu_test_util.h"

namespace msa::test {
namespace {

using cuda::kQ2KCheckWorkspaceBytes;
using cuda::launch_q2k_check;
using cuda::Q2KCheckParams;

struct Case {
  std::vector<int32_t> cu_q, cu_k;
  int64_t hkv = 2, topk = 4, blk = 128;
  std::vector<int32_t> q2k;  // [hkv, total_q, topk]
};

// Runs the device check and returns the status words; `valid`: also the valid_per_head counts.
std::vector<int32_t> run_check(const Case& c, std::vector<int32_t>* valid = nullptr) {
  TestStream stream;
  const int64_t batch = int64_t(c.cu_q.size()) - 1, total_q = c.cu_q.back();
  DeviceBuffer q2k(std::max<size_t>(4, c.q2k.size() * 4)), cuq(c.cu_q.size() * 4),
      cuk(c.cu_k.size() * 4), ws(kQ2KCheckWorkspaceBytes), status(16), counts(c.hkv * 4);
  q2k.upload(c.q2k, stream);
  cuq.upload(c.cu_q, stream);
  cuk.upload(c.cu_k, stream);
  clear_status(Tensor(status.get(), DType::i32, {4}, gpu0()), stream);
  Q2KCheckParams p;
  p.q2k = static_cast<const int32_t*>(q2k.get());
  p.cu_seqlens_q = static_cast<const int32_t*>(cuq.get());
  p.keys.cu_seqlens_k = static_cast<const int32_t*>(cuk.get());
  p.keys.total_k = c.cu_k.back();
  p.batch = batch;
  p.num_kv_heads = c.hkv;
  p.total_q = total_q;
  p.topk = c.topk;
  p.kv_block_size = c.blk;
  if (valid) p.valid_per_head = static_cast<int32_t*>(counts.get());
  launch_q2k_check(p, ws.get(), static_cast<int32_t*>(status.get()), stream);
  if (valid) *valid = counts.download<int32_t>(size_t(c.hkv), stream);
  return status.download<int32_t>(4, stream);
}

// A valid random selection: distinct ids in [0, nblk_b) or -1, per (head, token), in any slot.
Case random_case(std::mt19937& rng, int batch, int64_t hkv, int64_t topk) {
  Case c;
  c.hkv = hkv;
  c.topk = topk;
  std::vector<int32_t> lq, lk;
  for (int b = 0; b < batch; ++b) {
    lq.push_back(int32_t(rng() % 300));
    lk.push_back(int32_t(rng() % 900));
  }
  c.cu_q = cumulative(lq);
  c.cu_k = cumulative(lk);
  c.q2k = random_q2k(lq, lk, hkv, topk, c.blk, rng, /*sorted=*/false);
  return c;
}

TEST(IndexChecksGpu, ValidSelectionsPass) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(1);
  for (int trial = 0; trial < 6; ++trial) {
    const Case c = random_case(rng, 1 + trial, 1 + trial % 4, 1 + 3 * trial);
    EXPECT_EQ(run_check(c)[0], 0) << "trial " << trial;
  }
}

TEST(IndexChecksGpu, ReportsFirstOffenceOfEachKind) {
  MSA_REQUIRE_GPU();
  const std::vector<int32_t> bad_ids = {INT_MIN, -123456, -2, 0 /* nblk */, 1000 /* nblk+1000 */,
                                        INT_MAX};
  std::mt19937 rng(2);
  for (size_t i = 0; i < bad_ids.size(); ++i) {
    SCOPED_TRACE("id case " + std::to_string(i));
    Case c = random_case(rng, 3, 2, 6);
    const int64_t total_q = c.cu_q.back();
    ASSERT_GT(total_q, 0);
    // Two offences: the earlier one (in (head, token, slot) order) must be reported.
    const int64_t h1 = 1, t1 = total_q - 1, s1 = 4, h0 = 1, t0 = total_q / 2, s0 = 2;
    auto put = [&](int64_t h, int64_t t, int64_t s) {
      int64_t b = 0;
      while (c.cu_q[b + 1] <= t) ++b;
      const int32_t nblk = (c.cu_k[b + 1] - c.cu_k[b] + 127) / 128;
      int32_t id = bad_ids[i];
      if (i == 3) id = nblk;
      if (i == 4) id = nblk + 1000;
      c.q2k[(h * total_q + t) * c.topk + s] = id;
    };
    put(h1, t1, s1);
    put(h0, t0, s0);
    const auto st = run_check(c);
    expect_status(st, StatusCode::block_id_out_of_range, int32_t(h0), int32_t(t0), int32_t(s0));
    EXPECT_NE(describe_status(st.data()).find("(head 1, token " + std::to_string(t0) + ", slot 2)"),
              std::string::npos)
        << describe_status(st.data());
  }
}

TEST(IndexChecksGpu, RepeatedIdInRow) {
  MSA_REQUIRE_GPU();
  Case c;
  c.cu_q = {0, 3};
  c.cu_k = {0, 1000};  // 8 blocks
  c.hkv = 1;
  c.topk = 4;
  c.q2k = {0, 1, 2, 3, /**/ 0, 5, -1, 5, /**/ 7, 7, 7, 7};
  expect_status(run_check(c), StatusCode::block_id_repeated, 0, 1, 3);
}

TEST(IndexChecksGpu, AllInvalidRowsAndHugeTopK) {
  MSA_REQUIRE_GPU();
  Case c;
  c.cu_q = {0, 2};
  c.cu_k = {0, 130};  // 2 blocks, topk far above
  c.hkv = 1;
  c.topk = 64;
  c.q2k.assign(2 * 64, -1);
  EXPECT_EQ(run_check(c)[0], 0);
  for (auto& x : c.q2k) x = INT_MAX;
  expect_status(run_check(c), StatusCode::block_id_out_of_range, 0, 0, 0);
}

TEST(IndexChecksGpu, BadCuSeqlensAndEmptyBatches) {
  MSA_REQUIRE_GPU();
  Case c;
  c.cu_q = {0, 0, 0};  // every batch empty: nothing to check, no read of prefix[batch]
  c.cu_k = {0, 0, 256};
  c.hkv = 1;
  c.topk = 2;
  EXPECT_EQ(run_check(c)[0], 0);
  c.cu_q = {0, 5, 3};  // non-monotone
  c.q2k.assign(3 * 2, -1);
  auto st = run_check(c);
  EXPECT_EQ(st[0], int32_t(StatusCode::bad_cu_seqlens));
  EXPECT_EQ(st[1], 0);  // cu_seqlens_q
  EXPECT_EQ(st[2], 2);  // broken at batch 2
  EXPECT_NE(describe_status(st.data()).find("cu_seqlens_q"), std::string::npos);
}

TEST(IndexChecksGpu, KeepsEarlierError) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  DeviceBuffer status(16), ws(kQ2KCheckWorkspaceBytes), q2k(8), cuq(8), cuk(8);
  status.upload(std::vector<int32_t>{int32_t(StatusCode::page_id_out_of_range), 1, 2, 3}, stream);
  q2k.upload(std::vector<int32_t>{99, 99}, stream);
  cuq.upload(std::vector<int32_t>{0, 1}, stream);
  cuk.upload(std::vector<int32_t>{0, 10}, stream);
  Q2KCheckParams p;
  p.q2k = static_cast<const int32_t*>(q2k.get());
  p.cu_seqlens_q = static_cast<const int32_t*>(cuq.get());
  p.keys.cu_seqlens_k = static_cast<const int32_t*>(cuk.get());
  p.batch = 1;
  p.num_kv_heads = 1;
  p.total_q = 1;
  p.topk = 2;
  launch_q2k_check(p, ws.get(), static_cast<int32_t*>(status.get()), stream);
  const auto st = status.download<int32_t>(4, stream);
  EXPECT_EQ(st[0], int32_t(StatusCode::page_id_out_of_range));
  EXPECT_THROW(check_status(Tensor(status.get(), DType::i32, {4}, gpu0()), stream), Error);
}

// Long rows: topk above the staged kernel's limit (256), where the row kernel sorts rows that are
// not ascending, and above the row kernel's cap (16384), where one thread takes a row.

// How a row orders its in-range ids: ascending then -1 padded (the usual form), ascending with
// -1 between them, or shuffled among the -1s.
enum class Order { ascending, interleaved, shuffled };

int64_t total_q_of(const Case& c) { return c.cu_q.back(); }

int64_t nblk_of(const Case& c, int64_t t) {
  int64_t b = 0;
  while (c.cu_q[b + 1] <= t) ++b;
  return (int64_t(c.cu_k[b + 1]) - c.cu_k[b] + c.blk - 1) / c.blk;
}

int32_t& slot_of(Case& c, int64_t h, int64_t t, int64_t s) {
  return c.q2k[(h * total_q_of(c) + t) * c.topk + s];
}

// A valid case of 3 batches with long rows: each batch's block count is drawn up to 2 * topk
// (below max_nblk when given), so rows range from -1 padded to full.
Case long_row_case(std::mt19937& rng, int64_t hkv, int64_t topk, int64_t blk, Order order,
                   int64_t max_nblk = 0) {
  Case c;
  c.hkv = hkv;
  c.topk = topk;
  c.blk = blk;
  const int64_t nblk_cap = max_nblk > 0 ? max_nblk : 2 * topk;
  std::vector<int32_t> lq, lk;
  for (int b = 0; b < 3; ++b) {
    lq.push_back(int32_t(1 + rng() % 4));
    lk.push_back(int32_t(rng() % (nblk_cap * blk)));
  }
  c.cu_q = cumulative(lq);
  c.cu_k = cumulative(lk);
  c.q2k = random_q2k(lq, lk, hkv, topk, blk, rng, /*sorted=*/order != Order::shuffled);
  if (order == Order::interleaved) {  // the ascending ids spread over random slots, in order
    for (int64_t row = 0; row < hkv * total_q_of(c); ++row) {
      int32_t* r = c.q2k.data() + row * topk;
      const int64_t n = std::count_if(r, r + topk, [](int32_t id) { return id >= 0; });
      std::vector<char> used(size_t(topk), 0);
      std::fill(used.begin(), used.begin() + n, 1);
      std::shuffle(used.begin(), used.end(), rng);
      std::vector<int32_t> ids(r, r + n);
      for (int64_t s = 0, i = 0; s < topk; ++s) r[s] = used[s] ? ids[i++] : -1;
    }
  }
  return c;
}

// Row (h, t) of c with at least one in-range id (-1 if none).
std::pair<int64_t, int64_t> row_with_ids(Case& c, std::mt19937& rng) {
  for (int tries = 0; tries < 100; ++tries) {
    const int64_t h = int64_t(rng() % c.hkv), t = int64_t(rng() % total_q_of(c));
    for (int64_t s = 0; s < c.topk; ++s)
      if (slot_of(c, h, t, s) >= 0) return {h, t};
  }
  return {-1, -1};
}

// Puts a repeat into row (h, t): a random slot takes the id of another random slot that holds
// one (the earlier of the two then stays the first occurrence).
void inject_repeat(Case& c, int64_t h, int64_t t, std::mt19937& rng) {
  std::vector<int64_t> with_id;
  for (int64_t s = 0; s < c.topk; ++s)
    if (slot_of(c, h, t, s) >= 0) with_id.push_back(s);
  if (with_id.empty()) return;
  const int64_t from = with_id[rng() % with_id.size()];
  int64_t to = int64_t(rng() % c.topk);
  if (to == from) to = (to + 1) % c.topk;
  slot_of(c, h, t, to) = slot_of(c, h, t, from);
}

// Puts an id outside [-1, nblk) at a random slot of row (h, t).
void inject_out_of_range(Case& c, int64_t h, int64_t t, std::mt19937& rng) {
  const int64_t nblk = nblk_of(c, t);
  const int64_t bad[] = {INT_MIN, -2, nblk, nblk + 1000, INT_MAX};
  slot_of(c, h, t, int64_t(rng() % c.topk)) = int32_t(bad[rng() % 5]);
}

// Offences of one trial: 0 a repeat, 1 an out-of-range id, 2 both in one row, 3 both in
// different rows (and often different heads), 4 several of each in random rows.
void inject(Case& c, int kind, std::mt19937& rng) {
  auto [h, t] = row_with_ids(c, rng);
  if (h < 0) {  // no ids anywhere: out-of-range ids only
    inject_out_of_range(c, 0, 0, rng);
    return;
  }
  if (kind == 0 || kind == 2) inject_repeat(c, h, t, rng);
  if (kind == 1 || kind == 2) inject_out_of_range(c, h, t, rng);
  if (kind == 3) {
    inject_repeat(c, h, t, rng);
    inject_out_of_range(c, int64_t(rng() % c.hkv), int64_t(rng() % total_q_of(c)), rng);
  }
  if (kind == 4) {
    for (int i = 0; i < 3; ++i) {
      std::tie(h, t) = row_with_ids(c, rng);
      if (h >= 0) inject_repeat(c, h, t, rng);
      inject_out_of_range(c, int64_t(rng() % c.hkv), int64_t(rng() % total_q_of(c)), rng);
    }
  }
}

// The CPU reference's verdict on c: its error message (describe_status of the first offence),
// or "" when c is valid.
std::string cpu_verdict(const Case& c) {
  std::vector<int64_t> key_len;
  for (size_t b = 0; b + 1 < c.cu_k.size(); ++b) key_len.push_back(c.cu_k[b + 1] - c.cu_k[b]);
  const HostTensor cu_q = i32_tensor(c.cu_q);
  const HostTensor q2k = q2k_tensor(c.q2k, c.hkv, total_q_of(c), c.topk);
  try {
    cpu::check_q2k_ids(q2k.t, cpu::batch_geometry(cu_q.t, key_len, c.blk));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string gpu_verdict(const std::vector<int32_t>& st) {
  return st[0] == 0 ? "" : describe_status(st.data());
}

// The in-range ids of each head (what valid_per_head counts, repeats included).
std::vector<int32_t> host_valid_per_head(const Case& c) {
  std::vector<int32_t> v(size_t(c.hkv), 0);
  for (int64_t h = 0; h < c.hkv; ++h)
    for (int64_t t = 0; t < total_q_of(c); ++t) {
      const int64_t nblk = nblk_of(c, t);
      for (int64_t s = 0; s < c.topk; ++s) {
        const int32_t id = c.q2k[(h * total_q_of(c) + t) * c.topk + s];
        v[h] += id >= 0 && id < nblk;
      }
    }
  return v;
}

// The device check of c against the CPU reference: the same first offence (or none), and the
// exact valid_per_head counts.
void expect_matches_reference(const Case& c) {
  std::vector<int32_t> valid;
  const auto st = run_check(c, &valid);
  EXPECT_EQ(gpu_verdict(st), cpu_verdict(c));
  EXPECT_EQ(valid, host_valid_per_head(c));
}

struct LongRowConfig {
  int64_t topk, blk;
  Order order;
};

std::vector<LongRowConfig> long_row_configs() {
  std::vector<LongRowConfig> cfgs;
  for (int64_t topk : {2048, 5000})
    for (int64_t blk : {1, 64})
      for (Order order : {Order::ascending, Order::interleaved, Order::shuffled})
        cfgs.push_back({topk, blk, order});
  return cfgs;
}

std::string order_name(Order order) {
  return order == Order::ascending ? "ascending" : order == Order::interleaved ? "interleaved"
                                                                              : "shuffled";
}

std::string describe(const LongRowConfig& cfg) {
  return "topk " + std::to_string(cfg.topk) + ", kv_block_size " + std::to_string(cfg.blk) + ", " +
         order_name(cfg.order);
}

// The generator and the injections do what the GPU tests below assume, by the CPU reference
// alone (runs without a device): valid cases pass, every injected case fails.
TEST(IndexChecksLongRows, GeneratedCasesAsIntended) {
  std::mt19937 rng(11);
  for (const LongRowConfig& cfg : long_row_configs()) {
    SCOPED_TRACE(describe(cfg));
    Case c = long_row_case(rng, 2, cfg.topk, cfg.blk, cfg.order);
    EXPECT_EQ(cpu_verdict(c), "");
    if (cfg.order == Order::ascending) {  // ascending, then only -1
      const int32_t* r = c.q2k.data();
      const int64_t n = std::count_if(r, r + c.topk, [](int32_t id) { return id >= 0; });
      EXPECT_TRUE(std::is_sorted(r, r + n));
      EXPECT_TRUE(std::all_of(r + n, r + c.topk, [](int32_t id) { return id == -1; }));
    }
    for (int kind = 0; kind < 5; ++kind) {
      Case bad = c;
      inject(bad, kind, rng);
      EXPECT_NE(cpu_verdict(bad), "") << "kind " << kind;
    }
  }
}

TEST(IndexChecksGpu, LongRowsValid) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (const LongRowConfig& cfg : long_row_configs()) {
    SCOPED_TRACE(describe(cfg));
    expect_matches_reference(long_row_case(rng, 1 + int64_t(rng() % 3), cfg.topk, cfg.blk,
                                           cfg.order));
  }
}

TEST(IndexChecksGpu, LongRowsFirstOffence) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(13);
  const int trials = small_tests() ? 1 : 4;
  for (const LongRowConfig& cfg : long_row_configs())
    for (int kind = 0; kind < 5; ++kind)
      for (int trial = 0; trial < trials; ++trial) {
        SCOPED_TRACE(describe(cfg) + ", kind " + std::to_string(kind) + ", trial " +
                     std::to_string(trial));
        Case c = long_row_case(rng, 1 + int64_t(rng() % 3), cfg.topk, cfg.blk, cfg.order);
        inject(c, kind, rng);
        expect_matches_reference(c);
      }
}

// A repeat at a chosen slot of an ascending row (the row kernel then leaves its ascending path),
// just before an out-of-range id, and the reverse; at the first and last slots too.
TEST(IndexChecksGpu, LongRowsRepeatAgainstOutOfRange) {
  MSA_REQUIRE_GPU();
  for (int64_t topk : {2048, 5000}) {
    Case c;
    c.cu_q = {0, 2};
    c.cu_k = {0, int32_t(2 * topk)};
    c.hkv = 2;
    c.topk = topk;
    c.blk = 1;
    c.q2k.resize(size_t(2 * 2 * topk));
    for (int64_t row = 0; row < 4; ++row)
      for (int64_t s = 0; s < topk; ++s) c.q2k[row * topk + s] = int32_t(2 * s);
    for (int64_t s : {int64_t(1), int64_t(777), topk - 2}) {
      SCOPED_TRACE("topk " + std::to_string(topk) + ", slot " + std::to_string(s));
      Case a = c;  // repeat at s, out of range at s + 1: the repeat
      slot_of(a, 1, 0, s) = slot_of(a, 1, 0, 0);
      slot_of(a, 1, 0, s + 1) = int32_t(2 * topk);
      expect_status(run_check(a), StatusCode::block_id_repeated, 1, 0, int32_t(s));
      Case b = c;  // out of range at s, repeat at s + 1: the out-of-range id
      slot_of(b, 1, 0, s) = -5;
      slot_of(b, 1, 0, s + 1) = slot_of(b, 1, 0, s - 1);
      expect_status(run_check(b), StatusCode::block_id_out_of_range, 1, 0, int32_t(s));
      Case d = c;  // a repeat in head 0's second token beats an out-of-range id in head 1
      slot_of(d, 0, 1, topk - 1) = slot_of(d, 0, 1, s);
      slot_of(d, 1, 0, 0) = INT_MAX;
      expect_status(run_check(d), StatusCode::block_id_repeated, 0, 1, int32_t(topk - 1));
    }
    Case e = c;  // a repeat of the first slot's id at the last slot, with -1 between
    for (int64_t s = 1; s < topk - 1; s += 2) slot_of(e, 0, 0, s) = -1;
    slot_of(e, 0, 0, topk - 1) = slot_of(e, 0, 0, 0);
    expect_status(run_check(e), StatusCode::block_id_repeated, 0, 0, int32_t(topk - 1));
    expect_matches_reference(e);
  }
}

// The row kernel's edges: topk just above the staged kernel's limit, and its largest sort buffer.
TEST(IndexChecksGpu, LongRowsKernelEdges) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(14);
  for (int64_t topk : {257, 16384})
    for (Order order : {Order::ascending, Order::shuffled})
      for (int kind = -1; kind < 5; ++kind) {
        SCOPED_TRACE("topk " + std::to_string(topk) + ", " + order_name(order) + ", kind " +
                     std::to_string(kind));
        Case c = long_row_case(rng, 2, topk, 1, order);
        if (kind >= 0) inject(c, kind, rng);
        expect_matches_reference(c);
      }
}

// Rows above the row kernel's cap (16384 slots) take the one-thread-per-row kernel; few in-range
// ids a row keep its quadratic repeat test short.
TEST(IndexChecksGpu, RowsAboveRowKernelCap) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(15);
  const int64_t topk = 16385;
  for (Order order : {Order::ascending, Order::shuffled})
    for (int kind = -1; kind < 5; ++kind) {
      SCOPED_TRACE(order_name(order) + ", kind " + std::to_string(kind));
      Case c = long_row_case(rng, 2, topk, 64, order, /*max_nblk=*/64);
      if (kind >= 0) inject(c, kind, rng);
      expect_matches_reference(c);
    }
}

// Long rows under corrupt cu_seqlens: the cu_seqlens offence is reported and nothing is read out
// of bounds (compute-sanitizer), whatever key counts the corrupt entries give the rows.
TEST(IndexChecksGpu, LongRowsBadCuSeqlens) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(16);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "cu_seqlens_q" : "cu_seqlens_k");
    Case c = long_row_case(rng, 2, 2048, 1, Order::shuffled);
    inject(c, 2, rng);
    std::vector<int32_t>& cu = which == 0 ? c.cu_q : c.cu_k;
    cu[1] = cu.back() + 5000;  // batch 0 longer than all, batch 1 negative
    const auto st = run_check(c);
    EXPECT_EQ(st[0], int32_t(StatusCode::bad_cu_seqlens)) << describe_status(st.data());
    EXPECT_EQ(std::make_tuple(st[1], st[2]), std::make_tuple(which, 2));
  }
}

}  // namespace
}  // namespace msa::test
