// CUDA mqa_logits and paged_mqa_logits (src/cuda/sm90/mqa_logits/) against the CPU reference on
// the same bits: random shapes (heads 4-128, every next_n 1-4, block sizes 32/64/128, lengths 0
// and non-multiples of the block, empty and partial ranges), negative weights, NaN bytes in the
// pool's unused slots, clean and unclean outputs (untouched columns keep their poison), padding
// columns past max_seq_len untouched; the device-side checks of what the seed leaves undefined.
// Outputs are poisoned (NaN) before each run. MSA_TEST_SMALL=1 shrinks the sweep.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <optional>
#include <sstream>
#include <vector>

#include "support/device_tensor.h"
#include "support/paged_logits.h"

namespace msa::test {
namespace {

// A random finite e4m3 byte of magnitude below 8 (never NaN).
uint8_t fp8_byte(std::mt19937& rng) {
  uint8_t b;
  do b = uint8_t(rng() % 256); while ((b & 0x7f) == 0x7f || (b & 0x78) > 0x50);
  return b;
}

void fill_fp8(HostTensor& x, std::mt19937& rng) {
  for (int64_t i = 0; i < x.t.numel(); ++i) x.data<uint8_t>()[i] = fp8_byte(rng);
}

void fill_weights(HostTensor& w, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < w.t.numel(); ++i) w.data<float>()[i] = u(rng);
}

// GPU logits against the CPU's, element by element: NaN and -inf at the same places (NaN bits
// of the poison included: untouched columns), finite values within 1e-3 relative L2 overall
// (the wgmma sums each head's dot product in fp32, the reference exactly).
void expect_same_logits(const HostTensor& got, const HostTensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  double d2 = 0, r2 = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < want.t.numel(); ++i) {
    const float g = got.data<float>()[i], r = want.data<float>()[i];
    if (std::isnan(r) || std::isinf(r) || std::isnan(g) || std::isinf(g)) {
      uint32_t gb, rb;
      std::memcpy(&gb, &g, 4);
      std::memcpy(&rb, &r, 4);
      const bool same = std::isnan(r) ? std::isnan(g) : gb == rb;
      if (!same && bad++ < 8) ADD_FAILURE() << "element " << i << ": got " << g << ", want " << r;
      continue;
    }
    d2 += double(g - r) * (g - r);
    r2 += double(r) * r;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2), 1e-3) << "relative L2 error";
}

struct RaggedCase {
  int64_t t, s, heads;
  bool scale, clean;
};

