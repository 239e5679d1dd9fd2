// GPU k2q CSR + schedule builder (src/cuda/common/csr_build.cu) against the CPU builder: row_ptr,
// q_idx (with its -1 tail) and the schedule identical, over random varlen selections and with a
// row count past the batches' blocks (an upper bound: empty rows); bad ids and too few rows are
// reported through the status buffer.
#include <cstring>

#include "support/sparse_case.h"

namespace msa::test {
namespace {

struct Csr {
  HostTensor row_ptr, q_idx, schedule;
};

Csr make_csr(int64_t hkv, int64_t rows, int64_t tq, int64_t topk) {
  return Csr{HostTensor(DType::i32, {hkv, rows + 1}), HostTensor(DType::i32, {hkv, tq * topk}),
             HostTensor(DType::i32, {k2q_schedule_size(hkv, rows, tq, topk)})};
}

// rows: the row count of row_ptr (c.total_rows, or an upper bound of it).
Csr build_cpu(const SparseCase& c, int64_t rows) {
  Csr o = make_csr(c.p.hkv, rows, c.p.total_q(), c.topk);
  CsrBuildArgs a;
  a.q2k = c.q2k.t;
  a.cu_seqlens_q = c.p.cu_q.t;
  a.kv = c.p.flat_kv();
  a.out = K2QIndex{o.row_ptr.t, o.q_idx.t, o.schedule.t};
  build_k2q_csr(a);
  return o;
}

// rows: the row count passed to the GPU builder (normally c.total_rows).
Csr build_gpu(const SparseCase& c, int64_t rows, cudaStream_t s) {
  Csr host = make_csr(c.p.hkv, rows, c.p.total_q(), c.topk);
  DeviceTensor q2k = to_device(c.q2k, s), cu_q = to_device(c.p.cu_q, s),
               cu_k = to_device(c.p.cu_k, s);
  DeviceTensor rp = device_like(host.row_ptr, s), qi = device_like(host.q_idx, s),
               sc = device_like(host.schedule, s);
  DeviceBuffer status(16);
  const Tensor st(status.get(), DType::i32, {4}, gpu0());
  clear_status(st, s);
  CsrBuildArgs a;
  a.q2k = q2k.t;
  a.cu_seqlens_q = cu_q.t;
  a.kv.cu_seqlens_k = cu_k.t;  // lengths only: no k tensor
  a.out = K2QIndex{rp.t, qi.t, sc.t};
  const size_t need = csr_workspace_bytes(c.p.hkv, rows, c.p.total_q(), c.topk);
  DeviceBuffer ws(std::max<size_t>(need, 256));
  ws.poison(s);
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(need)}, gpu0());
  a.status = st;
  build_k2q_csr(a, s);
  copy_to_host(rp, host.row_ptr, s);
  copy_to_host(qi, host.q_idx, s);
  copy_to_host(sc, host.schedule, s);
  check_status(st, s);
  return host;
}

void expect_same(const Csr& g, const Csr& r) {
  EXPECT_EQ(std::memcmp(g.row_ptr.t.data, r.row_ptr.t.data, r.row_ptr.bytes()), 0) << "row_ptr";
  EXPECT_EQ(std::memcmp(g.q_idx.t.data, r.q_idx.t.data, r.q_idx.bytes()), 0) << "q_idx";
  const int32_t n_items = r.schedule.data<int32_t>()[1];
  EXPECT_EQ(std::memcmp(g.schedule.t.data, r.schedule.t.data, size_t(2 + 4 * n_items) * 4), 0)
      << "schedule (" << n_items << " items)";
}

TEST(CsrBuildGpu, RandomMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 6 : 60); ++i) {
    const SparseCase c = random_case(1000 + i, small, /*fill_inputs=*/false);  // indices only
    SCOPED_TRACE(c.name);
    expect_same(build_gpu(c, c.total_rows, s), build_cpu(c, c.total_rows));
    if (HasFailure()) break;
  }
}

// The benchmark shape's selection (every token: sink, diagonal, previous, random), S = 8192.
TEST(CsrBuildGpu, TokPatternMatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const int32_t len = small_tests() ? 700 : 8192;
  std::mt19937 rng(3);
  Problem prob = make_problem({len}, {len}, 4, 4, 128, 3u);
  HostTensor ids = indexer_like_q2k(prob, 16, true, rng);
  const SparseCase c(std::move(prob), std::move(ids), 16);
  expect_same(build_gpu(c, c.total_rows, s), build_cpu(c, c.total_rows));
}

TEST(CsrBuildGpu, ErrorsReportedThroughStatus) {
  MSA_REQUIRE_GPU();
  TestStream s;
  std::mt19937 rng(9);
  Problem prob = make_problem({50, 0, 260}, {200, 10, 300}, 2, 2, 128, 9u);
  HostTensor ids = indexer_like_q2k(prob, 5, true, rng);
  SparseCase c(std::move(prob), std::move(ids), 5);
  // More rows than the batches' blocks: the extra rows are empty, as on the CPU.
  expect_same(build_gpu(c, c.total_rows + 3, s), build_cpu(c, c.total_rows + 3));
  // Too few rows: the builder must flag it and stay inside row_ptr.
  expect_error([&] { build_gpu(c, c.total_rows - 1, s); },
               "row_ptr: has " + std::to_string(c.total_rows - 1) + " rows, fewer than the " +
                   std::to_string(c.total_rows) + " kv blocks");
  const int32_t bad_ids[] = {INT32_MIN, -123456, -2, 2, 1002, INT32_MAX};
  for (int32_t bad : bad_ids) {
    const int64_t at = ((1 * c.p.total_q()) + 30) * c.topk + 1;  // (head 1, token 30, slot 1)
    const int32_t keep = c.q2k.data<int32_t>()[at];
    c.q2k.data<int32_t>()[at] = bad;
    expect_error([&] { build_gpu(c, c.total_rows, s); }, "(head 1, token 30, slot 1)");
    c.q2k.data<int32_t>()[at] = keep;
  }
  // All ids of a row invalid, and a repeat.
  for (int64_t sl = 0; sl < c.topk; ++sl) c.q2k.data<int32_t>()[(0 * c.p.total_q() + 60) * c.topk + sl] = 7777;
  expect_error([&] { build_gpu(c, c.total_rows, s); }, "(head 0, token 60, slot 0)");
}

}  // namespace
}  // namespace msa::test
