// CPU token_sparse_kv_indices and group_union_masks (include/msa/token_sparse.h) against brute
// forces written from the definitions (the slot formula; per-group sets), over random shapes
// with -1 anywhere in a row, unsorted rows, empty rows and requests, per-kv-head positions and
// strided block tables; then every value offence with its message (the CPU reference throws in
// the header's order) and the argument rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "msa/msa.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/token_sparse_case.h"

namespace msa::test {
namespace {

struct SlotsCase {
  HostTensor positions, requests, table, seq_lens, slots;
  int64_t page_size;
  TokenSparseKvIndicesArgs args(bool with_lens) const {
    TokenSparseKvIndicesArgs a;
    a.positions = positions.t;
    a.requests = requests.t;
    a.block_table = table.t;
    a.page_size = page_size;
    if (with_lens) a.seq_lens = seq_lens.t;
    a.slots = slots.t;
    return a;
  }
};

// Random requests and a block table of distinct pages (row stride `pad` wider than W).
SlotsCase slots_case(uint32_t seed, int64_t heads, int64_t k, int64_t pad = 0) {
  std::mt19937 rng(seed);
  const int64_t batch = 1 + rng() % 3, ps = std::vector<int64_t>{1, 4, 16, 64}[rng() % 4];
  std::vector<int32_t> lens(batch);
  for (auto& l : lens) l = int32_t(rng() % 200);
  const int64_t width = (*std::max_element(lens.begin(), lens.end()) + ps - 1) / ps + rng() % 3;
  std::vector<int32_t> pages(size_t(batch * width));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
  std::shuffle(pages.begin(), pages.end(), rng);
  const int64_t rows = rng() % 9;
  std::vector<int32_t> req(rows), row_len(rows);
  for (int64_t t = 0; t < rows; ++t) {
    req[t] = int32_t(rng() % batch);
    row_len[t] = lens[req[t]];
  }
  const std::vector<int64_t> shape = heads ? std::vector<int64_t>{heads, rows, k}
                                           : std::vector<int64_t>{rows, k};
  SlotsCase c{HostTensor(DType::i32, shape), HostTensor(DType::i32, {rows}),
              HostTensor(DType::i32, {batch, width}, {width + pad, 1}), HostTensor(DType::i32, {batch}),
              HostTensor(DType::i32, shape), ps};
  fill(c.positions, random_positions(rng, row_len, heads ? heads : 1, k));
  fill(c.requests, req);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t w = 0; w < width; ++w) c.table.data<int32_t>()[b * (width + pad) + w] = pages[b * width + w];
  fill(c.seq_lens, lens);
  return c;
}

TEST(TokenSparseKvIndices, MatchesTheSlotFormula) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const int64_t heads = seed % 3 == 0 ? 2 : 0, k = 1 + seed % 9;
    SlotsCase c = slots_case(seed, heads, k, seed % 2 ? 3 : 0);
    token_sparse_kv_indices(c.args(seed % 4 != 1));
    const int64_t rows = c.requests.t.shape[0];
    const int64_t ld = c.table.t.strides[0];
    for (int64_t i = 0; i < c.positions.t.numel(); ++i) {
      const int32_t p = c.positions.data<int32_t>()[i];
      const int32_t b = c.requests.data<int32_t>()[(i / k) % rows];
      const int64_t want = p < 0 ? -1 : int64_t(c.table.data<int32_t>()[b * ld + p / c.page_size]) *
                                                c.page_size + p % c.page_size;
      ASSERT_EQ(c.slots.data<int32_t>()[i], want) << "seed " << seed << " entry " << i;
    }
  }
}

TEST(TokenSparseKvIndices, EmptyShapes) {
  for (const auto& shape : {std::vector<int64_t>{0, 4}, std::vector<int64_t>{3, 0},
                            std::vector<int64_t>{2, 0, 4}, std::vector<int64_t>{0, 3, 4}}) {
    const int64_t rows = shape[shape.size() - 2];
    HostTensor pos(DType::i32, shape), out(DType::i32, shape), req(DType::i32, {rows}),
        table(DType::i32, {1, 2});
    std::fill(req.data<int32_t>(), req.data<int32_t>() + rows, 0);
    fill(table, {0, 1});
    TokenSparseKvIndicesArgs a;
    a.positions = pos.t;
    a.requests = req.t;
    a.block_table = table.t;
    a.page_size = 4;
    a.slots = out.t;
    if (shape[0] == 0 && shape.size() == 3) std::fill(req.data<int32_t>(), req.data<int32_t>() + rows, 5);
    if (shape[0] == 0 && shape.size() == 3) {  // no position, yet the requests are checked
      expect_error([&] { token_sparse_kv_indices(a); }, "requests[0] = 5: must be in [0, 1)");
      continue;
    }
    EXPECT_NO_THROW(token_sparse_kv_indices(a));
  }
}