TEST(MqaLogitsGpu, RaggedMatchesCpu) {
  MSA_REQUIRE_GPU();
  std::vector<RaggedCase> cases = {{1, 1, 4, true, true},      {37, 300, 64, true, true},
                                   {100, 1000, 16, false, true}, {9, 257, 128, true, false},
                                   {33, 130, 20, true, true},   {64, 512, 32, true, false},
                                   {70, 129, 64, false, false}, {5, 0, 8, true, true}};
  if (small_tests()) cases.resize(4);
  std::mt19937 rng(5);
  TestStream stream;
  for (const RaggedCase& c : cases) {
    HostTensor q(DType::fp8_e4m3, {c.t, c.heads, 128}), k(DType::fp8_e4m3, {c.s, 128}),
        ksc(DType::f32, {c.s}), w(DType::f32, {c.t, c.heads}), ks(DType::i32, {c.t}),
        ke(DType::i32, {c.t}), want(DType::f32, {c.t, c.s}), got(DType::f32, {c.t, c.s});
    fill_fp8(q, rng);
    fill_fp8(k, rng);
    fill_weights(w, rng);
    std::uniform_real_distribution<float> u(0.25f, 2.f);
    for (int64_t i = 0; i < c.s; ++i) ksc.data<float>()[i] = u(rng);
    // Causal-like rows, random ranges and empty ones.
    for (int64_t r = 0; r < c.t; ++r) {
      int32_t lo = 0, hi = int32_t(std::min<int64_t>(c.s, (r + 1) * c.s / c.t));
      if (r % 3 == 1 && c.s > 0) {
        lo = int32_t(rng() % c.s);
        hi = lo + int32_t(rng() % (c.s - lo + 1));
      } else if (r % 7 == 5) {
        lo = hi;
      }
      ks.data<int32_t>()[r] = lo;
      ke.data<int32_t>()[r] = hi;
    }
    std::memset(want.t.data, 0xff, want.bytes());  // the GPU output's poison
    MqaLogitsArgs a;
    a.q = q.t;
    a.k = c.scale ? QTensor(k.t, ksc.t) : QTensor(k.t);
    a.weights = w.t;
    a.ks = ks.t;
    a.ke = ke.t;
    a.logits = want.t;
    a.clean_logits = c.clean;
    mqa_logits(a);

    const DeviceTensor dq = to_device(q, stream), dk = to_device(k, stream),
                       dsc = to_device(ksc, stream), dw = to_device(w, stream),
                       dks = to_device(ks, stream), dke = to_device(ke, stream);
    DeviceTensor dout = device_like(got, stream);
    DeviceBuffer status(16);
    const Tensor st(status.get(), DType::i32, {4}, gpu0());
    clear_status(st, stream);
    MqaLogitsArgs g;
    g.q = dq.t;
    g.k = c.scale ? QTensor(dk.t, dsc.t) : QTensor(dk.t);
    g.weights = dw.t;
    g.ks = dks.t;
    g.ke = dke.t;
    g.logits = dout.t;
    g.clean_logits = c.clean;
    g.status = st;
    mqa_logits(g, stream);
    check_status(st, stream);
    copy_to_host(dout, got, stream);
    std::ostringstream os;
    os << "T=" << c.t << " S=" << c.s << " H=" << c.heads << (c.scale ? " scale" : "")
       << (c.clean ? " clean" : "");
    expect_same_logits(got, want, os.str());
  }
}

// A fused page pool (seed 001: per block, the values of block_size tokens, then their f32
// scales) for B requests; unused slots of a used block hold NaN bytes and NaN scales, unused
// blocks NaN throughout.
PagedLogits make_paged(const std::vector<int32_t>& lens, int64_t next_n, int64_t heads, int64_t bs,
                 int64_t max_len, int64_t width, std::mt19937& rng) {
  const int64_t batch = int64_t(lens.size());
  int64_t blocks = 1;
  for (int32_t l : lens) blocks += (l + bs - 1) / bs;
  PagedLogits p{HostTensor(DType::fp8_e4m3, {batch, next_n, heads, 128}),
          HostTensor(DType::u8, {blocks, bs, 1, 132}), HostTensor(DType::f32, {batch * next_n, heads}),
          HostTensor(DType::i32, {batch, width}), HostTensor(DType::i32, {batch}),
          HostTensor(DType::f32, {batch * next_n, max_len + 3}), max_len};
  fill_fp8(p.q, rng);
  fill_weights(p.w, rng);
  std::memset(p.kv.t.data, 0xff, p.kv.bytes());  // NaN values and scales where no key is
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::fill(p.tables.data<int32_t>(), p.tables.data<int32_t>() + batch * width, -1);
  std::uniform_real_distribution<float> u(0.25f, 2.f);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    p.lens.data<int32_t>()[b] = lens[b];
    for (int64_t j = 0; j < lens[b]; ++j) {
      if (j % bs == 0) p.tables.data<int32_t>()[b * width + j / bs] = order[next++];
      uint8_t* base = p.kv.data<uint8_t>() + p.tables.data<int32_t>()[b * width + j / bs] * bs * 132;
      for (int64_t d = 0; d < 128; ++d) base[(j % bs) * 128 + d] = fp8_byte(rng);
      const float sc = u(rng);
      std::memcpy(base + bs * 128 + 4 * (j % bs), &sc, 4);
    }
  }
  return p;
}

