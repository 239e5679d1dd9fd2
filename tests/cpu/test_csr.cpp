// CPU k2q CSR builder, schedule and reference converters (docs/semantics.md, k2q CSR;
// include/msa/csr.h): a hand-built index, brute-force row contents, round trips, edge shapes and
// every input rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>

#include "common/schedule.h"
#include "support/attention_problem.h"

namespace msa::test {
namespace {

struct Csr {
  HostTensor row_ptr, q_idx, schedule;
};

// Fills an int32 tensor with a value no output may hold (HostTensor's own poison is -1, a
// legal padding value here).
void poison(const HostTensor& t) {
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.t.numel(), 0x5a5a5a5a);
}

// Output buffers (poisoned) for a problem with `rows` CSR rows; the schedule at its bound.
Csr make_csr(int64_t hkv, int64_t rows, int64_t total_q, int64_t topk) {
  Csr c{HostTensor(DType::i32, {hkv, rows + 1}), HostTensor(DType::i32, {hkv, total_q * topk}),
        HostTensor(DType::i32, {k2q_schedule_size(hkv, rows, total_q, topk)})};
  poison(c.row_ptr);
  poison(c.q_idx);
  poison(c.schedule);
  return c;
}

CsrBuildArgs csr_args(const Tensor& q2k, const Tensor& cu_q, const KVCache& kv, int blk,
                      const Csr& c, bool schedule = true) {
  CsrBuildArgs a;
  a.q2k = q2k;
  a.cu_seqlens_q = cu_q;
  a.kv = kv;
  a.kv_block_size = blk;
  a.out.row_ptr = c.row_ptr.t;
  a.out.q_idx = c.q_idx.t;
  if (schedule) a.out.schedule = c.schedule.t;
  return a;
}

std::vector<int32_t> values(const HostTensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.t.numel());
}

int64_t total_rows(const std::vector<int32_t>& lk, int64_t blk) {
  int64_t r = 0;
  for (int32_t l : lk) r += (l + blk - 1) / blk;
  return r;
}

// The hand-built case: B = 2, Lq = {3, 2}, Lk = {300, 130}, blk 128 -> nblk = {3, 2}, 5 rows.
const std::vector<int32_t> kHandQ2K = {
    // head 0: t0 .. t4 (t3, t4 are batch 1's queries 0, 1)
    0, -1, 2, 0, -1, 1, 1, -1, 0, 1,
    // head 1
    -1, -1, 1, -1, -1, -1, -1, -1, -1, 1};

