// GPU tests of the device-side index checks (src/cuda/common/index_checks.cu): the first bad
// q2k id or cu_seqlens entry lands in the status buffer, the status message names (head, token,
// slot), and nothing is read out of bounds (run under compute-sanitizer on the GPU machine).
#include <algorithm>
#include <climits>
#include <random>

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

// Runs the device check and returns the status words.
std::vector<int32_t> run_check(const Case& c) {
  TestStream stream;
  const int64_t batch = int64_t(c.cu_q.size()) - 1, total_q = c.cu_q.back();
  DeviceBuffer q2k(std::max<size_t>(4, c.q2k.size() * 4)), cuq(c.cu_q.size() * 4),
      cuk(c.cu_k.size() * 4), ws(kQ2KCheckWorkspaceBytes), status(16);
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
  launch_q2k_check(p, ws.get(), static_cast<int32_t*>(status.get()), stream);
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

}  // namespace
}  // namespace msa::test