// The MXFP4 form of make_paged (seed 001's fp4_paged_mqa_logits): q packed e2m1 with UE8M0
// scale bytes in q_sf, pool tokens of 64 value bytes then the block's 4-byte scale words; scale
// exponents drawn from [127 - spread, 127 + spread] (spread past 7: some tokens' groups span more
// than e4m3's 14 binades on the GPU, fp4_load.cuh). Unused slots hold 0xff (NaN scales).
PagedLogits make_paged_fp4(const std::vector<int32_t>& lens, int64_t next_n, int64_t heads,
                           int64_t bs, int64_t max_len, int64_t width, int spread,
                           std::mt19937& rng, HostTensor& q_sf) {
  const int64_t batch = int64_t(lens.size());
  int64_t blocks = 1;
  for (int32_t l : lens) blocks += (l + bs - 1) / bs;
  PagedLogits p{HostTensor(DType::fp4x2, {batch, next_n, heads, 64}),
                HostTensor(DType::u8, {blocks, bs, 1, 68}),
                HostTensor(DType::f32, {batch * next_n, heads}), HostTensor(DType::i32, {batch, width}),
                HostTensor(DType::i32, {batch}), HostTensor(DType::f32, {batch * next_n, max_len + 3}),
                max_len};
  std::uniform_int_distribution<int> byte(0, 255), ex(127 - spread, 127 + spread);
  for (int64_t i = 0; i < p.q.t.numel(); ++i) p.q.data<uint8_t>()[i] = uint8_t(byte(rng));
  q_sf = HostTensor(DType::u8, {batch, next_n, heads, 4});
  for (int64_t i = 0; i < q_sf.t.numel(); ++i) q_sf.data<uint8_t>()[i] = uint8_t(ex(rng));
  fill_weights(p.w, rng);
  std::memset(p.kv.t.data, 0xff, p.kv.bytes());
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::fill(p.tables.data<int32_t>(), p.tables.data<int32_t>() + batch * width, -1);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    p.lens.data<int32_t>()[b] = lens[b];
    for (int64_t j = 0; j < lens[b]; ++j) {
      if (j % bs == 0) p.tables.data<int32_t>()[b * width + j / bs] = order[next++];
      uint8_t* base = p.kv.data<uint8_t>() + p.tables.data<int32_t>()[b * width + j / bs] * bs * 68;
      for (int64_t d = 0; d < 64; ++d) base[(j % bs) * 64 + d] = uint8_t(byte(rng));
      for (int64_t g = 0; g < 4; ++g) base[bs * 64 + 4 * (j % bs) + g] = uint8_t(ex(rng));
    }
  }
  return p;
}

// The paged problem on the GPU (q_sf: MXFP4 q's scales); returns the logits and the status words.
std::vector<int32_t> run_paged_gpu(const PagedLogits& p, bool clean, HostTensor& got, cudaStream_t stream,
                                   const HostTensor* q_sf = nullptr) {
  const DeviceTensor dq = to_device(p.q, stream), dkv = to_device(p.kv, stream),
                     dw = to_device(p.w, stream), dt = to_device(p.tables, stream),
                     dl = to_device(p.lens, stream);
  std::optional<DeviceTensor> dsf;
  if (q_sf) dsf = to_device(*q_sf, stream);
  DeviceTensor dout = device_like(got, stream);
  DeviceBuffer status(16);
  const Tensor st(status.get(), DType::i32, {4}, gpu0());
  clear_status(st, stream);
  PagedMqaLogitsArgs a;
  a.q = dq.t;
  a.kv_fused = dkv.t;
  a.weights = dw.t;
  a.block_tables = dt.t;
  a.seq_lens = dl.t;
  a.max_seq_len = p.max_seq_len;
  a.logits = dout.t;
  a.clean_logits = clean;
  a.status = st;
  if (dsf) a.q_sf = dsf->t;
  paged_mqa_logits(a, stream);
  copy_to_host(dout, got, stream);
  return status.download<int32_t>(4, stream);
}

struct PagedCase {
  std::vector<int32_t> lens;
  int64_t next_n, heads, bs, extra;  // max_seq_len = max(lens) + extra
  bool clean;
};