void expect_hand_csr(const Csr& c) {
  // Head 0: row 0 = (b0, kb0) <- t0, t1; row 1 <- t2; row 2 <- t1; row 3 = (b1, kb0) <- t4
  // (local 1); row 4 <- t3, t4 (local 0, 1). Head 1: row 1 <- t1; row 4 <- t4 (local 1).
  EXPECT_EQ(values(c.row_ptr), (std::vector<int32_t>{0, 2, 3, 4, 5, 7, 0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(values(c.q_idx), (std::vector<int32_t>{0, 1, 2, 1, 1, 0, 1, -1, -1, -1,
                                                   1, 1, -1, -1, -1, -1, -1, -1, -1, -1}));
  const std::vector<int32_t> sched = values(c.schedule);
  const std::vector<int32_t> want = {sched::kMagic, 7, 0, 0, 0, 2, 0, 1, 2, 3, 0, 2, 3, 4,
                                     0, 3, 4, 5, 0, 4, 5, 7, 1, 1, 0, 1, 1, 4, 1, 2};
  EXPECT_EQ(std::vector<int32_t>(sched.begin(), sched.begin() + want.size()), want);
}

TEST(Csr, HandBuiltFlatLengthsOnly) {
  const HostTensor q2k = q2k_tensor(kHandQ2K, 2, 5, 2);
  const HostTensor cu_q = i32_tensor({0, 3, 5}), cu_k = i32_tensor({0, 300, 430});
  KVCache kv;  // only the lengths: no k / v tensors
  kv.cu_seqlens_k = cu_k.t;
  const Csr c = make_csr(2, 5, 5, 2);
  build_k2q_csr(csr_args(q2k.t, cu_q.t, kv, 128, c));
  expect_hand_csr(c);
}

TEST(Csr, HandBuiltPagedLengths) {
  const HostTensor q2k = q2k_tensor(kHandQ2K, 2, 5, 2);
  const HostTensor cu_q = i32_tensor({0, 3, 5}), seqused = i32_tensor({300, 130});
  HostTensor pool(DType::bf16, {10, 64, 2, 8}), pt(DType::i32, {2, 5});
  KVCache kv;
  kv.layout = KVLayout::paged_nhd;
  kv.k = pool.t;
  kv.page_table = pt.t;  // its ids are not read: only lengths matter
  kv.seqused_k = seqused.t;
  const Csr c = make_csr(2, 5, 5, 2);
  build_k2q_csr(csr_args(q2k.t, cu_q.t, kv, 128, c));
  expect_hand_csr(c);
}

// Row contents by brute force: the queries of batch b whose q2k row holds kb, ascending.
void expect_rows_match_q2k(const Problem& p, const std::vector<int32_t>& q2k, int64_t topk,
                           int64_t blk, const Csr& c) {
  const int64_t rows = total_rows(p.lk, blk), tq = p.total_q();
  for (int64_t h = 0; h < p.hkv; ++h) {
    const int32_t* rp = c.row_ptr.data<int32_t>() + h * (rows + 1);
    const int32_t* qi = c.q_idx.data<int32_t>() + h * tq * topk;
    ASSERT_EQ(rp[0], 0);
    int64_t r = 0;
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int64_t kb = 0; kb < (p.lk[b] + blk - 1) / blk; ++kb, ++r) {
        std::vector<int32_t> want;
        for (int64_t i = 0; i < p.lq[b]; ++i) {
          const int32_t* row = &q2k[(h * tq + p.q_start(b) + i) * topk];
          if (std::find(row, row + topk, kb) != row + topk) want.push_back(int32_t(i));
        }
        EXPECT_EQ(std::vector<int32_t>(qi + rp[r], qi + rp[r + 1]), want) << "head " << h << " row " << r;
      }
    for (int64_t i = rp[rows]; i < tq * topk; ++i) EXPECT_EQ(qi[i], -1) << "tail of head " << h;
  }
}

struct RoundTripCase {
  std::vector<int32_t> lq, lk;
  int64_t hkv, topk, blk;
  bool sorted;
};

TEST(Csr, RandomMatchesBruteForceAndRoundTrips) {
  const std::vector<RoundTripCase> cases = {
      {{37, 0, 64}, {1000, 5, 0}, 2, 4, 128, true},
      {{50}, {700}, 1, 16, 64, false},  // topk above the number of blocks; ids in random slots
      {{1, 2, 3, 4, 5}, {129, 128, 127, 1, 256}, 4, 2, 128, false},
      {{16, 16}, {4000, 3000}, 2, 8, 64, true},
  };
  unsigned seed = 11;
  for (const RoundTripCase& c : cases) {
    const Problem p = make_problem(c.lq, c.lk, c.hkv, c.hkv, 8, seed++);
    const std::vector<int32_t> ids = random_q2k(p, c.topk, c.blk, seed++, c.sorted);
    const HostTensor q2k = q2k_tensor(ids, c.hkv, p.total_q(), c.topk);
    const int64_t rows = total_rows(c.lk, c.blk);
    const Csr csr = make_csr(c.hkv, rows, p.total_q(), c.topk);
    build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), int(c.blk), csr));
    expect_rows_match_q2k(p, ids, c.topk, c.blk, csr);

    // Back to q2k: each row ascending and -1 padded, i.e. the input with its rows normalized.
    HostTensor back(DType::i32, {c.hkv, p.total_q(), c.topk});
    poison(back);
    k2q_to_q2k_cpu(csr.row_ptr.t, csr.q_idx.t, p.cu_q.t, p.flat_kv(), int(c.blk), back.t);
    std::vector<int32_t> want = ids;
    for (size_t r = 0; r < want.size(); r += c.topk) {
      auto row = want.begin() + r;
      std::stable_partition(row, row + c.topk, [](int32_t x) { return x >= 0; });
      std::sort(row, std::find(row, row + c.topk, -1));
    }
    EXPECT_EQ(values(back), want);

    // The public converter gives the builder's CSR.
    const Csr again = make_csr(c.hkv, rows, p.total_q(), c.topk);
    q2k_to_k2q_cpu(back.t, p.cu_q.t, p.flat_kv(), int(c.blk), again.row_ptr.t, again.q_idx.t);
    EXPECT_EQ(values(again.row_ptr), values(csr.row_ptr));
    EXPECT_EQ(values(again.q_idx), values(csr.q_idx));
  }
}

