// The SDSA indexer on CUDA (src/cuda/sm90/sdsa/) against the CPU reference: bitwise equal scores
// (bf16 and NVFP4 keys and queries, global scales that make the fp64 products round), stores
// holding the same candidates and ties (in any slot order) with equal counts, equal ids and
// row_status from top_k_from_candidates, equal thresholds, samples and NVFP4 writes; outputs
// poisoned and checked element by element (nothing written past a store or a row), repeat runs
// bitwise equal, and every device-side value error flagged without an out-of-bounds access.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/sdsa.h"
#include "support/device_tensor.h"
#include "support/sdsa_case.h"

namespace msa::test {
namespace {

constexpr float kInf = INFINITY;

// A case's cache and rows on the device.
struct DevCase {
  DeviceTensor keys, table, lens, query, requests, row_lens;
  std::optional<DeviceTensor> key_scale, query_scale;
  IndexKeyCache cache;
  IndexQueryRows rows;
};

DevCase upload(const SdsaCase& c, cudaStream_t s) {
  DevCase d{to_device(c.keys, s),    to_device(c.table, s),    to_device(c.lens, s),
            to_device(c.query, s),   to_device(c.requests, s), to_device(c.row_lens, s),
            std::nullopt,            std::nullopt,             {},
            {}};
  d.cache = c.cache();
  d.cache.key_cache.values = d.keys.t;
  d.cache.block_table = d.table.t;
  d.cache.seq_lens = d.lens.t;
  if (c.shape.fp4_keys) {
    d.key_scale = to_device(c.key_scale, s);
    d.cache.key_cache.scale = d.key_scale->t;
  }
  d.rows = c.rows();
  d.rows.query.values = d.query.t;
  d.rows.row_requests = d.requests.t;
  if (c.shape.row_lens) d.rows.row_lens = d.row_lens.t;
  if (c.shape.fp4_query) {
    d.query_scale = to_device(c.query_scale, s);
    d.rows.query.scale = d.query_scale->t;
  }
  return d;
}

struct Status {
  DeviceBuffer buf{16};
  Tensor t{buf.get(), DType::i32, {4}, gpu0()};
  explicit Status(cudaStream_t s) { clear_status(t, s); }
  std::vector<int32_t> read(cudaStream_t s) const { return buf.download<int32_t>(4, s); }
};

// indexer_scores over a device case into device scores.
IndexerScoresArgs scores_args(const DevCase& d, const DeviceTensor& scores, const Tensor& status) {
  IndexerScoresArgs g;
  g.rows = d.rows;
  g.cache = d.cache;
  g.scores = scores.t;
  g.status = status;
  return g;
}

// The select over a device case and device stores.
ThresholdSelectArgs select_args(const DevCase& d, const DeviceTensor& thresholds,
                                const DeviceTensor& candidates, const DeviceTensor& ties,
                                const DeviceTensor& counts, const Tensor& status) {
  return ThresholdSelectArgs{d.rows, d.cache, thresholds.t, candidates.t, ties.t, counts.t, status};
}

template <typename T>
std::vector<T> host_vec(const HostTensor& h) {
  return {h.data<T>(), h.data<T>() + h.t.numel()};
}
template <typename T>
std::vector<T> download(const DeviceTensor& d, const HostTensor& like, cudaStream_t s) {
  return d.buf.download<T>(size_t(like.t.numel()), s);
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// A random case of the suite: page sizes 16-256, shuffled pages, causal row lengths, empty
// requests and rows, bf16 or NVFP4 keys and queries; odd global scales on some NVFP4 cases so
// the fp64 products and sums round.
SdsaCase random_case(uint32_t seed, bool small) {
  std::mt19937 rng(seed * 7919u + 13u);
  SdsaShape sh;
  const int64_t page_sizes[] = {16, 32, 64, 128, 256};
  sh.page_size = page_sizes[seed % 5];
  // NVFP4 queries over NVFP4 keys (seed % 4 == 1) score exactly, by 16-byte loads when D % 64 == 0
  // and by the byte path at D = 48. At D = 128 (the SDSA-SELECT shape) also pages of 8 and rows of
  // a few thousand keys, so that a row spans many blocks and pages.
  const int64_t both_fp4_dims[] = {128, 64, 48};
  sh.dim = seed % 4 == 3 ? 128 : seed % 4 == 2 ? 32 : seed % 4 == 1 ? both_fp4_dims[seed / 4 % 3] : 64;
  const bool long_exact = seed % 4 == 1 && sh.dim == 128;
  const int64_t long_pages[] = {8, 256, 32, 16};
  if (long_exact) sh.page_size = long_pages[seed / 12 % 4];
  const int max_len = long_exact ? (small ? 2600 : 6000) : small ? 300 : 1500;
  const int batch = 1 + int(rng() % 4);
  for (int b = 0; b < batch; ++b)
    sh.seq_lens.push_back(rng() % 5 == 0 ? 0 : int32_t(1 + rng() % max_len));
  const int rows = 1 + int(rng() % 6);
  for (int t = 0; t < rows; ++t) sh.row_requests.push_back(int32_t(rng() % batch));
  sh.row_lens = seed % 3 == 1;
  sh.fp4_keys = seed % 2 == 1;
  sh.fp4_query = seed % 4 == 1 || seed % 4 == 2;
  sh.coarse = seed % 5 == 2;
  SdsaCase c = make_sdsa_case(sh, seed);
  if (seed % 8 == 1) c.key_global = 0.3137f;   // keys decode with a 24-bit global scale
  if (seed % 8 == 2) c.query_global = 0.771f;  // (any global reads the same codes)
  if (seed % 16 == 5 && c.keys.t.numel() > 0) {  // NaN scale bytes: a key's, then a query's
    c.key_scale.data<uint8_t>()[(seed * 31u) % uint32_t(c.key_scale.t.numel())] = 0x7f;
    c.query_scale.data<uint8_t>()[(seed * 17u) % uint32_t(c.query_scale.t.numel())] = 0xff;
  }
  return c;
}

int cases(int full) { return small_tests() ? 4 : full; }

TEST(SdsaScoresGpu, BitwiseEqualToCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (uint32_t seed = 0; seed < uint32_t(cases(40)); ++seed) {
    const SdsaCase c = random_case(seed, small_tests());
    const int64_t width = c.longest_row() + 1 + seed % 300;
    HostTensor ref(DType::f32, {c.num_rows(), width});
    IndexerScoresArgs a;
    a.rows = c.rows();
    a.cache = c.cache();
    a.scores = ref.t;
    indexer_scores(a);
    const DevCase d = upload(c, s);
    const DeviceTensor out = device_like(ref, s);
    const Status st(s);
    const IndexerScoresArgs g = scores_args(d, out, st.t);
    for (int rep = 0; rep < 2; ++rep) {  // the second run overwrites with the same bits
      indexer_scores(g, s);
      ASSERT_NO_THROW(check_status(st.t, s));
      const auto got = bits_of(download<float>(out, ref, s));
      const auto want = bits_of(host_vec<float>(ref));
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "seed " << seed << " row " << i / width << " column "
                                   << i % width << " rep " << rep;
    }
  }
}

// The CPU and GPU stores of one select, compared: equal counts, the same candidate pairs and tie
// positions (as sets: a parallel pass stores in any order), nothing written past a count or a
// store.
void expect_same_stores(const HostTensor& cand, const HostTensor& ties, const HostTensor& counts,
                        const std::vector<int32_t>& gcand, const std::vector<int32_t>& gties,
                        const std::vector<int32_t>& gcounts, const std::string& where) {
  const int64_t rows = counts.t.shape[0], cap = cand.t.shape[1], tcap = ties.t.shape[1];
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t* want = counts.data<int32_t>() + 3 * t;
    ASSERT_EQ(std::vector<int32_t>(want, want + 3),
              std::vector<int32_t>(gcounts.begin() + 3 * t, gcounts.begin() + 3 * t + 3))
        << where << " row " << t;
    const int64_t nc = std::min<int64_t>(want[0], cap), nt = std::min<int64_t>(want[1], tcap);
    std::vector<std::pair<int32_t, int32_t>> a, b;
    for (int64_t i = 0; i < cap; ++i) {
      const int32_t* w = cand.data<int32_t>() + (t * cap + i) * 2;
      const int32_t* g = gcand.data() + (t * cap + i) * 2;
      if (i < nc) {
        a.emplace_back(w[0], w[1]);
        b.emplace_back(g[0], g[1]);
      } else {
        ASSERT_EQ(g[0], -1) << where << ": candidate slot " << i << " of row " << t << " written";
        ASSERT_EQ(g[1], -1) << where << ": candidate slot " << i << " of row " << t << " written";
      }
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    // Without overflow the CPU's and GPU's sets are the row's every candidate; with it, each holds
    // `cap` of them, chosen by arrival: then only the GPU's must be candidates of the row.
    if (want[0] <= cap) {
      ASSERT_EQ(a, b) << where << " row " << t;
    } else {
      ASSERT_EQ(std::adjacent_find(b.begin(), b.end()), b.end()) << where << " row " << t;
    }
    std::vector<int32_t> x, y;
    for (int64_t i = 0; i < tcap; ++i) {
      const int32_t g = gties[size_t(t * tcap + i)];
      if (i < nt) {
        x.push_back(ties.data<int32_t>()[t * tcap + i]);
        y.push_back(g);
      } else {
        ASSERT_EQ(g, -1) << where << ": tie slot " << i << " of row " << t << " written";
      }
    }
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    if (want[1] <= tcap) ASSERT_EQ(x, y) << where << " row " << t;
  }
}

TEST(SdsaSelectGpu, StoresCountsAndTopKEqualCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  int exact = 0, overflowed = 0;
  for (uint32_t seed = 0; seed < uint32_t(cases(48)); ++seed) {
    const SdsaCase c = random_case(seed, small_tests());
    const int64_t rows = c.num_rows();
    const int topk = 4 + int(seed % 6) * 9, stride = 1 + int(seed % 4);
    const int64_t width = c.longest_row() + 2;
    HostTensor scores(DType::f32, {rows, width});
    IndexerScoresArgs sa;
    sa.rows = c.rows();
    sa.cache = c.cache();
    sa.scores = scores.t;
    indexer_scores(sa);
    // Sample scores: every stride-th score of the row (the thresholds op only sees scores).
    const int64_t per_row = (width + stride - 1) / stride;
    HostTensor sample(DType::f32, {rows, per_row});
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < per_row; ++i)
        sample.data<float>()[t * per_row + i] = scores.data<float>()[t * width + i * stride];
    // Capacities from roomy to overflowing both stores.
    const int64_t cap = seed % 5 == 0 ? 3 : 2 * topk + (seed % 3) * topk;
    const int64_t tie_cap = seed % 7 == 0 ? 1 : seed % 11 == 0 ? 0 : topk;
    HostTensor thr(DType::f32, {rows}), cand(DType::i32, {rows, cap, 2}),
        ties(DType::i32, {rows, tie_cap}), counts(DType::i32, {rows, 3});
    ThresholdsFromSampleArgs ta;
    ta.sample_scores = sample.t;
    ta.topk = topk;
    ta.sample_stride = stride;
    ta.oversample = 1.0 + (seed % 3) * 0.5;
    ta.thresholds = thr.t;
    ta.counts = counts.t;
    thresholds_from_sample(ta);
    const DevCase d = upload(c, s);
    const DeviceTensor dsample = to_device(sample, s);
    const DeviceTensor dthr = device_like(thr, s), dcounts = device_like(counts, s);
    ThresholdsFromSampleArgs tg = ta;
    tg.sample_scores = dsample.t;
    tg.thresholds = dthr.t;
    tg.counts = dcounts.t;
    thresholds_from_sample(tg, s);
    ASSERT_EQ(bits_of(download<float>(dthr, thr, s)), bits_of(host_vec<float>(thr)))
        << "seed " << seed;
    ASSERT_EQ(download<int32_t>(dcounts, counts, s), host_vec<int32_t>(counts));

    indexer_threshold_select(
        ThresholdSelectArgs{c.rows(), c.cache(), thr.t, cand.t, ties.t, counts.t, Tensor()});
    const DeviceTensor dcand = device_like(cand, s), dties = device_like(ties, s);
    const Status st(s);
    const ThresholdSelectArgs g = select_args(d, dthr, dcand, dties, dcounts, st.t);
    indexer_threshold_select(g, s);
    ASSERT_NO_THROW(check_status(st.t, s));
    const auto gcand = download<int32_t>(dcand, cand, s);
    const auto gties = download<int32_t>(dties, ties, s);
    expect_same_stores(cand, ties, counts, gcand, gties, download<int32_t>(dcounts, counts, s),
                       "seed " + std::to_string(seed));

    // Top-K of each backend's own stores: equal ids and row_status (overflowed rows are all -1
    // on both, whichever keys their full stores kept).
    HostTensor ids(DType::i32, {rows, topk}), rs(DType::i32, {rows});
    top_k_from_candidates(TopKFromCandidatesArgs{cand.t, ties.t, counts.t, topk, ids.t, rs.t});
    const DeviceTensor dids = device_like(ids, s), drs = device_like(rs, s);
    const TopKFromCandidatesArgs kg{dcand.t, dties.t, dcounts.t, topk, dids.t, drs.t};
    top_k_from_candidates(kg, s);
    ASSERT_EQ(download<int32_t>(drs, rs, s), host_vec<int32_t>(rs)) << "seed " << seed;
    ASSERT_EQ(download<int32_t>(dids, ids, s), host_vec<int32_t>(ids)) << "seed " << seed;
    for (int64_t t = 0; t < rows; ++t)
      (rs.data<int32_t>()[t] == 0 ? exact : overflowed)++;

    // Repeats: zeroed counts, the same counts and ids bit for bit.
    const auto first_ids = download<int32_t>(dids, ids, s);
    thresholds_from_sample(tg, s);
    indexer_threshold_select(g, s);
    top_k_from_candidates(kg, s);
    ASSERT_NO_THROW(check_status(st.t, s));
    ASSERT_EQ(download<int32_t>(dids, ids, s), first_ids) << "seed " << seed << " repeat";
    ASSERT_EQ(download<int32_t>(dcounts, counts, s), host_vec<int32_t>(counts));
  }
  EXPECT_GT(exact, 0);
  if (!small_tests()) EXPECT_GT(overflowed, 0);
}

// top_k_from_candidates from stores written in a shuffled slot order (as a parallel select may
// leave them) equals the CPU's from the same stores, for topk in shared memory and past it (the
// ids sorted in place in global memory), with duplicate scores and positions.
TEST(SdsaTopKGpu, AnySlotOrderAnySizeEqualsCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  std::mt19937 rng(5);
  const int sizes[][3] = {{5, 4, 3},        {300, 37, 50},     {4000, 2048, 3000},
                          {20000, 13000, 9000}, {1, 1, 0},     {700, 1000, 64}};
  for (const auto& sz : sizes) {
    const int64_t rows = 6, cap = sz[0], tie_cap = sz[2];
    const int topk = sz[1];
    if (small_tests() && cap > 4000) continue;
    HostTensor cand(DType::i32, {rows, cap, 2}), ties(DType::i32, {rows, std::max<int64_t>(tie_cap, 0)}),
        counts(DType::i32, {rows, 3});
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<int32_t> pos(size_t(cap + tie_cap));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      const int64_t nc = t == 0 ? cap : int64_t(rng() % (cap + 1));
      const int64_t nt = t == 1 ? tie_cap : tie_cap ? int64_t(rng() % (tie_cap + 1)) : 0;
      for (int64_t i = 0; i < nc; ++i) {
        float v = float(int(rng() % 9)) - 4.f;  // few levels: equal scores
        if (v == 0.f && rng() % 2) v = -0.f;
        if (rng() % 50 == 0) v = NAN;
        uint32_t b;
        std::memcpy(&b, &v, 4);
        cand.data<int32_t>()[(t * cap + i) * 2] = pos[size_t(i)];
        cand.data<int32_t>()[(t * cap + i) * 2 + 1] = int32_t(b);
      }
      if (t == 2 && nc > 1) cand.data<int32_t>()[(t * cap + 1) * 2] = cand.data<int32_t>()[t * cap * 2];
      for (int64_t i = 0; i < nt; ++i) ties.data<int32_t>()[t * tie_cap + i] = pos[size_t(cap + i)];
      counts.data<int32_t>()[3 * t] = int32_t(nc);
      counts.data<int32_t>()[3 * t + 1] = int32_t(nt);
      counts.data<int32_t>()[3 * t + 2] = int32_t(t % 2 ? 0 : 5);
    }
    HostTensor ids(DType::i32, {rows, topk}), rs(DType::i32, {rows});
    top_k_from_candidates(TopKFromCandidatesArgs{cand.t, ties.t, counts.t, topk, ids.t, rs.t});
    const DeviceTensor dc = to_device(cand, s), dt = to_device(ties, s), dn = to_device(counts, s);
    const DeviceTensor dids = device_like(ids, s), drs = device_like(rs, s);
    top_k_from_candidates(TopKFromCandidatesArgs{dc.t, dt.t, dn.t, topk, dids.t, drs.t}, s);
    ASSERT_EQ(download<int32_t>(drs, rs, s), host_vec<int32_t>(rs)) << "cap " << cap;
    const auto got = download<int32_t>(dids, ids, s);
    const auto want = host_vec<int32_t>(ids);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "cap " << cap << " topk " << topk << " row " << i / topk
                                 << " slot " << i % topk;
  }
}

TEST(SdsaTopKGpu, NegativeCountsAreReportedPerRow) {
  MSA_REQUIRE_GPU();
  TestStream s;
  HostTensor cand(DType::i32, {2, 4, 2}), ties(DType::i32, {2, 4}), counts(DType::i32, {2, 3});
  for (int i = 0; i < 8; ++i) cand.data<int32_t>()[i] = i;  // row 0: positions 0, 2, 4, 6
  const int32_t n[6] = {2, 0, 0, -5, 0, 0};
  std::memcpy(counts.data<int32_t>(), n, sizeof(n));
  HostTensor ids(DType::i32, {2, 3}), rs(DType::i32, {2});
  const DeviceTensor dc = to_device(cand, s), dt = to_device(ties, s), dn = to_device(counts, s);
  const DeviceTensor dids = device_like(ids, s), drs = device_like(rs, s);
  top_k_from_candidates(TopKFromCandidatesArgs{dc.t, dt.t, dn.t, 3, dids.t, drs.t}, s);
  EXPECT_EQ(download<int32_t>(drs, rs, s),
            (std::vector<int32_t>{int32_t(CandidateStatus::exact),
                                  int32_t(CandidateStatus::counts_invalid)}));
  EXPECT_EQ(download<int32_t>(dids, ids, s), (std::vector<int32_t>{0, 2, -1, -1, -1, -1}));
}

TEST(SdsaSampleGpu, GatherEqualsCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (uint32_t seed = 0; seed < uint32_t(cases(20)); ++seed) {
    const SdsaCase c = random_case(seed, small_tests());
    const int64_t batch = c.lens.t.numel();
    const int stride = 1 + int(seed % 7);
    std::vector<int32_t> off(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) off[size_t(b)] = int32_t((seed + b * 3) % stride);
    const HostTensor offsets = i32_tensor(off);
    int64_t S = 1;
    for (int64_t b = 0; b < batch; ++b)
      S = std::max<int64_t>(S, sdsa::sample_count(c.lens.data<int32_t>()[b], off[size_t(b)], stride));
    S += seed % 3;
    const bool fp4 = c.shape.fp4_keys;
    const int64_t row = fp4 ? c.shape.dim / 2 : c.shape.dim;
    HostTensor sample(fp4 ? DType::fp4x2 : DType::bf16, {batch, S, row}),
        sscale(DType::fp8_e4m3, {batch, S, std::max<int64_t>(c.shape.dim / 16, 1)}),
        lens(DType::i32, {batch});
    GatherKeySampleArgs a;
    a.cache = c.cache();
    a.stride = stride;
    a.offsets = offsets.t;
    a.sample = fp4 ? QTensor(sample.t, sscale.t) : QTensor(sample.t);
    a.sample_lens = lens.t;
    gather_key_sample(a);
    const DevCase d = upload(c, s);
    const DeviceTensor doff = to_device(offsets, s), dsample = device_like(sample, s),
                       dsscale = device_like(sscale, s), dlens = device_like(lens, s);
    const Status st(s);
    GatherKeySampleArgs g = a;
    g.cache = d.cache;
    g.offsets = doff.t;
    g.sample = fp4 ? QTensor(dsample.t, dsscale.t) : QTensor(dsample.t);
    g.sample_lens = dlens.t;
    g.status = st.t;
    gather_key_sample(g, s);
    ASSERT_NO_THROW(check_status(st.t, s));
    ASSERT_EQ(download<int32_t>(dlens, lens, s), host_vec<int32_t>(lens)) << "seed " << seed;
    // Every byte, the slots past sample_lens included (unwritten: poisoned on both).
    std::vector<uint8_t> got(sample.bytes()), want(static_cast<const uint8_t*>(sample.t.data),
                                                   static_cast<const uint8_t*>(sample.t.data) + sample.bytes());
    dsample.buf.download(got.data(), got.size(), s);
    ASSERT_EQ(got, want) << "seed " << seed;
    if (fp4) {
      std::vector<uint8_t> gs(sscale.bytes()), ws(static_cast<const uint8_t*>(sscale.t.data),
                                                  static_cast<const uint8_t*>(sscale.t.data) + sscale.bytes());
      dsscale.buf.download(gs.data(), gs.size(), s);
      ASSERT_EQ(gs, ws) << "seed " << seed;
    }
  }
}

TEST(SdsaQuantizeGpu, WritesEqualCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (uint32_t seed = 0; seed < uint32_t(cases(12)); ++seed) {
    std::mt19937 rng(seed);
    const int64_t dim = seed % 2 ? 64 : 128, pages = 5, ps = 16 << (seed % 3), n = 40;
    const DType dt = seed % 3 == 0 ? DType::f32 : seed % 3 == 1 ? DType::bf16 : DType::f16;
    HostTensor key(dt, {n, dim}), query(dt, {7, dim});
    for (HostTensor* x : {&key, &query})
      for (int64_t i = 0; i < x->t.numel(); ++i) {
        float v = std::normal_distribution<float>(0.f, 3.f)(rng);
        if (rng() % 200 == 0) v = 0.f;
        if (dt == DType::f32) x->data<float>()[i] = v;
        else if (dt == DType::bf16) x->data<uint16_t>()[i] = codec::float_to_bf16(v);
        else x->data<uint16_t>()[i] = codec::float_to_f16(v);
      }
    std::vector<int32_t> slot(size_t(pages * ps));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    slot.resize(size_t(n));
    for (int64_t i = 0; i < n; i += 5) slot[size_t(i)] = -1 - int32_t(i);  // skipped
    const HostTensor slots = i32_tensor(slot);
    HostTensor cache(DType::fp4x2, {pages, ps, dim / 2}), cscale(DType::fp8_e4m3, {pages, ps, dim / 16}),
        qout(DType::fp4x2, {7, dim / 2}), qscale(DType::fp8_e4m3, {7, dim / 16});
    const float kg = 0.37f, qg = 1.f;
    QuantizeIndexQKArgs a;
    a.key = key.t;
    a.slots = slots.t;
    a.key_cache = QTensor(cache.t, cscale.t, kg);
    a.query = query.t;
    a.query_out = QTensor(qout.t, qscale.t, qg);
    quantize_write_index_qk_nvfp4(a);
    const DeviceTensor dkey = to_device(key, s), dq = to_device(query, s), dslots = to_device(slots, s);
    const DeviceTensor dcache = device_like(cache, s), dcs = device_like(cscale, s),
                       dqo = device_like(qout, s), dqs = device_like(qscale, s);
    const Status st(s);
    QuantizeIndexQKArgs g;
    g.key = dkey.t;
    g.slots = dslots.t;
    g.key_cache = QTensor(dcache.t, dcs.t, kg);
    g.query = dq.t;
    g.query_out = QTensor(dqo.t, dqs.t, qg);
    g.status = st.t;
    quantize_write_index_qk_nvfp4(g, s);
    ASSERT_NO_THROW(check_status(st.t, s));
    for (const auto& [h, dv] : {std::pair{&cache, &dcache}, {&cscale, &dcs}, {&qout, &dqo}, {&qscale, &dqs}}) {
      std::vector<uint8_t> got(h->bytes()), want(static_cast<const uint8_t*>(h->t.data),
                                                 static_cast<const uint8_t*>(h->t.data) + h->bytes());
      dv->buf.download(got.data(), got.size(), s);
      ASSERT_EQ(got, want) << "seed " << seed << " (unwritten slots stay poisoned on both)";
    }
  }
}

// Device-side value errors: each flagged with its details, the bad row, request or entry
// skipped, no access out of bounds (run under compute-sanitizer), the other rows still right.
TEST(SdsaGpu, BadValuesAreFlaggedAndSkipped) {
  MSA_REQUIRE_GPU();
  TestStream s;
  SdsaShape sh;
  sh.page_size = 16;
  sh.seq_lens = {40, 20};
  sh.row_requests = {0, 1, 0};
  sh.row_lens = true;
  // bf16 (the fp64 chain), and NVFP4 queries over NVFP4 keys at D = 128 with pages of 16 (the
  // exact path's page runs by the bulk copy engine).
  for (const bool fp4 : {false, true}) {
    SCOPED_TRACE(fp4 ? "nvfp4, D 128" : "bf16, D 32");
    sh.dim = fp4 ? 128 : 32;
    sh.fp4_keys = sh.fp4_query = fp4;
    // Row 0 sees all 40 keys of request 0 (past the narrow width below), row 2 at most 25.
    const auto make = [&sh] {
      SdsaCase x = make_sdsa_case(sh, 3);
      x.row_lens.data<int32_t>()[0] = 40;
      x.row_lens.data<int32_t>()[2] = std::min(x.row_lens.data<int32_t>()[2], 25);
      return x;
    };
    const SdsaCase c = make();
    const int64_t width = 48, table_keys = c.table.t.shape[1] * sh.page_size;
    HostTensor ref(DType::f32, {3, width});
    IndexerScoresArgs ra;
    ra.rows = c.rows();
    ra.cache = c.cache();
    ra.scores = ref.t;
    indexer_scores(ra);
    struct Bad {
      std::string what;
      StatusCode code;
      int32_t a, b, c;
      int64_t bad_row;  // the row computed as empty (-1: none)
    };
    const std::vector<Bad> bads = {
        {"request", StatusCode::row_request_invalid, 2, 7, 2, 2},
        {"row_len", StatusCode::row_len_invalid, 1, 21, 20, 1},
        {"seq_len", StatusCode::seq_len_invalid, 1, 999, int32_t(table_keys), 1},
        {"page", StatusCode::page_id_out_of_range, 0, 1, -3, -1},
        {"width", StatusCode::row_past_scores, 0, 40, 30, -1}};
    for (const Bad& b : bads) {
      SdsaCase m = make();
      int64_t w = width;
      if (b.what == "request") m.requests.data<int32_t>()[2] = 7;
      if (b.what == "row_len") m.row_lens.data<int32_t>()[1] = 21;
      if (b.what == "seq_len") m.lens.data<int32_t>()[1] = 999;
      if (b.what == "page") m.table.data<int32_t>()[1] = -3;  // request 0, column 1: keys 16-31
      if (b.what == "width") w = 30;
      const DevCase d = upload(m, s);
      HostTensor like(DType::f32, {3, w});
      const DeviceTensor out = device_like(like, s);
      const Status st(s);
      indexer_scores(scores_args(d, out, st.t), s);
      expect_status(st.read(s), b.code, b.a, b.b, b.c);
      EXPECT_THROW(check_status(st.t, s), Error) << b.what;
      const auto got = bits_of(download<float>(out, like, s));
      for (int64_t t = 0; t < 3; ++t)
        for (int64_t j = 0; j < w; ++j) {
          const uint32_t v = got[size_t(t * w + j)];
          if (b.what == "page" && m.requests.data<int32_t>()[t] == 0 && j >= 16 && j < 32 &&
              j < c.row_len(t)) {
            EXPECT_TRUE(std::isnan(codec::bits_float(v))) << "a key of the bad page scores NaN";
            continue;
          }
          const float want = t == b.bad_row ? -kInf : ref.data<float>()[t * width + j];
          EXPECT_EQ(v, bits_of({want})[0]) << b.what << " row " << t << " column " << j;
        }
      // The select skips the same rows: no store write for them; with a -inf threshold every key
      // of the others is a candidate.
      HostTensor cand(DType::i32, {3, 64, 2}), ties(DType::i32, {3, 4}), counts(DType::i32, {3, 3}),
          thr(DType::f32, {3});
      std::memset(counts.data<int32_t>(), 0, counts.bytes());
      for (int t = 0; t < 3; ++t) thr.data<float>()[t] = -kInf;
      const DeviceTensor dcand = device_like(cand, s), dties = device_like(ties, s),
                         dcounts = to_device(counts, s), dthr = to_device(thr, s);
      const Status st2(s);
      indexer_threshold_select(select_args(d, dthr, dcand, dties, dcounts, st2.t), s);
      if (b.code == StatusCode::row_past_scores)  // the select writes no scores: nothing to flag
        EXPECT_EQ(st2.read(s)[0], 0);
      else
        expect_status(st2.read(s), b.code, b.a, b.b, b.c);
      const auto gcounts = download<int32_t>(dcounts, counts, s);
      const auto gcand = download<int32_t>(dcand, cand, s);
      for (int64_t t = 0; t < 3; ++t) {
        const int32_t n = t == b.bad_row ? 0 : c.row_len(t);
        EXPECT_EQ(gcounts[size_t(3 * t)], n) << b.what << " row " << t;
        for (int64_t i = n; i < 64; ++i) EXPECT_EQ(gcand[size_t((t * 64 + i) * 2)], -1) << b.what;
      }
    }
  }
}

TEST(SdsaGpu, BadSampleAndSlotValuesAreFlagged) {
  MSA_REQUIRE_GPU();
  TestStream s;
  SdsaShape sh;
  sh.page_size = 16;
  sh.dim = 32;
  sh.seq_lens = {40, 20};
  sh.row_requests = {0};
  const SdsaCase c = make_sdsa_case(sh, 4);
  const DevCase d = upload(c, s);
  for (int variant = 0; variant < 2; ++variant) {
    // Offsets {0, 5} with stride 3: entry 1 out of range; or S = 10 < 14 samples of request 0.
    const HostTensor off = i32_tensor(variant == 0 ? std::vector<int32_t>{0, 5} : std::vector<int32_t>{0, 0});
    const int64_t S = variant == 0 ? 14 : 10;
    HostTensor sample(DType::bf16, {2, S, 32}), lens(DType::i32, {2});
    const DeviceTensor doff = to_device(off, s), dsample = device_like(sample, s), dlens = device_like(lens, s);
    const Status st(s);
    GatherKeySampleArgs g;
    g.cache = d.cache;
    g.stride = 3;
    g.offsets = doff.t;
    g.sample = QTensor(dsample.t);
    g.sample_lens = dlens.t;
    g.status = st.t;
    gather_key_sample(g, s);
    if (variant == 0) {
      expect_status(st.read(s), StatusCode::sample_offset_invalid, 1, 5, 3);
      EXPECT_EQ(download<int32_t>(dlens, lens, s), (std::vector<int32_t>{14, 0}));
    } else {
      expect_status(st.read(s), StatusCode::sample_past_capacity, 0, 14, 10);
      EXPECT_EQ(download<int32_t>(dlens, lens, s), (std::vector<int32_t>{0, 7}));
    }
  }
  // A slot past the pool: flagged, not written; the other key written.
  HostTensor key(DType::f32, {2, 32}), cache(DType::fp4x2, {2, 4, 16}), cs(DType::fp8_e4m3, {2, 4, 2});
  for (int i = 0; i < 64; ++i) key.data<float>()[i] = float(i % 7) - 3.f;
  const HostTensor slots = i32_tensor({8, 5});
  const DeviceTensor dk = to_device(key, s), dsl = to_device(slots, s), dc = device_like(cache, s),
                     dcs = device_like(cs, s);
  const Status st(s);
  QuantizeIndexQKArgs q;
  q.key = dk.t;
  q.slots = dsl.t;
  q.key_cache = QTensor(dc.t, dcs.t, 1.f);
  q.status = st.t;
  quantize_write_index_qk_nvfp4(q, s);
  expect_status(st.read(s), StatusCode::slot_out_of_range, 0, 8, 8);
  std::vector<uint8_t> got(cache.bytes());
  dc.buf.download(got.data(), got.size(), s);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i] != 0xff, i / 16 == 5) << "byte " << i << ": only slot 5 is written";
}

}  // namespace
}  // namespace msa::test