TEST(MqaLogitsGpu, PagedMatchesCpu) {
  MSA_REQUIRE_GPU();
  std::vector<PagedCase> cases = {
      {{300, 0, 7, 129}, 2, 64, 64, 5, true},  {{1000}, 1, 64, 128, 0, true},
      {{37, 600}, 3, 16, 32, 100, true},       {{256, 255, 1}, 4, 128, 64, 0, false},
      {{90, 2}, 4, 8, 128, 40, true},          {{513, 64}, 2, 20, 32, 3, false},
      {{0, 0}, 1, 64, 64, 0, true},            {{4500, 3000, 17}, 2, 64, 64, 1, true}};
  if (small_tests()) cases.resize(4);
  std::mt19937 rng(6);
  TestStream stream;
  for (const PagedCase& c : cases) {
    const int64_t max_len = *std::max_element(c.lens.begin(), c.lens.end()) + c.extra;
    const int64_t width = (max_len + c.bs - 1) / c.bs + 1;
    PagedLogits p = make_paged(c.lens, c.next_n, c.heads, c.bs, max_len, width, rng);
    std::memset(p.out.t.data, 0xff, p.out.bytes());
    PagedMqaLogitsArgs a = p.args();
    a.clean_logits = c.clean;
    paged_mqa_logits(a);
    HostTensor got(DType::f32, {p.out.t.shape[0], p.out.t.shape[1]});
    const std::vector<int32_t> st = run_paged_gpu(p, c.clean, got, stream);
    EXPECT_EQ(st[0], 0) << describe_status(st.data());
    std::ostringstream os;
    os << "B=" << c.lens.size() << " next_n=" << c.next_n << " H=" << c.heads << " bs=" << c.bs
       << " max_seq_len=" << max_len << (c.clean ? " clean" : "");
    expect_same_logits(got, p.out, os.str());
  }
}

// MXFP4 paged logits (e4m3 tiles converted in shared memory, fp4_load.cuh) against the CPU's
// exact sums: block sizes 32 / 64 / 128, next_n 1-4, H 8-128, scale exponents within e4m3's reach
// and (spread 20) beyond it, a NaN scale in a used key (its column NaN), bad ids reported.
TEST(MqaLogitsGpu, PagedFp4MatchesCpu) {
  MSA_REQUIRE_GPU();
  struct Fp4Case {
    std::vector<int32_t> lens;
    int64_t next_n, heads, bs, extra;
    int spread;
    bool clean;
  };
  std::vector<Fp4Case> cases = {
      {{300, 0, 7, 129}, 2, 64, 64, 5, 4, true},  {{1000}, 1, 64, 128, 0, 6, true},
      {{37, 600}, 3, 16, 32, 100, 3, true},       {{256, 255, 1}, 4, 128, 64, 0, 5, false},
      {{90, 2}, 4, 8, 128, 40, 20, true},         {{513, 64}, 2, 20, 32, 3, 7, false},
      {{4500, 3000, 17}, 2, 64, 64, 1, 4, true}};
  if (small_tests()) cases.resize(3);
  std::mt19937 rng(16);
  TestStream stream;
  int idx = 0;
  for (const Fp4Case& c : cases) {
    const int64_t max_len = *std::max_element(c.lens.begin(), c.lens.end()) + c.extra;
    const int64_t width = (max_len + c.bs - 1) / c.bs + 1;
    HostTensor q_sf(DType::u8, {1});
    PagedLogits p = make_paged_fp4(c.lens, c.next_n, c.heads, c.bs, max_len, width, c.spread, rng, q_sf);
    if (idx++ == 0) {  // a NaN scale in group 2 of request 0's key 5
      uint8_t* base = p.kv.data<uint8_t>() + p.tables.data<int32_t>()[0] * c.bs * 68;
      base[c.bs * 64 + 4 * 5 + 2] = 0xff;
    }
    std::memset(p.out.t.data, 0xff, p.out.bytes());
    PagedMqaLogitsArgs a = p.args();
    a.q_sf = q_sf.t;
    a.clean_logits = c.clean;
    paged_mqa_logits(a);
    HostTensor got(DType::f32, {p.out.t.shape[0], p.out.t.shape[1]});
    const std::vector<int32_t> st = run_paged_gpu(p, c.clean, got, stream, &q_sf);
    EXPECT_EQ(st[0], 0) << describe_status(st.data());
    std::ostringstream os;
    os << "fp4 B=" << c.lens.size() << " next_n=" << c.next_n << " H=" << c.heads << " bs=" << c.bs
       << " max_seq_len=" << max_len << " spread=" << c.spread << (c.clean ? " clean" : "");
    expect_same_logits(got, p.out, os.str());
  }
  {  // a block id outside the pool, reported, never read
    HostTensor q_sf(DType::u8, {1});
    PagedLogits p = make_paged_fp4({200, 90}, 2, 64, 64, 200, 4, 3, rng, q_sf);
    p.tables.data<int32_t>()[4 + 1] = 1 << 20;  // batch 1, column 1
    HostTensor got(DType::f32, {4, 203});
    expect_status(run_paged_gpu(p, true, got, stream, &q_sf), StatusCode::page_id_out_of_range, 1,
                  1, 1 << 20);
  }
}