TEST(Csr, ScheduleCoversEveryNonEmptyRowOnce) {
  const Problem p = make_problem({20, 7, 0}, {900, 64, 300}, 4, 4, 8, 5);
  const std::vector<int32_t> ids = random_q2k(p, 3, 128, 6);
  const HostTensor q2k = q2k_tensor(ids, 4, p.total_q(), 3);
  const int64_t rows = total_rows(p.lk, 128);
  const Csr c = make_csr(4, rows, p.total_q(), 3);
  EXPECT_EQ(c.schedule.t.numel(), 2 + 4 * 4 * rows);
  build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), 128, c));
  const int32_t* s = c.schedule.data<int32_t>();
  const int32_t* rp = c.row_ptr.data<int32_t>();
  ASSERT_EQ(s[0], sched::kMagic);
  std::set<std::pair<int, int>> seen;
  for (int32_t i = 0; i < s[1]; ++i) {
    const int32_t* w = s + 2 + 4 * i;
    ASSERT_TRUE(w[0] >= 0 && w[0] < 4 && w[1] >= 0 && w[1] < rows);
    EXPECT_TRUE(seen.insert({w[0], w[1]}).second);
    EXPECT_EQ(w[2], rp[w[0] * (rows + 1) + w[1]]);
    EXPECT_EQ(w[3], rp[w[0] * (rows + 1) + w[1] + 1]);
    EXPECT_GT(w[3], w[2]);
  }
  int64_t non_empty = 0;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t r = 0; r < rows; ++r) non_empty += rp[h * (rows + 1) + r + 1] > rp[h * (rows + 1) + r];
  EXPECT_EQ(s[1], non_empty);
}

TEST(Csr, EmptyShapes) {
  // B = 0: no tokens, no rows.
  {
    const HostTensor q2k(DType::i32, {2, 0, 4}), cu = i32_tensor({0});
    KVCache kv;
    kv.cu_seqlens_k = cu.t;
    const Csr c = make_csr(2, 0, 0, 4);
    build_k2q_csr(csr_args(q2k.t, cu.t, kv, 128, c));
    EXPECT_EQ(values(c.row_ptr), (std::vector<int32_t>{0, 0}));
    EXPECT_EQ(c.schedule.data<int32_t>()[1], 0);
  }
  // Lq = 0 and Lk = 0 batches, rows all -1.
  {
    const Problem p = make_problem({0, 3, 2}, {200, 0, 10}, 1, 1, 8, 3);
    const HostTensor q2k = q2k_tensor(std::vector<int32_t>(5 * 2, -1), 1, 5, 2);
    const Csr c = make_csr(1, 3, 5, 2);
    build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), 128, c));
    EXPECT_EQ(values(c.row_ptr), (std::vector<int32_t>{0, 0, 0, 0}));
    EXPECT_EQ(values(c.q_idx), std::vector<int32_t>(10, -1));
    EXPECT_EQ(c.schedule.data<int32_t>()[1], 0);
  }
}

