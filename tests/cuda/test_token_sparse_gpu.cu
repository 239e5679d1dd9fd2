// CUDA token_sparse_kv_indices and group_union_masks (src/cuda/common/token_sparse_slots.cu,
// group_union.cu) against the CPU reference on the same inputs: random rows with -1 anywhere,
// unsorted, empty rows and requests, rows = 0, K = 2048, per-kv-head positions, strided paged
// tables with page ids near the int32 slot limit, bool and packed masks, spare group and union
// capacity. Then every offence with its exact status words (the first in the CPU's order, not the
// first to arrive), a buffer already holding an offence left alone, a 4-byte aligned buffer, and
// both ops captured in a CUDA graph and replayed on new inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "msa/msa.h"
#include "support/device_tensor.h"
#include "support/gpu_test_util.h"
#include "support/host_tensor.h"
#include "support/token_sparse_case.h"

namespace msa::test {
namespace {

// A status buffer on the device, cleared; `offset_words` = 1 places it 4 bytes into its
// allocation (only 4-byte aligned: the offence key then lives in words 1-2).
struct Status {
  DeviceBuffer buf{32};
  Tensor t;
  explicit Status(cudaStream_t s, int offset_words = 0) {
    buf.fill(0, s);
    t = Tensor(static_cast<int32_t*>(buf.get()) + offset_words, DType::i32, {4}, gpu0());
  }
  std::vector<int32_t> read(cudaStream_t s) const {
    std::vector<int32_t> w(4);
    MSA_CUDA_CHECK(cudaMemcpyAsync(w.data(), t.data, 16, cudaMemcpyDeviceToHost, s));
    MSA_CUDA_CHECK(cudaStreamSynchronize(s));
    return w;
  }
};

// ---- token_sparse_kv_indices ----

struct Slots {
  HostTensor positions{DType::i32, {0}}, requests{DType::i32, {0}}, table{DType::i32, {0, 0}},
      seq_lens{DType::i32, {0}};
  int64_t page_size = 1;
  bool with_lens = true;
};

// rows requests of lengths up to max_len over `batch` requests; page ids spread up to `top`
// (distinct, so that a wrong column shows), the table's rows `pad` wider than W.
Slots slots_problem(uint32_t seed, int64_t heads, int64_t rows, int64_t k, int64_t max_len,
                    int64_t top = 0, int64_t pad = 0) {
  std::mt19937 rng(seed);
  Slots s;
  const int64_t batch = 1 + rng() % 4;
  s.page_size = std::vector<int64_t>{1, 16, 64, 128}[rng() % 4];
  std::vector<int32_t> lens(batch);
  for (auto& l : lens) l = int32_t(rng() % (max_len + 1));
  const int64_t width = (max_len + s.page_size - 1) / s.page_size + rng() % 2;
  const int64_t pages = batch * width;
  const int64_t max_page = top > 0 ? top : pages;  // ids in [0, max_page)
  s.table = HostTensor(DType::i32, {batch, width}, {width + pad, 1});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t w = 0; w < width; ++w)
      s.table.data<int32_t>()[b * (width + pad) + w] =
          int32_t(max_page - 1 - (b * width + w) * (max_page / std::max<int64_t>(pages, 1)));
  std::vector<int32_t> req(rows), row_len(rows);
  for (int64_t t = 0; t < rows; ++t) {
    req[t] = int32_t(rng() % batch);
    row_len[t] = lens[req[t]];
  }
  const std::vector<int64_t> shape = heads ? std::vector<int64_t>{heads, rows, k}
                                           : std::vector<int64_t>{rows, k};
  s.positions = HostTensor(DType::i32, shape);
  fill(s.positions, random_positions(rng, row_len, heads ? heads : 1, k));
  s.requests = i32_tensor(req);
  s.seq_lens = i32_tensor(lens);
  s.with_lens = seed % 3 != 0;
  return s;
}

TokenSparseKvIndicesArgs slots_args(const Slots& s, const Tensor& out) {
  TokenSparseKvIndicesArgs a;
  a.positions = s.positions.t;
  a.requests = s.requests.t;
  a.block_table = s.table.t;
  a.page_size = s.page_size;
  if (s.with_lens) a.seq_lens = s.seq_lens.t;
  a.slots = out;
  return a;
}

std::vector<int32_t> slots_cpu(const Slots& s) {
  HostTensor out(DType::i32, std::vector<int64_t>(s.positions.t.shape,
                                                  s.positions.t.shape + s.positions.t.ndim));
  token_sparse_kv_indices(slots_args(s, out.t));
  return values(out);
}

// The GPU's slots and status words (poisoned output first).
std::vector<int32_t> slots_gpu(const Slots& s, cudaStream_t stream, std::vector<int32_t>& st,
                               int status_offset = 0, const std::vector<int32_t>& preset = {}) {
  const DeviceTensor pos = to_device(s.positions, stream), req = to_device(s.requests, stream),
                     table = to_device(s.table, stream), lens = to_device(s.seq_lens, stream);
  HostTensor out(DType::i32, std::vector<int64_t>(s.positions.t.shape,
                                                  s.positions.t.shape + s.positions.t.ndim));
  const DeviceTensor dout = device_like(out, stream);
  Status status(stream, status_offset);
  if (!preset.empty())
    MSA_CUDA_CHECK(cudaMemcpyAsync(status.t.data, preset.data(), 16, cudaMemcpyHostToDevice, stream));
  TokenSparseKvIndicesArgs a;
  a.positions = pos.t;
  a.requests = req.t;
  a.block_table = table.t;
  a.page_size = s.page_size;
  if (s.with_lens) a.seq_lens = lens.t;
  a.slots = dout.t;
  a.status = status.t;
  token_sparse_kv_indices(a, stream);
  copy_to_host(dout, out, stream);
  st = status.read(stream);
  return values(out);
}

TEST(TokenSparseKvIndicesGpu, MatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  struct Shape {
    int64_t heads, rows, k, max_len, top, pad;
  };
  std::vector<Shape> shapes = {{0, 0, 8, 50, 0, 0},     {0, 5, 0, 50, 0, 0},
                               {0, 1, 1, 1, 0, 0},      {0, 37, 7, 200, 0, 3},
                               {2, 19, 33, 300, 0, 0},  {0, 64, 2048, 5000, 0, 1},
                               {4, 8, 2048, 70000, 0, 0},
                               // page ids up to the int32 slot limit of page size 128
                               {0, 16, 300, 4000, int64_t(INT32_MAX) / 128, 0}};
  if (!small_tests()) shapes.push_back({0, 512, 2048, 20000, 0, 2});
  uint32_t seed = 1;
  for (const Shape& sh : shapes) {
    for (int rep = 0; rep < 3; ++rep, ++seed) {
      Slots s = slots_problem(seed, sh.heads, sh.rows, sh.k, sh.max_len, sh.top, sh.pad);
      if (sh.top) s.page_size = 128;
      SCOPED_TRACE("seed " + std::to_string(seed) + " rows " + std::to_string(sh.rows) + " K " +
                   std::to_string(sh.k));
      const std::vector<int32_t> want = slots_cpu(s);
      std::vector<int32_t> st;
      const std::vector<int32_t> got = slots_gpu(s, stream, st);
      EXPECT_EQ(st[0], 0) << describe_status(st.data());
      ASSERT_EQ(got, want);
    }
  }
}

// A small problem to break: 2 requests, pages of 4, rows [1, -1, 3] (request 0), [2, -1, 0],
// [-1, -1, -1] (request 1).
Slots small_slots() {
  Slots s;
  s.positions = HostTensor(DType::i32, {3, 3});
  fill(s.positions, {1, -1, 3, 2, -1, 0, -1, -1, -1});
  s.requests = i32_tensor({0, 1, 1});
  s.table = HostTensor(DType::i32, {2, 3});
  fill(s.table, {5, 6, 7, 2, 9, 4});
  s.seq_lens = i32_tensor({8, 12});
  s.page_size = 4;
  s.with_lens = true;
  return s;
}

TEST(TokenSparseKvIndicesGpu, EveryOffenceWithItsStatus) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  {
    Slots s = small_slots();
    std::vector<int32_t> st;
    EXPECT_EQ(slots_gpu(s, stream, st), slots_cpu(s));
    EXPECT_EQ(st[0], 0);
  }
  struct Case {
    const char* what;
    std::function<void(Slots&)> change;
    StatusCode code;
    int32_t a, b, c;
  };
  const std::vector<Case> cases = {
      {"range", [](Slots& s) { s.positions.data<int32_t>()[5] = 12; }, StatusCode::position_out_of_range, 1, 2, 12},
      {"range below -1", [](Slots& s) { s.positions.data<int32_t>()[7] = -5; },
       StatusCode::position_out_of_range, 2, 1, -5},
      {"repeat (smallest, its second entry)",
       [](Slots& s) { fill(s.positions, {3, 1, 3, 2, 1, 1, -1, -1, -1}); s.seq_lens = i32_tensor({8, 12}); },
       StatusCode::position_repeated, 0, 3, 2},
      {"range before an earlier row's repeat",
       [](Slots& s) { fill(s.positions, {3, 3, -1, 2, -1, 0, 99, -1, -1}); },
       StatusCode::position_out_of_range, 2, 0, 99},
      {"request", [](Slots& s) { fill(s.requests, {0, 1, 2}); }, StatusCode::request_out_of_range, 2, 2, 2},
      {"request before seq_lens", [](Slots& s) { fill(s.requests, {0, -1, 1}); fill(s.seq_lens, {8, 13}); },
       StatusCode::request_out_of_range, 1, -1, 2},
      {"seq_lens", [](Slots& s) { fill(s.seq_lens, {8, 13}); }, StatusCode::seq_len_out_of_range, 1, 13, 12},
      {"past seq_lens", [](Slots& s) { fill(s.seq_lens, {3, 12}); }, StatusCode::position_past_seq_len, 0, 2, 3},
      {"negative page", [](Slots& s) { s.table.data<int32_t>()[3] = -1; }, StatusCode::page_id_invalid, 1, 0, -1},
      {"past seq_lens before a negative page",
       [](Slots& s) { s.table.data<int32_t>()[0] = -1; fill(s.seq_lens, {8, 2}); },
       StatusCode::position_past_seq_len, 1, 0, 2},
      {"page too large, after every negative one",
       [](Slots& s) { s.table.data<int32_t>()[0] = INT32_MAX / 4 + 1; s.table.data<int32_t>()[3] = -3; },
       StatusCode::page_id_invalid, 1, 0, -3},
      {"page too large", [](Slots& s) { s.table.data<int32_t>()[0] = INT32_MAX / 4 + 1; },
       StatusCode::page_id_invalid, 0, 0, INT32_MAX / 4 + 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Slots s = small_slots();
    c.change(s);
    EXPECT_ANY_THROW(slots_cpu(s));  // the CPU throws for the same inputs
    for (const int offset : {0, 1}) {
      std::vector<int32_t> st;
      slots_gpu(s, stream, st, offset);
      expect_status(st, c.code, c.a, c.b, c.c);
    }
  }
  // Many offences: the first in row-major order wins, whichever CTA arrives first.
  Slots big = slots_problem(77, 2, 300, 64, 1000);
  for (int r : {599, 421, 250, 17})
    big.positions.data<int32_t>()[r * 64 + 63 - r % 64] = -7;
  std::vector<int32_t> st;
  slots_gpu(big, stream, st);
  expect_status(st, StatusCode::position_out_of_range, 17, 63 - 17, -7);
  // A buffer that already holds an offence keeps it.
  Slots bad = small_slots();
  bad.positions.data<int32_t>()[0] = 50;
  slots_gpu(bad, stream, st, 0, {int32_t(StatusCode::key_range_invalid), 4, 5, 6});
  expect_status(st, StatusCode::key_range_invalid, 4, 5, 6);
}

// ---- group_union_masks ----

struct Groups {
  HostTensor positions{DType::i32, {0}}, cu{DType::i32, {0}};
  int64_t group_size = 1, groups = 0, cap = 0;
  bool packed = false;
};

struct UnionResult {
  std::vector<int32_t> keys, lens, rows;
  std::vector<uint8_t> mask;
  bool operator==(const UnionResult& o) const {
    return keys == o.keys && lens == o.lens && rows == o.rows && mask == o.mask;
  }
};

std::vector<int64_t> lead_shape(const Groups& g, std::vector<int64_t> tail) {
  std::vector<int64_t> s;
  if (g.positions.t.ndim == 3) s.push_back(g.positions.t.shape[0]);
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}

struct UnionHost {
  HostTensor keys, lens, rows, mask;
  explicit UnionHost(const Groups& g)
      : keys(DType::i32, lead_shape(g, {g.groups, g.cap})), lens(DType::i32, lead_shape(g, {g.groups})),
        rows(DType::i32, {g.groups + 1}),
        mask(g.packed ? DType::u8 : DType::boolean,
             lead_shape(g, {g.positions.t.shape[g.positions.t.ndim - 2],
                            g.packed ? (g.cap + 7) / 8 : g.cap})) {}
  UnionResult result() const {
    const uint8_t* m = static_cast<uint8_t*>(mask.t.data);
    return {values(keys), values(lens), values(rows), std::vector<uint8_t>(m, m + mask.t.numel())};
  }
};

GroupUnionMasksArgs union_args(const Groups& g, const Tensor& pos, const Tensor& cu, const UnionHost& o) {
  GroupUnionMasksArgs a;
  a.positions = pos;
  a.cu_seqlens_q = cu;
  a.group_size = g.group_size;
  a.union_keys = o.keys.t;
  a.union_lens = o.lens.t;
  a.group_rows = o.rows.t;
  a.mask = o.mask.t;
  return a;
}

UnionResult union_cpu(const Groups& g) {
  UnionHost o(g);
  group_union_masks(union_args(g, g.positions.t, g.cu.t, o));
  return o.result();
}

// Device views of a host output set, poisoned.
struct UnionDevice {
  DeviceTensor keys, lens, rows, mask;
  UnionDevice(const UnionHost& o, cudaStream_t s)
      : keys(device_like(o.keys, s)), lens(device_like(o.lens, s)), rows(device_like(o.rows, s)),
        mask(device_like(o.mask, s)) {}
  GroupUnionMasksArgs args(const Groups& g, const Tensor& pos, const Tensor& cu) const {
    GroupUnionMasksArgs a;
    a.positions = pos;
    a.cu_seqlens_q = cu;
    a.group_size = g.group_size;
    a.union_keys = keys.t;
    a.union_lens = lens.t;
    a.group_rows = rows.t;
    a.mask = mask.t;
    return a;
  }
  UnionResult download(UnionHost& o, cudaStream_t s) const {
    copy_to_host(keys, o.keys, s);
    copy_to_host(lens, o.lens, s);
    copy_to_host(rows, o.rows, s);
    copy_to_host(mask, o.mask, s);
    return o.result();
  }
};

UnionResult union_gpu(const Groups& g, cudaStream_t stream, std::vector<int32_t>& st, int offset = 0) {
  const DeviceTensor pos = to_device(g.positions, stream), cu = to_device(g.cu, stream);
  UnionHost o(g);
  const UnionDevice d(o, stream);
  Status status(stream, offset);
  GroupUnionMasksArgs a = d.args(g, pos.t, cu.t);
  a.status = status.t;
  group_union_masks(a, stream);
  const UnionResult r = d.download(o, stream);
  st = status.read(stream);
  return r;
}

// Random requests of up to max_rows rows over keys up to max_len; G and U with spare room.
Groups groups_problem(uint32_t seed, int64_t heads, int64_t batch, int64_t max_rows, int64_t k,
                      int64_t max_len, int64_t group_size) {
  std::mt19937 rng(seed);
  Groups g;
  g.group_size = group_size;
  g.packed = seed % 2 == 1;
  std::vector<int32_t> rows_q(batch), klen(batch);
  for (int64_t b = 0; b < batch; ++b) {
    rows_q[b] = int32_t(rng() % (max_rows + 1));
    klen[b] = int32_t(rng() % (max_len + 1));
  }
  const std::vector<int32_t> cu = cumulative(rows_q);
  const int64_t rows = cu.back();
  std::vector<int32_t> row_len;
  for (int64_t b = 0; b < batch; ++b) row_len.insert(row_len.end(), size_t(rows_q[b]), klen[b]);
  g.positions = HostTensor(DType::i32, heads ? std::vector<int64_t>{heads, rows, k}
                                             : std::vector<int64_t>{rows, k});
  fill(g.positions, random_positions(rng, row_len, heads ? heads : 1, k));
  g.cu = i32_tensor(cu);
  int64_t groups = 0;
  for (int64_t b = 0; b < batch; ++b) groups += (rows_q[b] + group_size - 1) / group_size;
  g.groups = groups + rng() % 3;
  // U: the largest union found by the CPU with the bound g * K, plus spare room
  g.cap = std::min<int64_t>(group_size * k, kGroupUnionMaxU);
  const UnionResult probe = union_cpu(g);
  const int32_t largest = probe.lens.empty() ? 0 : *std::max_element(probe.lens.begin(), probe.lens.end());
  g.cap = std::min<int64_t>(g.cap, largest + int64_t(rng() % 40));
  return g;
}

TEST(GroupUnionMasksGpu, MatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  struct Shape {
    int64_t heads, batch, max_rows, k, max_len, group;
  };
  std::vector<Shape> shapes = {{0, 0, 0, 4, 10, 2},      {0, 3, 0, 4, 10, 2},   {0, 2, 5, 0, 10, 3},
                               {0, 3, 7, 6, 60, 1},      {3, 4, 9, 5, 40, 2},   {0, 5, 20, 33, 500, 64},
                               {2, 3, 12, 2048, 9000, 2}, {0, 2, 8, 2048, 3000, 4},
                               {0, 4, 17, 64, 100000, 8}};
  if (!small_tests()) shapes.push_back({0, 8, 64, 2048, 30000, 4});
  uint32_t seed = 100;
  for (const Shape& sh : shapes)
    for (int rep = 0; rep < 2; ++rep, ++seed) {
      const Groups g = groups_problem(seed, sh.heads, sh.batch, sh.max_rows, sh.k, sh.max_len, sh.group);
      SCOPED_TRACE("seed " + std::to_string(seed) + " K " + std::to_string(sh.k) + " U " +
                   std::to_string(g.cap) + " G " + std::to_string(g.groups));
      const UnionResult want = union_cpu(g);
      std::vector<int32_t> st;
      const UnionResult got = union_gpu(g, stream, st);
      EXPECT_EQ(st[0], 0) << describe_status(st.data());
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.lens, want.lens);
      EXPECT_EQ(got.keys, want.keys);
      EXPECT_EQ(got.mask, want.mask);
    }
}