// The numpy version's error cases (python/tests/test_cpu_token_sparse.py), same messages.
TEST(TokenSparseKvIndices, EveryOffenceInOrder) {
  HostTensor pos(DType::i32, {2, 2}), req(DType::i32, {2}), table(DType::i32, {2, 2}),
      lens(DType::i32, {2}), out(DType::i32, {2, 2});
  TokenSparseKvIndicesArgs ok;
  ok.positions = pos.t;
  ok.requests = req.t;
  ok.block_table = table.t;
  ok.page_size = 4;
  ok.slots = out.t;
  const auto reset = [&] {
    fill(pos, {1, -1, 2, -1});
    fill(req, {0, 1});
    fill(table, {3, 1, 0, -1});
    fill(lens, {8, 8});
  };
  reset();
  token_sparse_kv_indices(ok);
  EXPECT_EQ(values(out), (std::vector<int32_t>{13, -1, 2, -1}));
  const auto run = [&](TokenSparseKvIndicesArgs a) { token_sparse_kv_indices(a); };
  struct Case {
    std::function<void()> change;
    bool with_lens;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[&] { fill(pos, {1, 1, 2, -1}); }, false, "positions: id 1 is repeated in the row at positions[0]"},
      {[&] { fill(pos, {8, -1, 2, -1}); }, false,
       "positions: id 8 at positions[0] entry 0 is outside [-1, 8) (8 block_table's 2 pages of 4 slots)"},
      {[&] { fill(pos, {-2, -1, 2, -1}); }, false, "id -2 at positions[0] entry 0"},
      // range before repeat, whatever the rows
      {[&] { fill(pos, {1, 1, 9, -1}); }, false, "id 9 at positions[1] entry 0"},
      {[&] { fill(pos, {1, -1, 5, -1}); }, false,
       "block_table[1, 1] = -1: the page of positions[1, 0] = 5 must be a page id >= 0"},
      {[&] { fill(req, {0, 2}); }, false, "requests[1] = 2: must be in [0, 2) (the requests of block_table)"},
      {[&] { fill(lens, {2, 2}); }, true,
       "positions[1, 0] = 2: at or past seq_lens[1] = 2, the length of the row's request"},
      {[&] { fill(lens, {2, 9}); }, true, "seq_lens[1] = 9: must be in [0, 8]"},
      // requests before seq_lens before lengths before pages
      {[&] { fill(req, {0, -1}); fill(lens, {2, 9}); }, true, "requests[1] = -1"},
      {[&] { fill(lens, {-1, 0}); fill(pos, {1, -1, 5, -1}); }, true, "seq_lens[0] = -1"},
      {[&] { fill(lens, {8, 4}); fill(pos, {1, -1, 5, -1}); }, true, "positions[1, 0] = 5: at or past"},
  };
  for (const auto& c : cases) {
    reset();
    c.change();
    TokenSparseKvIndicesArgs a = ok;
    if (c.with_lens) a.seq_lens = lens.t;
    expect_error([&] { run(a); }, c.message);
  }
  // a page id whose slots do not fit int32, after every negative one
  reset();
  fill(table, {3, INT32_MAX / 4 + 1, 0, 1});
  fill(pos, {5, -1, 2, -1});
  expect_error([&] { run(ok); }, "block_table: page id 536870912 x page_size 4 does not fit an int32 "
                                 "slot index (positions[0, 0])");
  fill(table, {3, INT32_MAX / 4 + 1, 0, -1});
  fill(pos, {5, -1, 5, -1});
  expect_error([&] { run(ok); }, "block_table[1, 1] = -1");
  // per kv head: the row is named [h, t]
  HostTensor pos3(DType::i32, {2, 2, 2}), out3(DType::i32, {2, 2, 2});
  reset();
  fill(pos3, {1, -1, 2, -1, 0, 3, 3, -1});
  TokenSparseKvIndicesArgs a3 = ok;
  a3.positions = pos3.t;
  a3.slots = out3.t;
  token_sparse_kv_indices(a3);
  EXPECT_EQ(values(out3), (std::vector<int32_t>{13, -1, 2, -1, 12, 15, 3, -1}));
  fill(pos3, {1, -1, 2, -1, 0, 3, 3, 3});
  expect_error([&] { run(a3); }, "positions: id 3 is repeated in the row at positions[1, 1]");
}