// (head 1, token 3, slot 2) gets `bad`; a later offence must not be the one reported.
TEST(Csr, OutOfRangeIdsNameHeadTokenSlot) {
  const Problem p = make_problem({3, 4}, {500, 200}, 2, 2, 8, 9);  // nblk = {4, 2}
  const int64_t topk = 3, tq = p.total_q();
  const std::vector<int32_t> valid = random_q2k(p, topk, 128, 10);
  const int32_t nblk = 2;  // token 3 is batch 1's first query
  for (int32_t bad : {INT_MIN, -123456, -2, nblk, nblk + 1000, INT_MAX}) {
    std::vector<int32_t> ids = valid;
    ids[(1 * tq + 3) * topk + 2] = bad;
    ids[(1 * tq + 5) * topk + 0] = -7;
    const HostTensor q2k = q2k_tensor(ids, 2, tq, topk);
    const Csr c = make_csr(2, 6, tq, topk);
    expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), 128, c)); },
                 "q2k: block id out of range at (head 1, token 3, slot 2)");
  }
  // An id valid for batch 0 (4 blocks) is out of range in batch 1; Lk = 0 has no valid id.
  std::vector<int32_t> ids = valid;
  ids[(0 * tq + 4) * topk + 1] = 3;
  const HostTensor q2k = q2k_tensor(ids, 2, tq, topk);
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), 128, make_csr(2, 6, tq, topk))); },
               "q2k: block id out of range at (head 0, token 4, slot 1)");
  const Problem z = make_problem({2}, {0}, 1, 1, 8, 12);
  const HostTensor zq = q2k_tensor({-1, 0}, 1, 2, 1);
  expect_error([&] { build_k2q_csr(csr_args(zq.t, z.cu_q.t, z.flat_kv(), 128, make_csr(1, 0, 2, 1))); },
               "q2k: block id out of range at (head 0, token 1, slot 0)");
}

TEST(Csr, RepeatedIdNamesTheLaterSlot) {
  const Problem p = make_problem({4}, {600}, 1, 1, 8, 13);
  // Token 1 repeats block 2 at slot 3 (-1 repeats are fine); token 2's later out-of-range id
  // comes after it in (head, token, slot) order.
  const HostTensor q2k = q2k_tensor({0, -1, -1, -1, 2, -1, 1, 2, 9, 0, 1, 3, 4, 3, 2, 1}, 1, 4, 4);
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, p.flat_kv(), 128, make_csr(1, 5, 4, 4))); },
               "q2k: block id repeated within a row at (head 0, token 1, slot 3)");
}

TEST(Csr, InputRules) {
  const Problem p = make_problem({3, 2}, {300, 100}, 2, 2, 8, 14);
  const int64_t topk = 2, tq = p.total_q();
  const HostTensor q2k = q2k_tensor(random_q2k(p, topk, 128, 15), 2, tq, topk);
  const Csr c = make_csr(2, 4, tq, topk);
  const KVCache kv = p.flat_kv();
  build_k2q_csr(csr_args(q2k.t, p.cu_q.t, kv, 128, c));  // the valid baseline

  HostTensor f32(DType::f32, {2, tq, topk});
  expect_error([&] { build_k2q_csr(csr_args(f32.t, p.cu_q.t, kv, 128, c)); },
               "q2k: dtype must be i32, got f32");
  const HostTensor bad_cu = i32_tensor({0, 4, 3, 5});
  const Csr c3 = make_csr(2, 4, tq, topk);
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, bad_cu.t, kv, 128, c3)); },
               "cu_seqlens_q: must be non-decreasing");
  const Csr too_few_rows = make_csr(2, 3, tq, topk);
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, kv, 128, too_few_rows)); },
               "out.row_ptr: second dim must be at least total_rows + 1 = 5");
  HostTensor short_idx(DType::i32, {2, tq * topk - 1});
  CsrBuildArgs a = csr_args(q2k.t, p.cu_q.t, kv, 128, c);
  a.out.q_idx = short_idx.t;
  expect_error([&] { build_k2q_csr(a); }, "out.q_idx: shape must be [2, 10]");
  HostTensor small_sched(DType::i32, {2 + 4 * 2 * 4 - 1});
  a = csr_args(q2k.t, p.cu_q.t, kv, 128, c);
  a.out.schedule = small_sched.t;
  expect_error([&] { build_k2q_csr(a); }, "out.schedule: needs at least k2q_schedule_size(...) = 34");
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, kv, 32, c)); },
               "kv_block_size: must be 64 or 128, got 32");
  HostTensor q2k_heads(DType::i32, {0, tq, topk});
  expect_error([&] { build_k2q_csr(csr_args(q2k_heads.t, p.cu_q.t, kv, 128, c)); },
               "q2k: shape must be [Hkv, total_q, topk] with Hkv >= 1 and topk >= 1");
  KVCache paged;  // paged without k: the page size is unknown
  paged.layout = KVLayout::paged_nhd;
  const HostTensor pt(DType::i32, {2, 3});
  paged.page_table = pt.t;
  expect_error([&] { build_k2q_csr(csr_args(q2k.t, p.cu_q.t, paged, 128, c)); },
               "k: required for a paged KV cache");
}