// What the seed leaves undefined, reported through the status buffer, with no out-of-bounds
// access (run under compute-sanitizer): a length past max_seq_len, a block id outside the pool,
// a table too narrow for a length; a ragged row with ks > ke.
TEST(MqaLogitsGpu, BadInputsReported) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(7);
  TestStream stream;
  {
    PagedLogits p = make_paged({200, 90}, 2, 64, 64, 200, 4, rng);
    p.lens.data<int32_t>()[1] = 260;  // past max_seq_len = 200
    HostTensor got(DType::f32, {4, 203});
    expect_status(run_paged_gpu(p, true, got, stream), StatusCode::seq_len_invalid, 1, 260, 200);
  }
  {
    PagedLogits p = make_paged({200, 90}, 2, 64, 64, 200, 4, rng);
    p.tables.data<int32_t>()[4 + 1] = 1 << 20;  // batch 1, column 1
    HostTensor got(DType::f32, {4, 203});
    expect_status(run_paged_gpu(p, true, got, stream), StatusCode::page_id_out_of_range, 1, 1,
                  1 << 20);
  }
  {
    PagedLogits p = make_paged({200}, 1, 64, 32, 200, 7, rng);  // needs 7 columns
    HostTensor narrow(DType::i32, {1, 3});
    std::memcpy(narrow.t.data, p.tables.t.data, 3 * 4);
    p.tables = std::move(narrow);
    HostTensor got(DType::f32, {1, 203});
    expect_status(run_paged_gpu(p, true, got, stream), StatusCode::block_table_narrow, 0, 7, 3);
  }
  {
    HostTensor q(DType::fp8_e4m3, {3, 64, 128}), k(DType::fp8_e4m3, {50, 128}),
        w(DType::f32, {3, 64}), ks(DType::i32, {3}), ke(DType::i32, {3}), out(DType::f32, {3, 50});
    fill_fp8(q, rng);
    fill_fp8(k, rng);
    fill_weights(w, rng);
    const int32_t lo[3] = {0, 30, 0}, hi[3] = {10, 20, 60};  // row 1: ks > ke
    std::memcpy(ks.t.data, lo, 12);
    std::memcpy(ke.t.data, hi, 12);
    const DeviceTensor dq = to_device(q, stream), dk = to_device(k, stream),
                       dw = to_device(w, stream), dks = to_device(ks, stream),
                       dke = to_device(ke, stream);
    DeviceTensor dout = device_like(out, stream);
    DeviceBuffer status(16);
    const Tensor st(status.get(), DType::i32, {4}, gpu0());
    clear_status(st, stream);
    MqaLogitsArgs a;
    a.q = dq.t;
    a.k = QTensor(dk.t);
    a.weights = dw.t;
    a.ks = dks.t;
    a.ke = dke.t;
    a.logits = dout.t;
    a.status = st;
    mqa_logits(a, stream);
    const std::vector<int32_t> words = status.download<int32_t>(4, stream);
    EXPECT_EQ(words[0], int32_t(StatusCode::key_range_invalid)) << describe_status(words.data());
    EXPECT_EQ(words[2], 30);
  }
}