TEST(TokenSparseKvIndices, ArgumentRules) {
  HostTensor pos(DType::i32, {2, 2}), req(DType::i32, {2}), table(DType::i32, {2, 2}),
      lens(DType::i32, {2}), out(DType::i32, {2, 2}), f(DType::f32, {2, 2}), lens3(DType::i32, {3});
  fill(pos, {1, -1, 2, -1});
  fill(req, {0, 1});
  fill(table, {3, 1, 0, 2});
  TokenSparseKvIndicesArgs ok;
  ok.positions = pos.t;
  ok.requests = req.t;
  ok.block_table = table.t;
  ok.page_size = 4;
  ok.slots = out.t;
  ASSERT_NO_THROW(token_sparse_kv_indices(ok));
  const auto run = [](const TokenSparseKvIndicesArgs& a) { token_sparse_kv_indices(a); };
  expect_arg_error(run, ok, [](auto& a) { a.page_size = 0; }, "page_size: must be in [1, 2^31 - 1]");
  expect_arg_error(run, ok, [&](auto& a) { a.positions = f.t; }, "positions: dtype");
  expect_arg_error(run, ok, [&](auto& a) { a.requests = lens3.t; },
                   "requests: must have one entry per row of positions (2)");
  expect_arg_error(run, ok, [&](auto& a) { a.seq_lens = lens3.t; },
                   "seq_lens: must have one entry per request of block_table (2)");
  expect_arg_error(run, ok, [&](auto& a) { a.slots = lens3.t; }, "slots: shape must be positions' [2, 2]");
  expect_arg_error(run, ok, [](auto& a) { a.slots.device = {DeviceType::cuda, 0}; },
                   "token_sparse_kv_indices: slots is on cuda:0, but positions on cpu");
}

// ---- group_union_masks ----

struct UnionOut {
  HostTensor keys, lens, rows, mask;
};