// total_rows may be an upper bound (what a caller can size without reading the lengths): the
// rows past sum_b nblk_b come out empty, the real rows and the schedule are unchanged, and the
// converter and attention take the padded index.
TEST(Csr, UpperBoundRowsArePaddedWithEmptyRows) {
  const Problem p = make_problem({3, 2}, {300, 100}, 2, 2, 8, 14);
  const int64_t topk = 2, tq = p.total_q(), rows = 4, bound = (300 + 100) / 128 + 2;
  const HostTensor q2k = q2k_tensor(random_q2k(p, topk, 128, 15), 2, tq, topk);
  const KVCache kv = p.flat_kv();
  const Csr exact = make_csr(2, rows, tq, topk), padded = make_csr(2, bound, tq, topk);
  build_k2q_csr(csr_args(q2k.t, p.cu_q.t, kv, 128, exact));
  build_k2q_csr(csr_args(q2k.t, p.cu_q.t, kv, 128, padded));
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t r = 0; r <= bound; ++r)
      EXPECT_EQ(padded.row_ptr.data<int32_t>()[h * (bound + 1) + r],
                exact.row_ptr.data<int32_t>()[h * (rows + 1) + std::min(r, rows)])
          << "head " << h << " row " << r;
  }
  EXPECT_EQ(std::memcmp(padded.q_idx.t.data, exact.q_idx.t.data, exact.q_idx.bytes()), 0);
  EXPECT_EQ(std::memcmp(padded.schedule.t.data, exact.schedule.t.data, exact.schedule.bytes()), 0);
  HostTensor back(DType::i32, {2, tq, topk});
  k2q_to_q2k_cpu(padded.row_ptr.t, padded.q_idx.t, p.cu_q.t, kv, 128, back.t);
  HostTensor want(DType::i32, {2, tq, topk});
  k2q_to_q2k_cpu(exact.row_ptr.t, exact.q_idx.t, p.cu_q.t, kv, 128, want.t);
  EXPECT_EQ(std::memcmp(back.t.data, want.t.data, want.bytes()), 0);
  // A padded row that is not empty is malformed.
  padded.row_ptr.data<int32_t>()[bound] += 1;
  expect_error([&] { k2q_to_q2k_cpu(padded.row_ptr.t, padded.q_idx.t, p.cu_q.t, kv, 128, back.t); },
               "lies past the 4 rows of the batches' blocks and must be empty");
}

TEST(Csr, ConverterRejectsMalformedCsr) {
  const Problem p = make_problem({2}, {200}, 1, 1, 8, 16);  // 2 rows
  HostTensor rp = i32_tensor({0, 1, 2}), qi(DType::i32, {1, 2}), q2k(DType::i32, {1, 2, 1});
  rp.t = Tensor(rp.t.data, DType::i32, {1, 3});
  qi.data<int32_t>()[0] = 0;
  qi.data<int32_t>()[1] = 2;  // batch 0 has 2 queries: id 2 is out of range
  expect_error([&] { k2q_to_q2k_cpu(rp.t, qi.t, p.cu_q.t, p.flat_kv(), 128, q2k.t); },
               "q_idx: query id 2 at (head 0, row 1) outside [0, 2)");
  qi.data<int32_t>()[1] = 0;  // token 0 now has 2 blocks, topk = 1
  expect_error([&] { k2q_to_q2k_cpu(rp.t, qi.t, p.cu_q.t, p.flat_kv(), 128, q2k.t); },
               "more than topk = 1 blocks");
}

}  // namespace
}  // namespace msa::test