// mqa_logits_topk / paged_mqa_logits_topk on the GPU: the same ids as the two steps on the GPU
// (the same kernels over the same rows), for workspaces of one row (one batch), a few, and the
// default size; a bad range / length is reported with the call's row / batch, wherever the
// chunks fall.
std::vector<int32_t> gpu_ids(const DeviceTensor& ids, int64_t n, cudaStream_t stream) {
  HostTensor h(DType::i32, {n});
  copy_to_host(ids, h, stream);
  return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + n);
}

TEST(MqaLogitsGpu, LogitsTopKEqualTwoSteps) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(9);
  TestStream stream;
  const int64_t t_rows = small_tests() ? 40 : 300, s_keys = small_tests() ? 300 : 1500, heads = 64;
  const int topk = small_tests() ? 50 : 200;
  HostTensor q(DType::fp8_e4m3, {t_rows, heads, 128}), k(DType::fp8_e4m3, {s_keys, 128}),
      ksc(DType::f32, {s_keys}), w(DType::f32, {t_rows, heads}), ks(DType::i32, {t_rows}),
      ke(DType::i32, {t_rows}), ids(DType::i32, {t_rows, topk});
  fill_fp8(q, rng);
  fill_fp8(k, rng);
  fill_weights(w, rng);
  std::uniform_real_distribution<float> u(0.25f, 2.f);
  for (int64_t i = 0; i < s_keys; ++i) ksc.data<float>()[i] = u(rng);
  for (int64_t r = 0; r < t_rows; ++r) {
    int32_t lo = 0, hi = int32_t((r + 1) * s_keys / t_rows);
    if (r % 5 == 2) lo = hi / 2;
    if (r % 11 == 7) lo = hi;
    ks.data<int32_t>()[r] = lo;
    ke.data<int32_t>()[r] = hi;
  }
  const DeviceTensor dq = to_device(q, stream), dk = to_device(k, stream), dsc = to_device(ksc, stream),
                     dw = to_device(w, stream), dks = to_device(ks, stream), dke = to_device(ke, stream);
  DeviceBuffer status(16);
  const Tensor st(status.get(), DType::i32, {4}, gpu0());
  clear_status(st, stream);
  // The two steps.
  DeviceBuffer logits(static_cast<size_t>(t_rows * s_keys * 4));
  MqaLogitsArgs la;
  la.q = dq.t;
  la.k = QTensor(dk.t, dsc.t);
  la.weights = dw.t;
  la.ks = dks.t;
  la.ke = dke.t;
  la.logits = Tensor(logits.get(), DType::f32, {t_rows, s_keys}, gpu0());
  la.status = st;
  mqa_logits(la, stream);
  DeviceTensor want = device_like(ids, stream);
  TokenTopKArgs ta;
  ta.logits = la.logits;
  ta.ks = dks.t;
  ta.ke = dke.t;
  ta.topk = topk;
  ta.ids = want.t;
  ta.status = st;
  token_topk(ta, stream);
  const std::vector<int32_t> ref = gpu_ids(want, t_rows * topk, stream);
  const int64_t row = (s_keys * 4 + 15) / 16 * 16;
  for (const int64_t bytes : {row, 7 * row, mqa_logits_topk_workspace_bytes(t_rows, s_keys)}) {
    DeviceBuffer ws(static_cast<size_t>(bytes));
    DeviceTensor got = device_like(ids, stream);
    mqa_logits_topk(logits_topk_args(la, topk, got.t, Tensor(ws.get(), DType::u8, {bytes}, gpu0())), stream);
    EXPECT_EQ(gpu_ids(got, t_rows * topk, stream), ref) << "workspace of " << bytes / row << " rows";
  }
  EXPECT_EQ(status.download<int32_t>(4, stream)[0], 0);
  // A bad range in a later chunk names its row.
  const int64_t bad = t_rows - 13;
  ks.data<int32_t>()[bad] = 9;
  ke.data<int32_t>()[bad] = 4;
  const DeviceTensor dks2 = to_device(ks, stream), dke2 = to_device(ke, stream);
  DeviceBuffer ws(static_cast<size_t>(7 * row));
  DeviceTensor got = device_like(ids, stream);
  MqaLogitsTopKArgs a = logits_topk_args(la, topk, got.t, Tensor(ws.get(), DType::u8, {7 * row}, gpu0()));
  a.ks = dks2.t;
  a.ke = dke2.t;
  mqa_logits_topk(a, stream);
  expect_status(status.download<int32_t>(4, stream), StatusCode::key_range_invalid, int32_t(bad), 9, 4);
  const std::vector<int32_t> bad_ids = gpu_ids(got, t_rows * topk, stream);
  for (int j = 0; j < topk; ++j) EXPECT_EQ(bad_ids[bad * topk + j], -1) << j;  // read as empty
}