UnionOut union_outputs(int64_t heads, int64_t rows, int64_t groups, int64_t cap, bool packed) {
  std::vector<int64_t> lead;
  if (heads) lead.push_back(heads);
  auto with = [&](std::vector<int64_t> tail) {
    std::vector<int64_t> s = lead;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  return {HostTensor(DType::i32, with({groups, cap})), HostTensor(DType::i32, with({groups})),
          HostTensor(DType::i32, {groups + 1}),
          HostTensor(packed ? DType::u8 : DType::boolean, with({rows, packed ? (cap + 7) / 8 : cap}))};
}

GroupUnionMasksArgs union_args(const HostTensor& pos, const HostTensor& cu, int64_t g, const UnionOut& o) {
  GroupUnionMasksArgs a;
  a.positions = pos.t;
  a.cu_seqlens_q = cu.t;
  a.group_size = g;
  a.union_keys = o.keys.t;
  a.union_lens = o.lens.t;
  a.group_rows = o.rows.t;
  a.mask = o.mask.t;
  return a;
}

TEST(GroupUnionMasks, MatchesPerGroupSets) {
  for (uint32_t seed = 0; seed < 48; ++seed) {
    std::mt19937 rng(seed);
    const int64_t batch = rng() % 4, heads = seed % 2 ? 3 : 0, k = rng() % 7;
    const int64_t g = std::vector<int64_t>{1, 2, 3, 64}[rng() % 4];
    const bool packed = seed % 3 == 0;
    std::vector<int32_t> rows_q(batch), klen(batch);
    for (int64_t b = 0; b < batch; ++b) {
      rows_q[b] = int32_t(rng() % 6);
      klen[b] = int32_t(rng() % 60);
    }
    const std::vector<int32_t> cu = cumulative(rows_q);
    const int64_t rows = cu.back();
    std::vector<int32_t> row_len;
    for (int64_t b = 0; b < batch; ++b) row_len.insert(row_len.end(), size_t(rows_q[b]), klen[b]);
    const int64_t nh = heads ? heads : 1;
    const std::vector<int32_t> pos = random_positions(rng, row_len, nh, k);
    // the brute force: groups, their sets
    std::vector<int32_t> starts;
    for (int64_t b = 0; b < batch; ++b)
      for (int32_t s = cu[b]; s < cu[b + 1]; s += int32_t(g)) starts.push_back(s);
    const int64_t groups = int64_t(starts.size()), extra = rng() % 3;
    std::vector<std::vector<std::set<int32_t>>> sets(static_cast<size_t>(nh));
    for (auto& hs : sets) hs.resize(size_t(groups));
    int64_t largest = 0;
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < groups; ++i) {
        const int32_t end = i + 1 < groups ? starts[i + 1] : int32_t(rows);
        for (int32_t t = starts[i]; t < end; ++t)
          for (int64_t e = 0; e < k; ++e)
            if (pos[(h * rows + t) * k + e] >= 0) sets[h][i].insert(pos[(h * rows + t) * k + e]);
        largest = std::max<int64_t>(largest, int64_t(sets[h][i].size()));
      }
    const int64_t cap = std::min<int64_t>(g * k, largest + int64_t(rng() % 4));
    const std::vector<int64_t> pshape = heads ? std::vector<int64_t>{heads, rows, k}
                                              : std::vector<int64_t>{rows, k};
    HostTensor p(DType::i32, pshape), cut = i32_tensor(cu);
    fill(p, pos);
    UnionOut o = union_outputs(heads, rows, groups + extra, cap, packed);
    group_union_masks(union_args(p, cut, g, o));
    std::vector<int32_t> want_rows = starts;
    want_rows.resize(size_t(groups + extra + 1), int32_t(rows));
    ASSERT_EQ(values(o.rows), want_rows) << "seed " << seed;
    const int64_t mcols = packed ? (cap + 7) / 8 : cap;
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < groups + extra; ++i) {
        std::vector<int32_t> want;  // the groups past the last are empty
        if (i < groups) want.assign(sets[h][i].begin(), sets[h][i].end());
        ASSERT_EQ(o.lens.data<int32_t>()[h * (groups + extra) + i], int32_t(want.size()));
        want.resize(size_t(cap), -1);
        const int32_t* got = o.keys.data<int32_t>() + (h * (groups + extra) + i) * cap;
        ASSERT_EQ(std::vector<int32_t>(got, got + cap), want) << "seed " << seed << " group " << i;
      }
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < rows; ++t) {
        const int64_t i = std::upper_bound(starts.begin(), starts.end(), int32_t(t)) - starts.begin() - 1;
        const int32_t* keys = o.keys.data<int32_t>() + (h * (groups + extra) + i) * cap;
        const uint8_t* m = static_cast<uint8_t*>(o.mask.t.data) + (h * rows + t) * mcols;
        std::set<int32_t> mine, marked;
        for (int64_t e = 0; e < k; ++e)
          if (pos[(h * rows + t) * k + e] >= 0) mine.insert(pos[(h * rows + t) * k + e]);
        for (int64_t j = 0; j < cap; ++j) {
          const bool on = packed ? (m[j / 8] >> (j % 8)) & 1 : m[j];
          if (on) marked.insert(keys[j]);
        }
        if (packed)
          for (int64_t j = cap; j < mcols * 8; ++j) EXPECT_EQ((m[j / 8] >> (j % 8)) & 1, 0);
        ASSERT_EQ(marked, mine) << "seed " << seed << " head " << h << " row " << t;
      }
  }
}