// Rows [0, 1], [2, -1] of one request, plus [4, 3] of a second; groups of 2.
Groups small_groups() {
  Groups g;
  g.positions = HostTensor(DType::i32, {3, 2});
  fill(g.positions, {0, 1, 2, -1, 4, 3});
  g.cu = i32_tensor({0, 2, 3});
  g.group_size = 2;
  g.groups = 2;
  g.cap = 3;
  return g;
}

TEST(GroupUnionMasksGpu, EveryOffenceWithItsStatus) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  {
    const Groups g = small_groups();
    std::vector<int32_t> st;
    EXPECT_EQ(union_gpu(g, stream, st), union_cpu(g));
    EXPECT_EQ(st[0], 0);
  }
  struct Case {
    const char* what;
    std::function<void(Groups&)> change;
    StatusCode code;
    int32_t a, b, c;
  };
  const std::vector<Case> cases = {
      {"range", [](Groups& g) { g.positions.data<int32_t>()[3] = -2; }, StatusCode::position_out_of_range, 1, 1, -2},
      {"int32 max", [](Groups& g) { g.positions.data<int32_t>()[4] = INT32_MAX; },
       StatusCode::position_out_of_range, 2, 0, INT32_MAX},
      {"repeat", [](Groups& g) { g.positions.data<int32_t>()[5] = 4; }, StatusCode::position_repeated, 2, 4, 1},
      {"repeat before cu_seqlens_q", [](Groups& g) { g.positions.data<int32_t>()[1] = 0; fill(g.cu, {1, 2, 3}); },
       StatusCode::position_repeated, 0, 0, 1},
      {"cu start", [](Groups& g) { fill(g.cu, {1, 2, 3}); }, StatusCode::bad_cu_seqlens, 0, 0, 0},
      {"cu decrease", [](Groups& g) { fill(g.cu, {0, 2, 1}); }, StatusCode::bad_cu_seqlens, 0, 2, 0},
      {"cu end", [](Groups& g) { fill(g.cu, {0, 2, 2}); }, StatusCode::bad_cu_seqlens, 0, 2, 0},
      {"groups", [](Groups& g) { g.groups = 1; }, StatusCode::groups_past_capacity, 2, 1, 0},
      {"union", [](Groups& g) { g.cap = 2; }, StatusCode::union_past_capacity, 0, 0, 2},
      {"groups before union", [](Groups& g) { g.groups = 1; g.cap = 2; }, StatusCode::groups_past_capacity, 2, 1, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Groups g = small_groups();
    c.change(g);
    EXPECT_ANY_THROW(union_cpu(g));
    for (const int offset : {0, 1}) {
      std::vector<int32_t> st;
      const UnionResult r = union_gpu(g, stream, st, offset);
      expect_status(st, c.code, c.a, c.b, c.c);
      if (c.code == StatusCode::union_past_capacity) {  // the group is written empty, not truncated
        EXPECT_EQ(r.lens[0], 0);
        EXPECT_EQ(std::vector<int32_t>(r.keys.begin(), r.keys.begin() + 2), (std::vector<int32_t>{-1, -1}));
        EXPECT_EQ(std::vector<uint8_t>(r.mask.begin(), r.mask.begin() + 4), std::vector<uint8_t>(4, 0));
      }
    }
  }
  // The first overflowing group by (kv head, group), whichever CTA arrives first.
  Groups many = groups_problem(9, 3, 6, 30, 16, 400, 4);
  many.cap = 20;  // well below most unions of 4 rows of up to 16 keys
  std::vector<int32_t> st;
  union_gpu(many, stream, st);
  EXPECT_EQ(st[0], int32_t(StatusCode::union_past_capacity)) << describe_status(st.data());
  EXPECT_THROW(union_cpu(many), Error);
  try {
    union_cpu(many);
  } catch (const Error& e) {
    const std::string want = detail::concat("kv head ", st[1], ", group ", st[2], ")");
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// Both ops captured once and replayed over new input values in the same buffers.
TEST(TokenSparseGpu, GraphCaptureAndReplay) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  Slots s = slots_problem(5, 2, 40, 64, 500);
  s.with_lens = true;
  Groups g = groups_problem(6, 0, 4, 10, 64, 300, 2);
  g.cap = std::min<int64_t>(g.group_size * 64, 128);
  DeviceTensor spos = to_device(s.positions, stream), sreq = to_device(s.requests, stream),
                     stab = to_device(s.table, stream), slen = to_device(s.seq_lens, stream),
                     gpos = to_device(g.positions, stream), gcu = to_device(g.cu, stream);
  HostTensor sout(DType::i32, std::vector<int64_t>(s.positions.t.shape, s.positions.t.shape + 3));
  const DeviceTensor dsout = device_like(sout, stream);
  UnionHost uo(g);
  const UnionDevice ud(uo, stream);
  Status status(stream);
  TokenSparseKvIndicesArgs sa;
  sa.positions = spos.t;
  sa.requests = sreq.t;
  sa.block_table = stab.t;
  sa.page_size = s.page_size;
  sa.seq_lens = slen.t;
  sa.slots = dsout.t;
  sa.status = status.t;
  GroupUnionMasksArgs ga = ud.args(g, gpos.t, gcu.t);
  ga.status = status.t;
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  token_sparse_kv_indices(sa, stream);
  group_union_masks(ga, stream);
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    // new values, same shapes: positions reshuffled (kept within the same lengths)
    std::mt19937 rng(replay);
    for (HostTensor* p : {&s.positions, &g.positions}) {
      const int64_t k = p->t.shape[p->t.ndim - 1];
      for (int64_t r = 0; r * k < p->t.numel(); ++r)
        std::shuffle(p->data<int32_t>() + r * k, p->data<int32_t>() + (r + 1) * k, rng);
    }
    copy_to_device(s.positions, spos.buf, stream);
    copy_to_device(g.positions, gpos.buf, stream);
    MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    copy_to_host(dsout, sout, stream);
    const UnionResult got = ud.download(uo, stream);
    EXPECT_EQ(status.read(stream)[0], 0);
    EXPECT_EQ(values(sout), slots_cpu(s)) << "replay " << replay;
    EXPECT_TRUE(got == union_cpu(g)) << "replay " << replay;
  }
  // A replay with an offence reports it, as a direct call does.
  s.positions.data<int32_t>()[3] = -9;
  copy_to_device(s.positions, spos.buf, stream);
  MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  expect_status(status.read(stream), StatusCode::position_out_of_range, 0, 3, -9);
  MSA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MSA_CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace msa::test