TEST(MqaLogitsGpu, PagedLogitsTopKEqualTwoSteps) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(10);
  TestStream stream;
  std::vector<int32_t> lens;
  for (int b = 0; b < (small_tests() ? 6 : 20); ++b) lens.push_back(int32_t(rng() % 700));
  lens[1] = 0;
  const int64_t next_n = 2, heads = 32, bs = 64, max_len = 700, width = 12;
  const int topk = 100;
  PagedLogits p = make_paged(lens, next_n, heads, bs, max_len, width, rng);
  const int64_t batch = int64_t(lens.size()), rows = batch * next_n;
  const DeviceTensor dq = to_device(p.q, stream), dkv = to_device(p.kv, stream),
                     dw = to_device(p.w, stream), dt = to_device(p.tables, stream);
  DeviceBuffer status(16);
  const Tensor st(status.get(), DType::i32, {4}, gpu0());
  clear_status(st, stream);
  for (const bool bad_len : {false, true}) {
    if (bad_len) p.lens.data<int32_t>()[batch - 3] = int32_t(max_len + 5);
    const DeviceTensor dl = to_device(p.lens, stream);
    HostTensor ids(DType::i32, {rows, topk});
    DeviceBuffer logits(static_cast<size_t>(rows * max_len * 4));
    PagedMqaLogitsArgs la;
    la.q = dq.t;
    la.kv_fused = dkv.t;
    la.weights = dw.t;
    la.block_tables = dt.t;
    la.seq_lens = dl.t;
    la.max_seq_len = max_len;
    la.logits = Tensor(logits.get(), DType::f32, {rows, max_len}, gpu0());
    la.status = st;
    paged_mqa_logits(la, stream);
    DeviceTensor want = device_like(ids, stream);
    TokenTopKArgs ta;
    ta.logits = la.logits;
    ta.topk = topk;
    ta.ids = want.t;
    ta.status = st;
    token_topk(ta, stream);
    const std::vector<int32_t> ref = gpu_ids(want, rows * topk, stream);
    clear_status(st, stream);
    const int64_t row = (max_len * 4 + 15) / 16 * 16;
    for (const int64_t bytes : {next_n * row, 3 * next_n * row + 100,
                                paged_mqa_logits_topk_workspace_bytes(batch, next_n, max_len)}) {
      DeviceBuffer ws(static_cast<size_t>(bytes));
      DeviceTensor got = device_like(ids, stream);
      paged_mqa_logits_topk(logits_topk_args(la, topk, got.t, Tensor(ws.get(), DType::u8, {bytes}, gpu0())), stream);
      EXPECT_EQ(gpu_ids(got, rows * topk, stream), ref)
          << "workspace of " << bytes / (next_n * row) << " batches, bad length " << bad_len;
      const std::vector<int32_t> words = status.download<int32_t>(4, stream);
      if (bad_len) expect_status(words, StatusCode::seq_len_invalid, int32_t(batch - 3), int32_t(max_len + 5), int32_t(max_len));
      else EXPECT_EQ(words[0], 0) << describe_status(words.data());
      clear_status(st, stream);
    }
  }
}

// Host-side rules of the CUDA path: what it does not take is a clear error.
TEST(MqaLogitsGpu, UnsupportedOnCudaIsAnError) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(8);
  TestStream stream;
  PagedLogits p = make_paged({100}, 1, 64, 16, 100, 8, rng);  // block size 16
  HostTensor got(DType::f32, {1, 103});
  try {
    run_paged_gpu(p, true, got, stream);
    ADD_FAILURE() << "block size 16 accepted on CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA takes block sizes 32, 64 and 128"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace msa::test