TEST(GroupUnionMasks, EveryOffenceInOrder) {
  HostTensor pos(DType::i32, {2, 2});
  HostTensor cu = i32_tensor({0, 2});
  const auto run = [&](int64_t groups, int64_t cap, int64_t g = 2) {
    UnionOut o = union_outputs(0, 2, groups, cap, false);
    group_union_masks(union_args(pos, cu, g, o));
    return values(o.keys);
  };
  fill(pos, {0, 1, 2, -1});
  EXPECT_EQ(run(1, 3), (std::vector<int32_t>{0, 1, 2}));
  fill(pos, {0, 0, 2, -1});
  expect_error([&] { run(1, 3); }, "positions: id 0 is repeated in the row at positions[0]");
  fill(pos, {INT32_MAX, -1, 2, -1});
  expect_error([&] { run(1, 3); }, "positions: id 2147483647 at positions[0] entry 0 is outside "
                                   "[-1, 2147483647) (2147483647 int32 key positions)");
  fill(pos, {0, 1, 2, -3});
  expect_error([&] { run(1, 3); }, "id -3 at positions[1] entry 1");
  fill(pos, {0, 1, 2, -1});
  fill(cu, {0, 1});
  expect_error([&] { run(1, 3); }, "cu_seqlens_q[-1] = 1: must equal the rows of positions (2)");
  fill(cu, {1, 2});
  expect_error([&] { run(1, 3); }, "cu_seqlens_q: must start at 0, got cu_seqlens_q[0] = 1");
  HostTensor cu3 = i32_tensor({0, 2, 1, 2});
  {
    UnionOut o = union_outputs(0, 2, 3, 3, false);
    expect_error([&] { group_union_masks(union_args(pos, cu3, 2, o)); },
                 "cu_seqlens_q: must be non-decreasing, got cu_seqlens_q[1] = 2 > cu_seqlens_q[2] = 1");
  }
  fill(cu, {0, 2});
  expect_error([&] { run(1, 2, 1); }, "group_rows: the requests form 2 groups of group_size 1, more "
                                      "than the 1 the outputs hold");
  expect_error([&] { run(1, 2); }, "max_union = 2: a group's union has 3 keys (the first past it: "
                                   "kv head 0, group 0)");
  expect_error([&] { run(1, 5); }, "union_keys: U = 5 (max_union) must be at most group_size x K = 4");
  // the positions' checks come first, whatever else is wrong
  fill(pos, {0, 0, 2, -1});
  fill(cu, {1, 2});
  expect_error([&] { run(1, 1); }, "id 0 is repeated");
}

TEST(GroupUnionMasks, EmptyShapesAndArgumentRules) {
  // no rows: no group; K = 0: empty unions
  HostTensor none(DType::i32, {0, 4}), cu0 = i32_tensor({0, 0, 0});
  UnionOut o0 = union_outputs(0, 0, 2, 0, true);
  group_union_masks(union_args(none, cu0, 3, o0));
  EXPECT_EQ(values(o0.rows), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(values(o0.lens), (std::vector<int32_t>{0, 0}));
  HostTensor nok(DType::i32, {3, 0}), cu1 = i32_tensor({0, 3});
  UnionOut o1 = union_outputs(0, 3, 2, 0, false);
  group_union_masks(union_args(nok, cu1, 2, o1));
  EXPECT_EQ(values(o1.rows), (std::vector<int32_t>{0, 2, 3}));
  HostTensor pos(DType::i32, {2, 2}), cu = i32_tensor({0, 2}), f(DType::f32, {2});
  fill(pos, {0, 1, 2, -1});
  UnionOut o = union_outputs(0, 2, 1, 3, false);
  const GroupUnionMasksArgs ok = union_args(pos, cu, 2, o);
  ASSERT_NO_THROW(group_union_masks(ok));
  const auto run = [](const GroupUnionMasksArgs& a) { group_union_masks(a); };
  HostTensor mask_bad(DType::boolean, {2, 2}), mask_i32(DType::i32, {2, 3}), lens_bad(DType::i32, {2}),
      rows_bad(DType::i32, {3});
  expect_arg_error(run, ok, [](auto& a) { a.group_size = 0; }, "group_size: must be in [1, 2^31 - 1]");
  expect_arg_error(run, ok, [&](auto& a) { a.cu_seqlens_q = f.t; }, "cu_seqlens_q: dtype");
  expect_arg_error(run, ok, [&](auto& a) { a.mask = mask_bad.t; }, "mask: shape must be [rows, U] = [2, 3]");
  expect_arg_error(run, ok, [&](auto& a) { a.mask = mask_i32.t; }, "mask: dtype");
  expect_arg_error(run, ok, [&](auto& a) { a.union_lens = lens_bad.t; }, "union_lens: shape must be [1]");
  expect_arg_error(run, ok, [&](auto& a) { a.group_rows = rows_bad.t; }, "group_rows: shape must be [G + 1] = [2]");
  expect_arg_error(run, ok, [](auto& a) {
    a.positions.device = a.cu_seqlens_q.device = a.union_keys.device = a.union_lens.device =
        a.group_rows.device = a.mask.device = {DeviceType::cuda, 0};
  }, "group_union_masks: status (int32[4] on the GPU) is required for CUDA tensors");
}

TEST(TokenSparseStatus, DescribesEveryCode) {
  for (int code = int(StatusCode::offence_pending); code <= int(StatusCode::union_past_capacity); ++code) {
    const int32_t s[4] = {code, 1, 2, 3};
    EXPECT_EQ(describe_status(s).find("unknown"), std::string::npos) << code;
  }
}

}  // namespace
}  // namespace msa::test
