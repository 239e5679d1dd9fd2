// GPU decode (src/cuda/sm90/decode/, DecodePlan on CUDA) against the CPU decode, the oracle: sweeps
// over page size, layout, G, queries per request (both CTA widths: 4 warps up to 64 rows, 8 up to
// 128), head dims 64 and 256, skewed and empty lengths, FP8 KV, FP8 queries; NaN in unused slots;
// device-side status for bad ids, bad pages and lengths past the plan; NVFP4 KV; determinism; CUDA
// graph replays with new lengths and q2k; B = 4096; offsets past 2^31; token ids (kv_block_size 1:
// K up to 2048, shared and disjoint ids across a request's queries, quantized KV, bad ids and
// pages, plan limits, MQA and other groups up to 128); sparse blocks with groups past 16.
// Outputs are poisoned before each run. MSA_TEST_SMALL=1 shrinks the sweep (compute-sanitizer
// runs).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "backend.h"
#include "support/attention_problem.h"
#include "support/device_tensor.h"
#include "support/expect_error.h"

namespace msa::test {
namespace {

struct Config {
  std::vector<int32_t> lq, lk;
  int64_t hq = 16, hkv = 1;
  int64_t dim = 128;  // head dim
  int64_t page_size = 64;
  KVLayout layout = KVLayout::paged_nhd;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  int64_t topk = 0;  // 0: dense
  int blk = 128;
  int64_t row_pad = 0;
  bool causal = true;
  bool sorted_q2k = true;
  unsigned seed = 1;
  // FP8 KV: the scale kinds of K and V, and (wide_scales) per-slot scales drawn over 10^[-4, 3]
  // instead of [0.05, 0.5), so a window's V scales span far more than f16 holds.
  Fp8Scale k_scale = Fp8Scale::per_tensor, v_scale = Fp8Scale::per_tensor;
  bool wide_scales = false;
  // kv_dtype fp4x2: NVFP4 (e4m3 scales per 16 values, global scale 0.75) or MXFP4.
  bool mxfp4 = false;
  // CTA width: 0 plans and runs through DecodePlan (the planner's choice); 4 or 8 plans that
  // width with the backend's decode_plan and runs with its decode_run (4 only where a plan has
  // at most 64 rows).
  int warps = 0;
};

// The problem of a config: make_problem's, with V's scale kind (and the scales' spread) redrawn
// where the config asks.
Problem make_decode_problem(const Config& c) {
  if (c.kv_dtype == DType::fp4x2) {  // K and V drawn in q's type, then quantized on the host
    Problem p = make_problem(c.lq, c.lk, c.hq, c.hkv, c.dim, c.seed, c.q_dtype);
    quantize_kv_fp4(p, !c.mxfp4);
    return p;
  }
  const bool fp8 = c.kv_dtype == DType::fp8_e4m3;
  Problem p = make_problem(c.lq, c.lk, c.hq, c.hkv, c.dim, c.seed, c.q_dtype, c.kv_dtype,
                           fp8 ? c.k_scale : Fp8Scale::none);
  if (!fp8 || (c.v_scale == c.k_scale && !c.wide_scales)) return p;
  std::mt19937 rng(c.seed + 7);
  const auto redraw = [&](std::optional<HostTensor>& scale, Fp8Scale kind) {
    scale = make_scale(kind, p.total_k(), p.hkv, rng);
    if (scale && c.wide_scales && scale->t.numel() > 1) {
      std::uniform_real_distribution<float> e(-4.f, 3.f);
      for (int64_t i = 0; i < scale->t.numel(); ++i) scale->data<float>()[i] = std::pow(10.f, e(rng));
    }
  };
  redraw(p.k_scale, c.k_scale);
  redraw(p.v_scale, c.v_scale);
  p.k_val = fill_fp8(p.k, p.k_scale, rng);
  p.v_val = fill_fp8(p.v, p.v_scale, rng);
  return p;
}

std::string describe(const Config& c) {
  std::ostringstream os;
  os << "B=" << c.lq.size() << " Hq=" << c.hq << " Hkv=" << c.hkv << " D=" << c.dim
     << " page=" << c.page_size
     << " " << kv_layout_name(c.layout) << " q=" << dtype_name(c.q_dtype) << " kv="
     << dtype_name(c.kv_dtype) << " topk=" << c.topk << " blk=" << c.blk
     << (c.causal ? " causal" : " full") << " seed=" << c.seed;
  if (c.kv_dtype == DType::fp8_e4m3)
    os << " scales k/v=" << int(c.k_scale) << "/" << int(c.v_scale) << (c.wide_scales ? " wide" : "");
  return os.str();
}

// One decode problem on both backends: host inputs (and the CPU plan), device copies, the GPU
// plan with its workspace, poisoned device outputs and a status buffer.
struct Bench {
  Config cfg;
  Problem p;
  PagedKV paged;
  std::vector<int32_t> ids;
  std::optional<HostTensor> q2k;
  int64_t max_q = 1;
  TestStream stream;
  DeviceTensor q, q_scale, page_table, seqused, cu_q, q2k_d;
  DeviceQTensor k, v;
  DeviceBuffer out, lse, status, workspace;
  DecodePlan plan;
  cuda::DecodeWork work;  // the backend's plan when cfg.warps forces a width

  explicit Bench(const Config& c)
      : cfg(c),
        p(make_decode_problem(c)),
        paged(make_paged(p, c.layout, c.page_size, c.seed + 1, c.row_pad)) {
    for (int32_t n : c.lq) max_q = std::max<int64_t>(max_q, n);
    if (c.topk) {
      ids = random_q2k(p, c.topk, c.blk, c.seed + 2, c.sorted_q2k);
      q2k.emplace(q2k_tensor(ids, p.hkv, p.total_q(), c.topk));
    }
    q = to_device(p.q, stream);
    if (p.q_scale) q_scale = to_device(*p.q_scale, stream);
    k = to_device(paged.k, paged.k_scale, stream);
    v = to_device(paged.v, paged.v_scale, stream);
    page_table = to_device(paged.page_table, stream);
    seqused = to_device(paged.seqused_k, stream);
    cu_q = to_device(p.cu_q, stream);
    if (q2k) q2k_d = to_device(*q2k, stream);
    out = DeviceBuffer(std::max<int64_t>(1, p.total_q() * p.hq * p.dim) * 2);
    lse = DeviceBuffer(std::max<int64_t>(1, p.total_q() * p.hq) * 4);
    status = DeviceBuffer(16);
  }

  DecodeShape shape(Device device) const {
    DecodeShape s;
    s.batch = int(p.batch());
    s.max_queries_per_request = int(max_q);
    s.num_q_heads = int(p.hq);
    s.num_kv_heads = int(p.hkv);
    s.head_dim = int(p.dim);
    s.page_size = int(cfg.page_size);
    s.max_pages = int(paged.page_table.t.shape[1]);
    s.layout = cfg.layout;
    s.kv_dtype = p.k.t.dtype;
    s.topk = int(cfg.topk);
    s.kv_block_size = cfg.blk;
    s.device = device;
    return s;
  }
  AttentionParams params() const {
    AttentionParams prm;
    prm.kv_block_size = cfg.blk;
    prm.causal = cfg.causal;
    return prm;
  }
  Tensor workspace_tensor() const {
    return Tensor(workspace.get(), DType::u8, {int64_t(workspace.bytes())}, gpu0());
  }
  // Plans on the GPU for host lengths `lengths` (null: max_pages * page_size).
  void plan_gpu(const int32_t* lengths) {
    const DecodeShape s = shape(gpu0());
    workspace = DeviceBuffer(DecodePlan::workspace_bytes(s));
    if (cfg.warps) work = cuda::decode_plan(s, lengths, workspace_tensor(), stream, cfg.warps);
    else plan.plan(s, lengths, workspace_tensor(), stream);
  }
  void plan_gpu() { plan_gpu(paged.seqused_k.data<int32_t>()); }

  AttentionArgs gpu_args() {
    AttentionArgs a;
    a.q = q.t;
    if (p.q_scale) a.q_scale = q_scale.t;
    KVCache kv;
    kv.k = k.view();
    kv.v = v.view();
    kv.k.global_scale = paged.k_global;  // NVFP4 pools (1 otherwise)
    kv.v.global_scale = paged.v_global;
    kv.layout = cfg.layout;
    kv.page_table = page_table.t;
    kv.seqused_k = seqused.t;
    a.kv = kv;
    a.cu_seqlens_q = cu_q.t;
    if (q2k) a.q2k = q2k_d.t;
    a.out = Tensor(out.get(), p.out_dtype(), {p.total_q(), p.hq, p.dim}, gpu0());
    a.lse = Tensor(lse.get(), DType::f32, {p.hq, p.total_q()}, gpu0());
    a.params = params();
    a.status = Tensor(status.get(), DType::i32, {4}, gpu0());
    return a;
  }
  // Poisons the outputs, clears the status and runs the planned decode on the stream.
  void run_gpu() {
    out.poison(stream);
    lse.poison(stream);
    clear_status(Tensor(status.get(), DType::i32, {4}, gpu0()), stream);
    run(gpu_args());
  }
  // The planned decode on the stream (DecodePlan's, or the backend's for a forced width).
  void run(const AttentionArgs& a) {
    if (cfg.warps) cuda::decode_run(a, shape(gpu0()), work, workspace_tensor(), stream);
    else plan.run(a, stream);
  }
  std::vector<int32_t> status_words() { return status.download<int32_t>(4, stream); }

  // The CPU decode of the current host inputs (seqused_k, q2k as they are now).
  Outputs reference() const {
    DecodePlan cpu;
    cpu.plan(shape(Device{}), nullptr, Tensor());
    Outputs o(p.out_dtype(), p.total_q(), p.hq, p.dim);
    cpu.run(make_args(p, paged.cache(), o, q2k ? &*q2k : nullptr, params()));
    return o;
  }

  // Every element written, rel L2 of out and max abs of lse within the bounds of docs/semantics.md,
  // Numerics (FP8 KV: 3e-2 against the reference on the same dequantized bits).
  void expect_matches_reference(const char* what = "") {
    SCOPED_TRACE(describe(cfg) + " " + what);
    const Outputs ref = reference();
    const int64_t n = p.total_q() * p.hq * p.dim;
    const auto got = out.download<uint16_t>(size_t(n), stream);
    const auto got_lse = lse.download<float>(size_t(p.hq * p.total_q()), stream);
    EXPECT_EQ(status_words()[0], 0) << describe_status(status_words().data());
    const bool fp8 = cfg.kv_dtype == DType::fp8_e4m3 || cfg.kv_dtype == DType::fp4x2 ||
                     cfg.q_dtype == DType::fp8_e4m3;
    const double tol_out = fp8 ? 3e-2 : 1e-2, tol_lse = fp8 ? 3e-2 : 2e-3;
    const bool bf16 = p.out_dtype() == DType::bf16;
    double diff2 = 0, ref2 = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double g = bf16 ? codec::bf16_to_float(got[i]) : codec::f16_to_float(got[i]);
      const double r = load(ref.out.t, i);
      if (!std::isfinite(g) && bad++ < 5) ADD_FAILURE() << "out[" << i << "] = " << g << ", reference " << r;
      diff2 += (g - r) * (g - r);
      ref2 += r * r;
    }
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    EXPECT_LE(rel, tol_out) << "out: relative L2 error";
    for (int64_t i = 0; i < p.hq * p.total_q(); ++i) {
      const double g = got_lse[i], r = ref.lse.data<float>()[i];
      if (r == -kInf) {
        if (g != -kInf && bad++ < 10) ADD_FAILURE() << "lse[" << i << "] = " << g << ", reference -inf";
        continue;
      }
      if (!(std::fabs(g - r) <= tol_lse) && bad++ < 10)
        ADD_FAILURE() << "lse[" << i << "] = " << g << ", reference " << r;
    }
    EXPECT_EQ(bad, 0);
  }

  // A planned run against the reference, then a second run bitwise equal to it.
  void expect_matches_reference_and_repeats() {
    plan_gpu();
    run_gpu();
    expect_matches_reference();
    const auto out1 = out.download<uint16_t>(out.bytes() / 2, stream);
    const auto lse1 = lse.download<uint32_t>(lse.bytes() / 4, stream);
    run_gpu();
    EXPECT_EQ(out1, out.download<uint16_t>(out.bytes() / 2, stream)) << "out differs run to run";
    EXPECT_EQ(lse1, lse.download<uint32_t>(lse.bytes() / 4, stream)) << "lse differs run to run";
  }
};

// The CTA widths (Config::warps) for the tests' small batches, which the heuristic would all give
// 8 warps: 0 (the heuristic, through DecodePlan) or 4 (forced wherever a plan has at most 64 rows).
constexpr int kWidths[] = {0, 4};

// Random lengths: each request gets 1..max_q queries (some 0 when allowed) and 0..max_k keys.
Config random_config(std::mt19937& rng, int batch, int max_q, int max_k, bool allow_empty) {
  Config c;
  std::uniform_int_distribution<int> nq(allow_empty ? 0 : 1, max_q), nk(0, max_k);
  for (int b = 0; b < batch; ++b) {
    c.lq.push_back(nq(rng));
    c.lk.push_back(rng() % 6 == 0 && allow_empty ? 0 : nk(rng));
  }
  return c;
}

TEST(DecodeGpu, SweepDenseAndSparse) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, hkv, page;
    KVLayout layout;
    int max_q;
    int blk;
  };
  std::vector<Shape> shapes = {
      {16, 2, 128, KVLayout::paged_nhd, 1, 128},  {16, 1, 16, KVLayout::paged_hnd, 8, 64},
      {8, 2, 32, KVLayout::paged_nhd, 3, 128},    {4, 2, 64, KVLayout::paged_hnd, 16, 128},
      {2, 3, 256, KVLayout::paged_nhd, 5, 64},    {1, 4, 16, KVLayout::paged_nhd, 16, 128},
      {16, 1, 256, KVLayout::paged_hnd, 16, 128}, {1, 2, 128, KVLayout::paged_hnd, 2, 64},
  };
  if (small_tests()) shapes.resize(3);
  std::mt19937 rng(7);
  unsigned seed = 100;
  for (int warps : kWidths)
    for (const Shape& sh : shapes)
      for (int64_t topk : {int64_t(0), int64_t(6), int64_t(40)}) {
        // topk 40: the one-query union's ranking past 32 ids, at G = 16 only (one query a CTA).
        if (topk == 40 && sh.g != 16) continue;
        SCOPED_TRACE("forced width " + std::to_string(warps));
        Config c =
            random_config(rng, small_tests() ? 3 : 6, sh.max_q, small_tests() ? 700 : 2500, true);
        c.warps = warps;
        c.hq = sh.g * sh.hkv;
        c.hkv = sh.hkv;
        c.page_size = sh.page;
        c.layout = sh.layout;
        c.topk = topk;
        c.blk = sh.blk;
        c.row_pad = (seed % 3) * 8;
        c.sorted_q2k = seed % 2 == 0;
        c.seed = seed++;
        Bench t(c);
        t.plan_gpu();
        t.run_gpu();
        t.expect_matches_reference();
      }
}

// Dense decode with any GQA group up to 128: a CTA's rows map to (query r / G, head r % G), so
// groups that do not divide 16 (5, 7, 12: a 16-row tile holds parts of two queries) and groups past
// 16 (24, 64, 96, 128: a query's heads span several tiles) run dense, at each CTA width, bf16 and
// FP8 KV, against the CPU reference. A sparse call keeps the sparse GQA rule (G in {1, 2, 4, 8,
// 16}, or any with one kv head: TokenIdsLargeGroups, SparseBlocksAnyGroup).
TEST(DecodeGpu, DenseAnyGroup) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, hkv;
    int max_q;
    DType kv;
  };
  std::vector<Shape> shapes = {{5, 2, 8, DType::bf16},   {7, 1, 3, DType::fp8_e4m3},
                               {12, 2, 16, DType::bf16}, {24, 1, 4, DType::bf16},
                               {64, 1, 2, DType::fp8_e4m3}, {96, 2, 1, DType::bf16},
                               {128, 1, 3, DType::bf16},  {3, 4, 40, DType::bf16}};
  if (small_tests()) shapes.resize(4);
  std::mt19937 rng(11);
  unsigned seed = 1300;
  for (int warps : kWidths)
    for (const Shape& sh : shapes) {
      SCOPED_TRACE("G " + std::to_string(sh.g) + ", forced width " + std::to_string(warps));
      Config c = random_config(rng, 3, sh.max_q, small_tests() ? 500 : 2000, false);
      c.warps = warps;
      c.hq = sh.g * sh.hkv;
      c.hkv = sh.hkv;
      c.kv_dtype = sh.kv;
      c.seed = seed++;
      Bench t(c);
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }
  Config c = random_config(rng, 2, 2, 300, false);
  c.hq = 10;
  c.hkv = 2;
  c.topk = 2;
  c.seed = seed++;
  Bench t(c);
  expect_error([&] { t.plan_gpu(); }, "a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or 16");
}

// Plans sparse config c, captures its run in a CUDA graph and replays it `replays` times: with the
// planned lengths, then random lengths within the plan (lengths_seed), each with a new q2k (seeds
// ids_seed + replay, sorted on even replays), poisoned outputs and a cleared status, against the
// CPU reference.
void expect_graph_replays(const Config& c, int replays, unsigned lengths_seed, unsigned ids_seed) {
  Bench t(c);
  t.plan_gpu();
  const AttentionArgs args = t.gpu_args();
  const Tensor status(t.status.get(), DType::i32, {4}, gpu0());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeGlobal));
  t.run(args);
  MSA_CUDA_CHECK(cudaStreamEndCapture(t.stream, &graph));
  expect_launch_budget(graph, 2);  // decode run()'s launch budget
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937 rng(lengths_seed);
  const size_t batch = c.lk.size();
  for (int replay = 0; replay < replays; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    std::vector<int32_t> lk(batch);
    for (size_t b = 0; b < batch; ++b)
      lk[b] = replay == 0 ? c.lk[b] : int32_t(rng() % (c.lk[b] + 1));  // within the plan
    std::copy(lk.begin(), lk.end(), t.paged.seqused_k.data<int32_t>());
    std::mt19937 ids_rng(ids_seed + replay);
    t.ids = random_q2k(t.p.lq, lk, t.p.hkv, c.topk, c.blk, ids_rng, /*sorted=*/replay % 2 == 0);
    std::copy(t.ids.begin(), t.ids.end(), t.q2k->data<int32_t>());
    copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
    copy_to_device(t.paged.seqused_k, t.seqused.buf, t.stream);
    t.out.poison(t.stream);
    t.lse.poison(t.stream);
    clear_status(status, t.stream);
    MSA_CUDA_CHECK(cudaGraphLaunch(exec, t.stream));
    t.expect_matches_reference("graph replay");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Head dims 64 and 256 (docs/kernels/decode.md, Head dims) against the CPU reference: bf16 and
// f16, both layouts, pages of 16-256 slots, odd lengths and empty requests (no queries, no keys),
// G 1, 5, 8, 16 and, dense, 48 and (D = 256: chunks of a query's heads) 96 and 128, both CTA
// widths where the rows allow 4 warps, dense and sparse (topk 40: the one-query union past 32
// ids); FP8 e4m3 KV (scales per tensor and per slot and head) and FP8 queries at 256, FP8 queries
// over bf16 KV at 64. Then a long request split over many CTAs (the in-kernel combine, with head
// chunks), a CUDA graph replayed with new lengths and q2k, and the refusals.
TEST(DecodeGpu, HeadDims) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t d, g, hkv, page;
    KVLayout layout;
    DType q;
    int max_q;
    int64_t topk = 0;
    int blk = 128;
    DType kv = DType::bf16;  // FP8 KV where fp8_e4m3, else q's type (bf16 for FP8 q)
    Fp8Scale scales = Fp8Scale::per_tensor;
  };
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf16 = DType::bf16, f16 = DType::f16, e4m3 = DType::fp8_e4m3;
  std::vector<Shape> shapes = {
      {64, 1, 4, 16, nhd, bf16, 8},
      {64, 5, 2, 32, hnd, f16, 6},
      {64, 8, 2, 64, nhd, bf16, 3, 6, 64},
      {64, 16, 1, 128, hnd, f16, 8},
      {64, 16, 2, 256, nhd, bf16, 1, 40},
      {64, 48, 1, 64, hnd, bf16, 2},
      {64, 8, 2, 32, nhd, e4m3, 4},
      {256, 1, 4, 16, hnd, bf16, 16},
      {256, 5, 2, 64, nhd, f16, 8},
      {256, 8, 2, 32, nhd, bf16, 4, 8, 64},
      {256, 16, 1, 256, hnd, bf16, 4},
      {256, 16, 2, 128, nhd, f16, 1, 40},
      {256, 96, 1, 64, hnd, bf16, 2},
      {256, 128, 1, 32, nhd, f16, 1},
      {256, 8, 2, 64, nhd, bf16, 4, 0, 128, e4m3},
      {256, 16, 1, 128, hnd, f16, 2, 6, 128, e4m3},
      {256, 4, 2, 16, hnd, bf16, 8, 0, 128, e4m3, Fp8Scale::per_token_head},
      {256, 8, 2, 32, nhd, e4m3, 4, 0, 128, e4m3},
      {256, 4, 2, 64, hnd, e4m3, 4, 5, 64},
  };
  if (small_tests()) shapes.resize(10);
  std::mt19937 rng(14);
  unsigned seed = 1400;
  for (int warps : kWidths)
    for (const Shape& sh : shapes) {
      SCOPED_TRACE("forced width " + std::to_string(warps));
      Config c = random_config(rng, 5, sh.max_q, small_tests() ? 600 : 2500, true);
      c.lq[0] = std::max(c.lq[0], 1);
      c.lk[0] = int32_t(2 * sh.page + 1);  // odd: a last page of one key
      c.warps = warps;
      c.dim = sh.d;
      c.hq = sh.g * sh.hkv;
      c.hkv = sh.hkv;
      c.page_size = sh.page;
      c.layout = sh.layout;
      c.q_dtype = sh.q;
      c.kv_dtype = sh.kv;
      c.k_scale = c.v_scale = sh.scales;
      c.topk = sh.topk;
      c.blk = sh.blk;
      c.row_pad = (seed % 3) * 16;  // elements: 16-byte rows for FP8 too
      c.seed = seed++;
      Bench t(c);
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }

  // Splits: one long request and a short one over few CTAs, so the planner splits them and the
  // last split of each combines (at D = 256 G = 128 the combine writes head chunk 64-127 too).
  for (const Shape& sh : {Shape{64, 16, 2, 128, nhd, bf16, 8}, Shape{256, 128, 1, 64, hnd, f16, 1},
                          Shape{256, 16, 1, 64, nhd, bf16, 1, 16}}) {
    Config c;
    c.lq = {sh.max_q, 1};
    c.lk = {small_tests() ? 5000 : 30001, 700};
    c.dim = sh.d;
    c.hq = sh.g * sh.hkv;
    c.hkv = sh.hkv;
    c.page_size = sh.page;
    c.layout = sh.layout;
    c.q_dtype = sh.q;
    c.topk = sh.topk;
    c.seed = seed++;
    Bench t(c);
    t.plan_gpu();
    t.run_gpu();
    t.expect_matches_reference("split");
  }

  // A captured graph replayed with new lengths and q2k, at each new head dim.
  for (int64_t d : {64, 256}) {
    SCOPED_TRACE("graph, D " + std::to_string(d));
    Config c;
    c.lq = {1, 4, 2};
    c.lk = {3000, 257, 900};
    c.dim = d;
    c.hq = 16;
    c.hkv = 2;
    c.page_size = 32;
    c.topk = 8;
    c.seed = seed++;
    expect_graph_replays(c, 3, unsigned(d), 3000);
  }

  // Refused: FP8 KV at 64, NVFP4 KV away from 128, head dims without kernels.
  const auto refused = [&](int64_t d, DType kv, const std::string& what) {
    Config c;
    c.lq = {1, 2};
    c.lk = {100, 300};
    c.dim = d;
    c.kv_dtype = kv;
    c.seed = seed++;
    Bench t(c);
    expect_error([&] { t.plan_gpu(); }, what);
  };
  refused(64, DType::fp8_e4m3,
          "decode shape: CUDA decode takes fp8_e4m3 KV at head_dim 128 or 256, got head_dim 64");
  refused(64, DType::fp4x2,
          "decode shape: CUDA decode takes fp4x2 (NVFP4) KV at head_dim 128 only, got "
          "head_dim 64");
  refused(256, DType::fp4x2,
          "decode shape: CUDA decode takes fp4x2 (NVFP4) KV at head_dim 128 only, got "
          "head_dim 256");
  refused(96, DType::bf16, "decode shape: CUDA decode takes head_dim 64, 128 or 256, got 96");
}

// At each CTA width: 4 requests of 1..max_q queries and up to 3000 keys (600 small), Hq 32 over
// Hkv 2, shaped further by `setup`, against the CPU reference.
template <typename F>
void each_width(std::mt19937& rng, int max_q, unsigned& seed, F&& setup) {
  for (int warps : kWidths) {
    SCOPED_TRACE("forced width " + std::to_string(warps));
    Config c = random_config(rng, 4, max_q, small_tests() ? 600 : 3000, false);
    c.warps = warps;
    c.hq = 32;
    c.hkv = 2;
    setup(c);
    c.seed = seed++;
    Bench t(c);
    t.plan_gpu();
    t.run_gpu();
    t.expect_matches_reference();
  }
}

TEST(DecodeGpu, Fp8F16AndFp8Queries) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(8);
  unsigned seed = 200;
  struct Kind {
    DType q, kv;
    KVLayout layout;
    int64_t topk;
    int max_q;  // dense G = 16: 8 queries need the 8-warp CTA, up to 4 the 4-warp one
  };
  for (const Kind& kind : {Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_nhd, 0, 8},
                           Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_nhd, 0, 3},
                           Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_hnd, 8, 8},
                           Kind{DType::f16, DType::fp8_e4m3, KVLayout::paged_nhd, 8, 8},
                           Kind{DType::f16, DType::f16, KVLayout::paged_hnd, 0, 8},
                           Kind{DType::f16, DType::f16, KVLayout::paged_nhd, 0, 2},
                           Kind{DType::f16, DType::f16, KVLayout::paged_nhd, 5, 8},
                           // FP8 queries: e4m3 MMAs over FP8 KV, bf16 ones over bf16 KV
                           Kind{DType::fp8_e4m3, DType::fp8_e4m3, KVLayout::paged_nhd, 0, 8},
                           Kind{DType::fp8_e4m3, DType::fp8_e4m3, KVLayout::paged_hnd, 8, 8},
                           Kind{DType::fp8_e4m3, DType::fp8_e4m3, KVLayout::paged_nhd, 8, 3},
                           Kind{DType::fp8_e4m3, DType::bf16, KVLayout::paged_nhd, 0, 8},
                           Kind{DType::fp8_e4m3, DType::bf16, KVLayout::paged_hnd, 8, 3}})
    each_width(rng, kind.max_q, seed, [&](Config& c) {
      c.page_size = 32;
      c.q_dtype = kind.q;
      c.kv_dtype = kind.kv;
      c.layout = kind.layout;
      c.topk = kind.topk;
    });
}

// Pages of 256 slots, dense and sparse: the TMA boxes of a dense FP8 stage (256 slots) span a
// whole page.
TEST(DecodeGpu, Pages256) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(11);
  unsigned seed = 340;
  struct Kind {
    DType q, kv;
    KVLayout layout;
    int64_t topk;
  };
  for (const Kind& kind : {Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_nhd, 0},
                           Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_hnd, 0},
                           Kind{DType::f16, DType::fp8_e4m3, KVLayout::paged_nhd, 0},
                           Kind{DType::bf16, DType::bf16, KVLayout::paged_nhd, 0},
                           Kind{DType::bf16, DType::fp8_e4m3, KVLayout::paged_nhd, 6},
                           Kind{DType::bf16, DType::fp4x2, KVLayout::paged_nhd, 0}})
    each_width(rng, 4, seed, [&](Config& c) {
      c.page_size = 256;
      c.q_dtype = kind.q;
      c.kv_dtype = kind.kv;
      c.layout = kind.layout;
      c.topk = kind.topk;
    });
}

// FP8 KV with scales per pool slot (and head) for K, V or both (the other per tensor or absent):
// both CTA widths, dense and sparse, both layouts, unused slots' scales NaN (make_paged), and
// scales spread over seven decades so the V-scale reference (attend.cuh) rises mid-request.
TEST(DecodeGpu, Fp8SlotScales) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(9);
  unsigned seed = 260;
  struct Kind {
    Fp8Scale k, v;
    KVLayout layout;
    int64_t topk, page;
    int max_q;
    bool wide;
    DType q = DType::bf16;
  };
  const Fp8Scale tok = Fp8Scale::per_token, th = Fp8Scale::per_token_head;
  std::vector<Kind> kinds = {
      {tok, tok, KVLayout::paged_nhd, 0, 32, 8, false},
      {th, th, KVLayout::paged_hnd, 8, 64, 3, false},
      {th, tok, KVLayout::paged_nhd, 6, 64, 4, true, DType::fp8_e4m3},
      {tok, Fp8Scale::per_tensor, KVLayout::paged_nhd, 6, 16, 2, false},
      {tok, th, KVLayout::paged_hnd, 0, 32, 8, false, DType::fp8_e4m3},
      {Fp8Scale::none, th, KVLayout::paged_hnd, 0, 128, 4, false},
      {th, tok, KVLayout::paged_nhd, 12, 256, 8, true},
      {tok, tok, KVLayout::paged_hnd, 0, 32, 1, true},
  };
  if (small_tests()) kinds.resize(3);
  for (const Kind& kind : kinds)
    each_width(rng, kind.max_q, seed, [&](Config& c) {
      c.page_size = kind.page;
      c.q_dtype = kind.q;
      c.kv_dtype = DType::fp8_e4m3;
      c.layout = kind.layout;
      c.topk = kind.topk;
      c.k_scale = kind.k;
      c.v_scale = kind.v;
      c.wide_scales = kind.wide;
    });
}

// NVFP4 KV (packed e2m1, an e4m3 scale per 16 values, global scale 0.75) under bf16, f16 and e4m3
// queries: both CTA widths, dense and sparse, both layouts, pages of 16-256 slots, unused slots'
// values and scales NaN (make_paged), padded rows.
TEST(DecodeGpu, Nvfp4Kv) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(10);
  unsigned seed = 300;
  struct Kind {
    DType q;
    KVLayout layout;
    int64_t topk, page;
    int max_q;
    int64_t row_pad = 0;
  };
  std::vector<Kind> kinds = {
      {DType::bf16, KVLayout::paged_nhd, 0, 32, 8},
      {DType::bf16, KVLayout::paged_hnd, 8, 64, 3, 16},
      {DType::fp8_e4m3, KVLayout::paged_nhd, 6, 128, 4},
      {DType::f16, KVLayout::paged_nhd, 6, 16, 2},
      {DType::fp8_e4m3, KVLayout::paged_hnd, 0, 256, 8},
      {DType::bf16, KVLayout::paged_nhd, 12, 128, 1, 32},
      {DType::f16, KVLayout::paged_hnd, 0, 64, 1},
  };
  if (small_tests()) kinds.resize(3);
  for (const Kind& kind : kinds)
    each_width(rng, kind.max_q, seed, [&](Config& c) {
      c.page_size = kind.page;
      c.q_dtype = kind.q;
      c.kv_dtype = DType::fp4x2;
      c.layout = kind.layout;
      c.topk = kind.topk;
      c.row_pad = kind.row_pad;
    });
}

// MXFP4 pools are refused by the CUDA decode with a clear error (their power-of-two scales do not
// keep value * scale inside f16); the CPU runs them.
TEST(DecodeGpu, Mxfp4KvRefused) {
  MSA_REQUIRE_GPU();
  Config c;
  c.lq = {1, 2};
  c.lk = {100, 300};
  c.kv_dtype = DType::fp4x2;
  c.mxfp4 = true;
  c.seed = 330;
  Bench t(c);
  t.plan_gpu();
  expect_error([&] { t.run_gpu(); }, "k: CUDA decode takes NVFP4");
}

TEST(DecodeGpu, NonCausalAndScale) {
  MSA_REQUIRE_GPU();
  Config c;
  c.lq = {4, 1, 7};
  c.lk = {300, 1, 129};
  c.hq = 8;
  c.hkv = 2;
  c.page_size = 16;
  c.causal = false;
  c.seed = 300;
  Bench t(c);
  t.plan_gpu();
  t.run_gpu();
  t.expect_matches_reference();
}

TEST(DecodeGpu, EmptyLengthsAndBatches) {
  MSA_REQUIRE_GPU();
  for (int64_t topk : {int64_t(0), int64_t(4)}) {
    Config c;
    c.lq = {2, 1, 3};
    c.lk = {0, 0, 0};  // every context empty: out 0, lse -inf
    c.topk = topk;
    c.seed = 400 + unsigned(topk);
    Bench t(c);
    t.plan_gpu();
    t.run_gpu();
    t.expect_matches_reference("all zero lengths");
    Config z;  // requests with no queries, and Lq > Lk (queries that see nothing)
    z.lq = {0, 5, 0, 16};
    z.lk = {100, 3, 0, 40};
    z.topk = topk;
    z.seed = 410 + unsigned(topk);
    Bench tz(z);
    tz.plan_gpu();
    tz.run_gpu();
    tz.expect_matches_reference("zero queries, Lq > Lk");
  }
  Config none;  // B = 0
  none.seed = 420;
  Bench t0(none);
  t0.plan_gpu();
  EXPECT_NO_THROW(t0.run_gpu());
  EXPECT_EQ(t0.status_words()[0], 0);
}

TEST(DecodeGpu, SkewedLengthsSplitAndCombineDeterministic) {
  MSA_REQUIRE_GPU();
  for (int warps : kWidths)
    for (int64_t topk : {int64_t(0), int64_t(16)}) {
      SCOPED_TRACE("forced width " + std::to_string(warps));
      Config c;
      c.warps = warps;
      const int long_k = small_tests() ? 6000 : 40000;
      c.lq = {8, 8, 8, 8, 8};
      c.lk = {long_k, 700, 0, 1300, 129};
      c.hq = 32;
      c.hkv = 2;
      c.page_size = 128;
      c.topk = topk;
      c.seed = 500 + unsigned(topk);
      Bench t(c);
      t.expect_matches_reference_and_repeats();
    }
}

TEST(DecodeGpu, NewLengthsWithinThePlanAndPastIt) {
  MSA_REQUIRE_GPU();
  for (int64_t topk : {int64_t(0), int64_t(8)}) {
    Config c;
    c.lq = {3, 1, 6};
    c.lk = {1000, 2000, 300};
    c.hq = 16;
    c.hkv = 2;
    c.page_size = 64;
    c.topk = topk;
    c.blk = 64;
    c.seed = 600 + unsigned(topk);
    Bench t(c);
    t.plan_gpu();
    // Shrink: keys past the new lengths stay in the pages (real values) and must be ignored.
    for (std::vector<int32_t> lk : {std::vector<int32_t>{10, 1999, 0}, {1000, 64, 300}}) {
      std::copy(lk.begin(), lk.end(), t.paged.seqused_k.data<int32_t>());
      if (topk) {  // a q2k valid for the new lengths
        std::mt19937 ids_rng(c.seed + lk[0]);
        t.ids = random_q2k(t.p.lq, lk, t.p.hkv, topk, c.blk, ids_rng);
        std::copy(t.ids.begin(), t.ids.end(), t.q2k->data<int32_t>());
        copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
      }
      copy_to_device(t.paged.seqused_k, t.seqused.buf, t.stream);
      t.run_gpu();
      t.expect_matches_reference("shrunk lengths");
    }
    // Grow past the planned capacity (1000 -> 1100 > 1024): reported, not silently dropped.
    std::vector<int32_t> grown = {1100, 2000, 300};
    t.seqused.buf.upload(grown, t.stream);
    t.run_gpu();
    expect_status(t.status_words(), StatusCode::kv_length_past_plan, 0, 1100, 1024);
  }
}

TEST(DecodeGpu, MoreQueriesThanPlanned) {
  MSA_REQUIRE_GPU();
  Config c;
  c.lq = {2, 5};
  c.lk = {100, 200};
  c.seed = 700;
  Bench t(c);
  t.max_q = 4;  // the plan allows 4 queries per request; request 1 has 5
  t.plan_gpu();
  t.run_gpu();
  expect_status(t.status_words(), StatusCode::queries_past_plan, 1, 5, 4);
}

TEST(DecodeGpu, BadPageIdsReported) {
  MSA_REQUIRE_GPU();
  // Page 32: blocks over four pages, a lookup per 32-key box; page 128 and topk 16: one block per
  // page, whole-page TMA boxes (one-query CTAs, the union's one-warp ranking).
  struct Kind {
    int64_t topk, page;
  };
  for (const Kind kind : {Kind{0, 32}, Kind{64, 32}, Kind{16, 128}}) {
    const int64_t topk = kind.topk;
    SCOPED_TRACE("topk " + std::to_string(topk) + " page " + std::to_string(kind.page));
    Config c;
    c.lq = {1, 2, 1, 3, 1};
    c.lk = {300, 500, 100, 700, 200};
    c.page_size = kind.page;
    c.topk = topk;
    c.seed = 800 + unsigned(topk);
    Bench t(c);
    if (topk) {  // every block selected by every query, so every page is read
      for (int64_t h = 0; h < t.p.hkv; ++h)
        for (int64_t b = 0; b < t.p.batch(); ++b)
          for (int64_t tok = t.p.q_start(b); tok < t.p.q_start(b + 1); ++tok)
            for (int64_t s = 0; s < topk; ++s)
              t.q2k->data<int32_t>()[(h * t.p.total_q() + tok) * topk + s] =
                  s < (t.p.lk[b] + 127) / 128 ? int32_t(s) : -1;
      copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
    }
    const int64_t mp = t.paged.page_table.t.shape[1], pages = t.paged.k.t.shape[0];
    const int col1 = kind.page == 32 ? 15 : 3, col3 = kind.page == 32 ? 7 : 4;  // within lk
    int32_t* pt = t.paged.page_table.data<int32_t>();
    pt[3 * mp + col3] = int32_t(pages);  // (batch 3, col3): one past the pool
    pt[1 * mp + col1] = INT_MIN;         // (batch 1, col1): the first offence
    pt[4 * mp + 0] = -1;
    copy_to_device(t.paged.page_table, t.page_table.buf, t.stream);
    t.plan_gpu();
    t.run_gpu();
    expect_status(t.status_words(), StatusCode::page_id_out_of_range, 1, col1, INT_MIN);
    expect_error([&] { check_status(Tensor(t.status.get(), DType::i32, {4}, gpu0()), t.stream); },
                 "page_table: page id -2147483648 out of range [0, num_pages) at (batch 1, column " +
                     std::to_string(col1) + ")");
    // The offence was consumed: a clean run reports nothing.
    copy_to_device(make_paged(t.p, c.layout, c.page_size, c.seed + 1).page_table, t.page_table.buf, t.stream);
    t.run_gpu();
    EXPECT_EQ(t.status_words()[0], 0);
  }
}

TEST(DecodeGpu, BadBlockIdsReported) {
  MSA_REQUIRE_GPU();
  const std::vector<int32_t> bad = {INT_MIN, -123456, -2, 0 /* nblk */, 1 /* nblk + 1000 */, INT_MAX};
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE("id case " + std::to_string(i));
    Config c;
    c.lq = {2, 4, 3};
    c.lk = {500, 900, 260};
    c.hq = 8;
    c.hkv = 2;
    c.topk = 4;
    c.seed = 900 + unsigned(i);
    Bench t(c);
    const int64_t total_q = t.p.total_q();
    auto put = [&](int64_t h, int64_t tok, int64_t slot) {
      int64_t b = 0;
      while (t.p.q_start(b + 1) <= tok) ++b;
      const int32_t nblk = (t.p.lk[b] + 127) / 128;
      int32_t id = bad[i];
      if (i == 3) id = nblk;
      if (i == 4) id = nblk + 1000;
      t.q2k->data<int32_t>()[(h * total_q + tok) * 4 + slot] = id;
    };
    put(1, total_q - 1, 3);
    put(1, 4, 2);  // earlier in (head, token, slot) order
    copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
    t.plan_gpu();
    t.run_gpu();
    expect_status(t.status_words(), StatusCode::block_id_out_of_range, 1, 4, 2);
  }
  // A repeated id: the second occurrence is the offence.
  Config c;
  c.lq = {3};
  c.lk = {1000};
  c.topk = 4;
  c.seed = 950;
  Bench t(c);
  const std::vector<int32_t> rows = {0, 1, 2, 3, /**/ 0, 5, -1, 5, /**/ 7, 7, 7, 7};
  std::copy(rows.begin(), rows.end(), t.q2k->data<int32_t>());
  copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
  t.plan_gpu();
  t.run_gpu();
  expect_status(t.status_words(), StatusCode::block_id_repeated, 0, 1, 3);
}

TEST(DecodeGpu, GraphReplayWithNewLengthsAndQ2K) {
  MSA_REQUIRE_GPU();
  for (int warps : kWidths) {
    SCOPED_TRACE("forced width " + std::to_string(warps));
    Config c;
    c.warps = warps;
    c.lq = {1, 4, 2, 8};
    c.lk = {3000, 257, 1800, 900};
    c.hq = 32;
    c.hkv = 2;
    c.page_size = 32;
    c.topk = 8;
    c.seed = 1000;
    expect_graph_replays(c, 4, 11, 2000);
  }
}

TEST(DecodeGpu, LargeBatch) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(12);
  const int batch = small_tests() ? 1100 : 4096;
  for (int64_t topk : {int64_t(4), int64_t(0)}) {
    Config c = random_config(rng, batch, 1, small_tests() ? 150 : 200, false);
    c.topk = topk;
    c.page_size = 16;
    c.seed = 1100 + unsigned(topk);
    Bench t(c);
    t.plan_gpu();
    t.run_gpu();
    t.expect_matches_reference();
  }
}

// q is filled on the device (pattern of the element index), so the 4 GB tensors never cross.
__global__ void fill_pattern_bf16(uint16_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = uint32_t(i * 2654435761ull >> 7) ^ uint32_t(i >> 20);
    x[i] = uint16_t(0x3c00 | (h & 0x3ff) | ((h >> 10 & 1) << 15));  // +-[2^-7, 2)
  }
}

TEST(DecodeGpu, OffsetsPast2To31) {
  MSA_REQUIRE_GPU();
  if (small_tests()) GTEST_SKIP() << "MSA_TEST_SMALL: skipping the 8 GB case";
  // total_q * Hq * D = 2^31 + 64 * 128 * 16 elements; every request shares one 32-key page.
  const int64_t hq = 64, hkv = 4, lq = 16;
  const int64_t batch = (int64_t(1) << 31) / (hq * 128 * lq) + 1, total_q = batch * lq;
  TestStream stream;
  DeviceBuffer q(size_t(total_q * hq * 128 * 2)), out(size_t(total_q * hq * 128 * 2)),
      lse(size_t(hq * total_q * 4)), status(16);
  fill_pattern_bf16<<<4096, 256, 0, stream>>>(static_cast<uint16_t*>(q.get()), total_q * hq * 128);
  MSA_CUDA_CHECK(cudaGetLastError());
  // The KV: one problem of one request; its pool and page table row shared by every request.
  const Problem small = make_problem({int32_t(lq)}, {32}, hq, hkv, 128, 1200);
  const PagedKV paged = make_paged(small, KVLayout::paged_nhd, 32, 1201, 0, 0, 0);
  DeviceTensor k = to_device(paged.k, stream), v = to_device(paged.v, stream);
  std::vector<int32_t> pt(batch, paged.page_table.data<int32_t>()[0]), used(batch, 32), cu(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) cu[b] = int32_t(b * lq);
  DeviceBuffer pt_d(batch * 4), used_d(batch * 4), cu_d((batch + 1) * 4);
  pt_d.upload(pt, stream);
  used_d.upload(used, stream);
  cu_d.upload(cu, stream);
  DecodeShape s;
  s.batch = int(batch);
  s.max_queries_per_request = int(lq);
  s.num_q_heads = int(hq);
  s.num_kv_heads = int(hkv);
  s.page_size = 32;
  s.max_pages = 1;
  s.device = gpu0();
  DeviceBuffer ws(DecodePlan::workspace_bytes(s));
  DecodePlan plan;
  plan.plan(s, used.data(), Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0()), stream);
  AttentionArgs a;
  a.q = Tensor(q.get(), DType::bf16, {total_q, hq, 128}, gpu0());
  a.kv.k = k.t;
  a.kv.v = v.t;
  a.kv.layout = KVLayout::paged_nhd;
  a.kv.page_table = Tensor(pt_d.get(), DType::i32, {batch, 1}, gpu0());
  a.kv.seqused_k = Tensor(used_d.get(), DType::i32, {batch}, gpu0());
  a.cu_seqlens_q = Tensor(cu_d.get(), DType::i32, {batch + 1}, gpu0());
  a.out = Tensor(out.get(), DType::bf16, {total_q, hq, 128}, gpu0());
  a.lse = Tensor(lse.get(), DType::f32, {hq, total_q}, gpu0());
  a.status = Tensor(status.get(), DType::i32, {4}, gpu0());
  out.poison(stream);
  lse.poison(stream);
  clear_status(a.status, stream);
  plan.run(a, stream);
  EXPECT_NO_THROW(check_status(a.status, stream));
  // The last request (its rows past element 2^31) against the CPU decode of the same values.
  Problem last = make_problem({int32_t(lq)}, {32}, hq, hkv, 128, 1200);
  const int64_t row0 = total_q - lq, n = lq * hq * 128;
  q.download(last.q.data<uint16_t>(), n * 2, stream, size_t(row0 * hq * 128) * 2);
  std::vector<uint16_t> got(n);
  out.download(got.data(), n * 2, stream, size_t(row0 * hq * 128) * 2);
  std::vector<float> got_lse(hq);
  for (int64_t h = 0; h < hq; ++h) lse.download(&got_lse[h], 4, stream, size_t(h * total_q + total_q - 1) * 4);
  DecodePlan cpu;
  DecodeShape cs = s;
  cs.batch = 1;
  cs.device = Device{};
  cpu.plan(cs, nullptr, Tensor());
  Outputs o(DType::bf16, lq, hq, 128);
  cpu.run(make_args(last, paged.cache(), o, nullptr, {}));
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = codec::bf16_to_float(got[i]), r = load(o.out.t, i);
    ASSERT_TRUE(std::isfinite(g)) << "out element " << i << " of the last request not written";
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
  }
  EXPECT_LE(std::sqrt(diff2 / ref2), 1e-2);
  for (int64_t h = 0; h < hq; ++h)
    EXPECT_NEAR(got_lse[h], o.lse.data<float>()[h * lq + lq - 1], 2e-3) << "lse head " << h;
}

// Token ids (kv_block_size 1; docs/semantics.md, Token-sparse attention): q2k holds key positions,
// plans run one query per CTA (plan.cpp) and the producers copy every selected row by cp.async
// (load.cuh issue_token_stage; NVFP4 by its own per-slot copies).

// Rewrites t's q2k, on the host and the device: ids_of(h, b, i) gives the ids of query i of
// request b through kv head h (at most topk of them; the row's other slots get -1).
template <typename F>
void set_q2k(Bench& t, F&& ids_of) {
  const int64_t topk = t.cfg.topk;
  int32_t* q2k = t.q2k->data<int32_t>();
  for (int64_t h = 0; h < t.p.hkv; ++h)
    for (int64_t b = 0; b < t.p.batch(); ++b)
      for (int64_t i = 0; i < t.p.lq[b]; ++i) {
        const std::vector<int32_t> ids = ids_of(h, b, i);
        EXPECT_LE(int64_t(ids.size()), topk);
        int32_t* row = q2k + (h * t.p.total_q() + t.p.q_start(b) + i) * topk;
        for (int64_t s = 0; s < topk; ++s) row[s] = s < int64_t(ids.size()) ? ids[s] : -1;
      }
  copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
}

// Random token ids over G 1..16, both layouts, pages of 16-256 slots (shuffled over the pool, NaN
// in every slot without a key), 1-8 queries per request with empty requests (no queries, no keys),
// K from 1 to 2048 (K past a request's keys: every key selected), sorted and unsorted rows (ids
// and -1 in any slot), both CTA widths, bf16 and f16.
TEST(DecodeGpu, TokenIdsSweep) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, hkv, page;
    KVLayout layout;
    int max_q;
    int64_t topk;
    DType q = DType::bf16;
  };
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  std::vector<Shape> shapes = {
      {16, 2, 64, nhd, 1, 2048}, {16, 1, 16, hnd, 4, 40},  {8, 2, 128, nhd, 3, 64},
      {4, 2, 16, hnd, 2, 100},   {2, 3, 64, nhd, 5, 1},    {1, 4, 128, hnd, 8, 512, DType::f16},
      {16, 1, 256, nhd, 2, 7},   {1, 2, 32, nhd, 1, 2048}, {8, 1, 64, hnd, 4, 300, DType::f16},
  };
  if (small_tests()) shapes.resize(4);
  std::mt19937 rng(21);
  unsigned seed = 2100;
  for (int warps : kWidths)
    for (const Shape& sh : shapes) {
      SCOPED_TRACE("token ids, forced width " + std::to_string(warps));
      Config c = random_config(rng, small_tests() ? 3 : 5, sh.max_q, small_tests() ? 1500 : 6000,
                               true);
      c.warps = warps;
      c.hq = sh.g * sh.hkv;
      c.hkv = sh.hkv;
      c.page_size = sh.page;
      c.layout = sh.layout;
      c.q_dtype = c.kv_dtype = sh.q;
      c.topk = sh.topk;
      c.blk = 1;
      c.row_pad = (seed % 3) * 8;
      c.sorted_q2k = seed % 2 == 0;
      c.seed = seed++;
      Bench t(c);
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }
}

// K = 2048 over long requests: more union entries than one item holds (plan.h kMaxItemEntries),
// so every (query, kv head) splits over several CTAs and the last one combines; bit-identical
// reruns. The longest request has 65536 keys, all the union bitmap covers (its capacity a whole
// number of tiles while max_pages * page_size is larger), its last keys selected.
TEST(DecodeGpu, TokenIdsK2048Splits) {
  MSA_REQUIRE_GPU();
  for (int warps : kWidths) {
    SCOPED_TRACE("forced width " + std::to_string(warps));
    Config c;
    c.warps = warps;
    c.lq = {4, 1, 2};
    c.lk = {small_tests() ? 9000 : 65536, 2049, 3000};
    c.hq = 16;
    c.hkv = 2;
    c.page_size = 128;
    c.topk = 2048;
    c.blk = 1;
    c.seed = 2200 + unsigned(warps);
    Bench t(c);
    // Query 0 of request 0 takes the request's last 2048 keys (its causal limit hides the last 3),
    // every other query up to 2048 random ids.
    std::mt19937 rng(c.seed);
    set_q2k(t, [&](int64_t h, int64_t b, int64_t i) {
      std::vector<int32_t> ids(size_t(t.p.lk[b]));
      std::iota(ids.begin(), ids.end(), 0);
      if (b == 0 && i == 0) return std::vector<int32_t>(ids.end() - 2048, ids.end());
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(std::min<size_t>(ids.size(), 2048 - size_t(h + i)));
      std::sort(ids.begin(), ids.end());
      return ids;
    });
    t.expect_matches_reference_and_repeats();
  }
}

// Several queries per request (next_n > 1) whose ids are the same row, disjoint rows, or
// overlapping ones, at G = 1 and 4 (block plans would put 16 / G queries in one CTA); ids past a
// query's causal limit (the request's last keys) count for the later queries only, and a query
// whose every id is past its limit attends nothing (out 0, lse -inf).
TEST(DecodeGpu, TokenIdsSharedAndDisjointQueries) {
  MSA_REQUIRE_GPU();
  unsigned seed = 2300;
  for (int64_t g : {1, 4})
    for (int pattern = 0; pattern < 4; ++pattern) {
      SCOPED_TRACE("G " + std::to_string(g) + ", pattern " + std::to_string(pattern));
      Config c;
      c.lq = {4, 8, 1};
      c.lk = {777, 1500, 64};
      c.hq = g * 2;
      c.hkv = 2;
      c.page_size = 64;
      c.layout = pattern % 2 ? KVLayout::paged_hnd : KVLayout::paged_nhd;
      c.topk = 96;
      c.blk = 1;
      c.seed = seed++;
      Bench t(c);
      std::mt19937 rng(c.seed);
      std::vector<int32_t> shared(96);
      set_q2k(t, [&](int64_t h, int64_t b, int64_t i) {
        const int32_t lk = t.p.lk[b], lq = t.p.lq[b];
        std::vector<int32_t> ids;
        switch (pattern) {
          case 0:  // every query of the request the same random row (drawn for query 0)
            if (i == 0) {
              std::vector<int32_t> all(static_cast<size_t>(lk));
              std::iota(all.begin(), all.end(), 0);
              std::shuffle(all.begin(), all.end(), rng);
              all.resize(std::min<size_t>(all.size(), 96));
              shared = all;
            }
            return shared;
          case 1:  // disjoint: query i takes keys = i mod lq, the highest first
            for (int32_t j = lk - 1; j >= 0 && ids.size() < 96; --j)
              if (j % lq == i) ids.push_back(j);
            return ids;
          case 2:  // overlapping windows, unsorted
            for (int32_t j = std::max(0, lk - 120 + int32_t(i) * 5); j < lk && ids.size() < 96; ++j)
              ids.push_back(j);
            std::shuffle(ids.begin(), ids.end(), rng);
            return ids;
          default:  // only the keys past query i's causal limit: nothing for i < lq - 1
            for (int32_t j = std::max(0, lk - lq + int32_t(i) + 1); j < lk; ++j) ids.push_back(j);
            if (h == 1) ids.push_back(0);  // through kv head 1 also key 0, visible to all
            return ids;
        }
      });
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }
}

// Edge cases: K = 1; a request of one key (selected, or not); requests with no keys (every id
// -1) and with no queries; -1 between ids; non-causal; both widths.
TEST(DecodeGpu, TokenIdsEdgeCases) {
  MSA_REQUIRE_GPU();
  unsigned seed = 2400;
  for (int warps : kWidths)
    for (int64_t topk : {int64_t(1), int64_t(5), int64_t(70)})
      for (bool causal : {true, false}) {
        SCOPED_TRACE("forced width " + std::to_string(warps) + ", topk " + std::to_string(topk));
        Config c;
        c.warps = warps;
        c.lq = {1, 2, 0, 3, 1, 2};
        c.lk = {1, 1, 50, 0, 300, 129};
        c.hq = 16;
        c.hkv = 1;
        c.page_size = 16;
        c.topk = topk;
        c.blk = 1;
        c.causal = causal;
        c.seed = seed++;
        Bench t(c);
        set_q2k(t, [&](int64_t, int64_t b, int64_t i) {
          const int32_t lk = t.p.lk[b];
          std::vector<int32_t> ids;
          if (b == 1 && i == 1) return ids;  // request 1's second query: no id
          // the last keys, every other slot -1 (any slot may hold -1)
          for (int32_t j = lk - 1; j >= 0 && int64_t(ids.size()) + 1 < topk; j -= 2) {
            ids.push_back(j);
            ids.push_back(-1);
          }
          if (ids.empty() && lk > 0) ids.push_back(0);
          return ids;
        });
        t.plan_gpu();
        t.run_gpu();
        t.expect_matches_reference();
      }
}

// FP8 e4m3 KV (scales per tensor, per pool slot, per slot and head; NaN scales in the slots
// without a key), FP8 queries over FP8 and bf16 KV, NVFP4 KV (its block kernels: per-slot
// copies) and f16, with token ids, both widths.
TEST(DecodeGpu, TokenIdsQuantizedKv) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(25);
  unsigned seed = 2500;
  struct Kind {
    DType q, kv;
    Fp8Scale k, v;
    KVLayout layout;
    int64_t page, topk;
    int max_q;
    bool wide = false;
  };
  const Fp8Scale none = Fp8Scale::none, ten = Fp8Scale::per_tensor, tok = Fp8Scale::per_token,
                 th = Fp8Scale::per_token_head;
  const DType bf16 = DType::bf16, f16 = DType::f16, e4m3 = DType::fp8_e4m3, fp4 = DType::fp4x2;
  std::vector<Kind> kinds = {
      {bf16, e4m3, ten, ten, KVLayout::paged_nhd, 64, 200, 2},
      {f16, e4m3, tok, tok, KVLayout::paged_hnd, 16, 40, 3},
      {bf16, e4m3, th, tok, KVLayout::paged_nhd, 128, 2048, 1, true},
      {e4m3, e4m3, th, th, KVLayout::paged_hnd, 64, 100, 4},
      {e4m3, e4m3, ten, ten, KVLayout::paged_nhd, 16, 64, 2},
      {e4m3, bf16, none, none, KVLayout::paged_nhd, 128, 300, 2},
      {bf16, fp4, none, none, KVLayout::paged_nhd, 64, 500, 2},
      {e4m3, fp4, none, none, KVLayout::paged_hnd, 16, 40, 3},
      {f16, f16, none, none, KVLayout::paged_hnd, 128, 1000, 1},
  };
  if (small_tests()) kinds.resize(4);
  for (const Kind& kind : kinds)
    each_width(rng, kind.max_q, seed, [&](Config& c) {
      c.q_dtype = kind.q;
      c.kv_dtype = kind.kv;
      c.k_scale = kind.k;
      c.v_scale = kind.v;
      c.wide_scales = kind.wide;
      c.layout = kind.layout;
      c.page_size = kind.page;
      c.topk = kind.topk;
      c.blk = 1;
      c.sorted_q2k = seed % 2 == 0;
    });
}

// Head dims 64 and 256 with token ids: bf16 / f16 at both, FP8 KV and FP8 queries at 256.
TEST(DecodeGpu, TokenIdsHeadDims) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(26);
  unsigned seed = 2600;
  struct Kind {
    int64_t d;
    DType q, kv;
    int64_t page, topk;
  };
  const DType bf16 = DType::bf16, f16 = DType::f16, e4m3 = DType::fp8_e4m3;
  for (const Kind& kind : {Kind{64, bf16, bf16, 16, 300}, Kind{64, f16, f16, 128, 40},
                           Kind{64, e4m3, bf16, 64, 2048}, Kind{256, bf16, bf16, 64, 100},
                           Kind{256, f16, f16, 32, 2048}, Kind{256, bf16, e4m3, 128, 64},
                           Kind{256, e4m3, e4m3, 16, 500}})
    each_width(rng, 3, seed, [&](Config& c) {
      c.dim = kind.d;
      c.q_dtype = kind.q;
      c.kv_dtype = kind.kv;
      c.page_size = kind.page;
      c.topk = kind.topk;
      c.blk = 1;
      c.row_pad = (seed % 2) * 16;
    });
}

// Bad token ids are reported as block ids are (status: head, token, slot of the first offence):
// past the request's keys (id = Lk, far past it, INT_MAX), below -1; a repeated id, at K <= 64
// (the one-warp union) and K > 64 (the bitmap union), in sorted and unsorted rows.
TEST(DecodeGpu, TokenIdsBadIdsReported) {
  MSA_REQUIRE_GPU();
  const std::vector<int32_t> bad = {INT_MIN, -2, 0 /* Lk */, 1 /* Lk + 1000 */, INT_MAX};
  for (int64_t topk : {int64_t(4), int64_t(300)})
    for (size_t i = 0; i < bad.size(); ++i) {
      SCOPED_TRACE("topk " + std::to_string(topk) + ", id case " + std::to_string(i));
      Config c;
      c.lq = {2, 4, 3};
      c.lk = {500, 900, 260};
      c.hq = 8;
      c.hkv = 2;
      c.topk = topk;
      c.blk = 1;
      c.seed = 2700 + unsigned(i);
      Bench t(c);
      const int64_t total_q = t.p.total_q();
      auto put = [&](int64_t h, int64_t tok, int64_t slot) {
        int64_t b = 0;
        while (t.p.q_start(b + 1) <= tok) ++b;
        int32_t id = bad[i];
        if (i == 2) id = t.p.lk[b];
        if (i == 3) id = t.p.lk[b] + 1000;
        t.q2k->data<int32_t>()[(h * total_q + tok) * topk + slot] = id;
      };
      put(1, total_q - 1, 3);
      put(1, 4, 2);  // earlier in (head, token, slot) order
      copy_to_device(*t.q2k, t.q2k_d.buf, t.stream);
      t.plan_gpu();
      t.run_gpu();
      expect_status(t.status_words(), StatusCode::block_id_out_of_range, 1, 4, 2);
    }
  // A repeated id: the second occurrence is the offence.
  for (int64_t topk : {int64_t(4), int64_t(100)}) {
    SCOPED_TRACE("repeat, topk " + std::to_string(topk));
    Config c;
    c.lq = {3};
    c.lk = {1000};
    c.topk = topk;
    c.blk = 1;
    c.seed = 2750 + unsigned(topk);
    Bench t(c);
    const std::vector<std::vector<int32_t>> rows = {{0, 1, 2, 3}, {999, 5, -1, 5}, {7, 7, 7, 7}};
    set_q2k(t, [&](int64_t, int64_t, int64_t i) { return rows[size_t(i)]; });
    t.plan_gpu();
    t.run_gpu();
    expect_status(t.status_words(), StatusCode::block_id_repeated, 0, 1, 3);
  }
}

// Bad page ids under selected keys are reported (batch, column, page id) and their rows attend
// nothing; a clean page table then runs clean. K > 64 selecting every key (the bitmap union, page
// lookups by the producers), and K = 8 selecting the first key of each 128-key page (8 warps:
// pages read by the one-warp union).
TEST(DecodeGpu, TokenIdsBadPageIdsReported) {
  MSA_REQUIRE_GPU();
  struct Kind {
    int64_t topk, page;
  };
  for (const Kind kind : {Kind{600, 32}, Kind{8, 128}}) {
    SCOPED_TRACE("topk " + std::to_string(kind.topk) + " page " + std::to_string(kind.page));
    Config c;
    c.lq = {1, 2, 1, 3, 1};
    c.lk = {300, 500, 100, 580, 200};
    c.page_size = kind.page;
    c.topk = kind.topk;
    c.blk = 1;
    c.seed = 2800 + unsigned(kind.topk);
    Bench t(c);
    set_q2k(t, [&](int64_t, int64_t b, int64_t) {
      std::vector<int32_t> ids;
      const int32_t step = kind.topk > 64 ? 1 : int32_t(kind.page);
      for (int32_t j = 0; j < t.p.lk[b]; j += step) ids.push_back(j);
      return ids;
    });
    const int64_t mp = t.paged.page_table.t.shape[1], pages = t.paged.k.t.shape[0];
    const int col1 = kind.page == 32 ? 15 : 3, col3 = kind.page == 32 ? 7 : 4;  // within lk
    int32_t* pt = t.paged.page_table.data<int32_t>();
    pt[3 * mp + col3] = int32_t(pages);  // (batch 3, col3): one past the pool
    pt[1 * mp + col1] = INT_MIN;         // (batch 1, col1): the first offence
    pt[4 * mp + 0] = -1;
    copy_to_device(t.paged.page_table, t.page_table.buf, t.stream);
    t.plan_gpu();
    t.run_gpu();
    expect_status(t.status_words(), StatusCode::page_id_out_of_range, 1, col1, INT_MIN);
    const PagedKV clean = make_paged(t.p, c.layout, c.page_size, c.seed + 1);  // Bench's pages
    std::copy(clean.page_table.data<int32_t>(),
              clean.page_table.data<int32_t>() + clean.page_table.t.numel(), pt);
    copy_to_device(t.paged.page_table, t.page_table.buf, t.stream);
    t.run_gpu();
    t.expect_matches_reference("clean page table");
  }
}

// A captured graph replayed with new lengths (within the plan) and new token ids, both widths:
// G 16 on two kv heads, and an MQA plan (G 64, one query a CTA with all its heads).
TEST(DecodeGpu, TokenIdsGraphReplay) {
  MSA_REQUIRE_GPU();
  struct Shape {
    std::vector<int32_t> lq;
    int64_t hq, hkv, page, topk;
    unsigned seed, rng_seed, new_seed;
  };
  for (const Shape& sh : {Shape{{1, 4, 2, 8}, 32, 2, 32, 300, 2900, 29, 2950},
                          Shape{{1, 2, 2, 1}, 64, 1, 16, 512, 3300, 33, 3350}})
    for (int warps : kWidths) {
      SCOPED_TRACE("G " + std::to_string(sh.hq / sh.hkv) + ", forced width " +
                   std::to_string(warps));
      Config c;
      c.warps = warps;
      c.lq = sh.lq;
      c.lk = {3000, 257, 1800, 900};
      c.hq = sh.hq;
      c.hkv = sh.hkv;
      c.page_size = sh.page;
      c.topk = sh.topk;
      c.blk = 1;
      c.seed = sh.seed;
      expect_graph_replays(c, 4, sh.rng_seed, sh.new_seed);
    }
}

// Token ids with large and odd groups (docs/semantics.md, Token-sparse attention: MQA, one kv
// head for up to 128 query heads): a CTA holds one query with all of its G heads as a dense plan
// does (16-row tiles of its heads; D = 256 splits a group past 64 into chunks of its heads),
// plan.cpp geometry. MQA at G 64 and 128, G 32, odd groups (5, 24, 40, 48, 96), K 1, 64, 300 and
// 2048, 4 requests of 1-2 queries (some empty), pages of 16 and 64 (NaN in every slot without
// a key), both layouts, bf16, f16 and FP8 KV (per-tensor and per-slot scales), FP8 queries, head
// dims 64, 128 and 256, both CTA widths (4 warps where a plan has at most 64 rows), poisoned
// outputs, against the CPU reference.
TEST(DecodeGpu, TokenIdsLargeGroups) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, d, page;
    KVLayout layout;
    int64_t topk;
    DType q, kv;
    Fp8Scale scale = Fp8Scale::per_tensor;
  };
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf16 = DType::bf16, f16 = DType::f16, e4m3 = DType::fp8_e4m3;
  std::vector<Shape> shapes = {
      {64, 128, 64, nhd, 2048, bf16, bf16},
      {128, 128, 16, hnd, 2048, bf16, bf16},
      {32, 128, 64, nhd, 64, bf16, bf16},
      {24, 128, 16, nhd, 1, bf16, bf16},
      {48, 128, 64, hnd, 300, f16, f16},
      {64, 128, 16, nhd, 64, bf16, e4m3},
      {128, 128, 64, hnd, 2048, bf16, e4m3, Fp8Scale::per_token_head},
      {64, 128, 64, nhd, 1, e4m3, e4m3, Fp8Scale::per_token},
      {5, 128, 16, nhd, 300, bf16, bf16},
      {40, 64, 64, nhd, 64, bf16, bf16},
      {128, 64, 16, hnd, 2048, f16, f16},
      {96, 256, 64, nhd, 300, bf16, bf16},
      {128, 256, 16, hnd, 2048, bf16, e4m3},
      {64, 256, 64, nhd, 64, bf16, bf16},
  };
  if (small_tests()) shapes.resize(4);
  std::mt19937 rng(31);
  unsigned seed = 3100;
  for (int warps : kWidths)
    for (const Shape& sh : shapes) {
      SCOPED_TRACE("G " + std::to_string(sh.g) + ", forced width " + std::to_string(warps));
      Config c = random_config(rng, 4, 2, small_tests() ? 600 : 3000, true);
      c.warps = warps;
      c.hq = sh.g;
      c.hkv = 1;
      c.dim = sh.d;
      c.page_size = sh.page;
      c.layout = sh.layout;
      c.q_dtype = sh.q;
      c.kv_dtype = sh.kv;
      c.k_scale = c.v_scale = sh.scale;
      c.topk = sh.topk;
      c.blk = 1;
      c.row_pad = (seed % 3) * 16;  // elements: 16-byte rows for FP8 too
      c.sorted_q2k = seed % 2 == 0;
      c.seed = seed++;
      Bench t(c);
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }
}

// MQA at G 128 and 64 with K = 2048 over long requests: every (query, kv head) splits into at
// least four items (plan.h kMaxItemEntries), each holding the query's G rows, and the last one
// combines partials of G rows; bit-identical reruns. D = 256 at G 128: two chunks of 64 heads,
// each split and combined on its own.
TEST(DecodeGpu, TokenIdsLargeGroupsK2048Splits) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, d;
    DType kv;
  };
  for (const Shape sh : {Shape{128, 128, DType::bf16}, Shape{64, 128, DType::fp8_e4m3},
                         Shape{128, 256, DType::bf16}})
    for (int warps : kWidths) {
      SCOPED_TRACE("G " + std::to_string(sh.g) + " D " + std::to_string(sh.d) + ", forced width " +
                   std::to_string(warps));
      Config c;
      c.warps = warps;
      c.lq = {2, 1, 2};
      c.lk = {small_tests() ? 5000 : 20000, 2049, 3000};
      c.hq = sh.g;
      c.hkv = 1;
      c.dim = sh.d;
      c.kv_dtype = sh.kv;
      c.page_size = 64;
      c.topk = 2048;
      c.blk = 1;
      c.seed = 3200 + unsigned(sh.g + sh.d) + unsigned(warps);
      Bench t(c);
      std::mt19937 rng(c.seed);
      set_q2k(t, [&](int64_t, int64_t b, int64_t i) {
        std::vector<int32_t> ids(size_t(t.p.lk[b]));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(std::min<size_t>(ids.size(), 2048 - size_t(i)));
        if (b == 0) std::sort(ids.begin(), ids.end());
        return ids;
      });
      t.expect_matches_reference_and_repeats();
    }
}

// Sparse decode over kv blocks of 64 and 128 with groups that do not divide 16 (one kv head, as
// the sparse GQA rule asks): the same one-query CTAs as token ids (plan.cpp geometry), at G 3,
// 24, 64, 96 (D = 256: chunks of its heads) and 128, bf16 and FP8 KV, both widths. The groups
// that divide 16 keep their 16-row tiles (SweepDenseAndSparse).
TEST(DecodeGpu, SparseBlocksAnyGroup) {
  MSA_REQUIRE_GPU();
  struct Shape {
    int64_t g, d;
    int blk;
    int64_t topk;
    DType kv;
    int max_q;
  };
  std::vector<Shape> shapes = {
      {3, 128, 64, 6, DType::bf16, 4},        {24, 128, 128, 40, DType::bf16, 2},
      {64, 128, 64, 16, DType::fp8_e4m3, 2},  {128, 128, 128, 8, DType::bf16, 1},
      {96, 256, 64, 12, DType::bf16, 2},      {128, 256, 128, 70, DType::fp8_e4m3, 1},
      {48, 64, 128, 5, DType::bf16, 3},
  };
  if (small_tests()) shapes.resize(3);
  std::mt19937 rng(34);
  unsigned seed = 3400;
  for (int warps : kWidths)
    for (const Shape& sh : shapes) {
      SCOPED_TRACE("G " + std::to_string(sh.g) + ", forced width " + std::to_string(warps));
      Config c = random_config(rng, 4, sh.max_q, small_tests() ? 700 : 2500, true);
      c.warps = warps;
      c.hq = sh.g;
      c.hkv = 1;
      c.dim = sh.d;
      c.kv_dtype = sh.kv;
      c.page_size = 64;
      c.layout = seed % 2 ? KVLayout::paged_hnd : KVLayout::paged_nhd;
      c.topk = sh.topk;
      c.blk = sh.blk;
      c.sorted_q2k = seed % 2 == 0;
      c.seed = seed++;
      Bench t(c);
      t.plan_gpu();
      t.run_gpu();
      t.expect_matches_reference();
    }
}

// What stays refused for sparse decode on CUDA, as on the CPU (the sparse GQA rule): a group
// outside 1, 2, 4, 8, 16 with more than one kv head, for token ids and blocks.
TEST(DecodeGpu, SparseGroupsRefused) {
  MSA_REQUIRE_GPU();
  for (int blk : {1, 64}) {
    SCOPED_TRACE("kv_block_size " + std::to_string(blk));
    Config c;
    c.lq = {1, 2};
    c.lk = {300, 100};
    c.hq = 64;
    c.hkv = 2;
    c.topk = 8;
    c.blk = blk;
    c.seed = 3500;
    Bench t(c);
    expect_error([&] { t.plan_gpu(); },
                 "decode shape (topk > 0): a sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or "
                 "16 (or one kv head for up to 128 query heads), got 32");
  }
}

// Plan-time limits of token ids: a request's planned capacity (its length rounded up to 128 keys,
// or max_pages * page_size without host lengths) must fit the union bitmap's 65536 keys
// (msa::Error naming the request), whatever max_pages * page_size; lengths that grow past the
// plan at run time are reported as for blocks.
TEST(DecodeGpu, TokenIdsPlanLimits) {
  MSA_REQUIRE_GPU();
  Config c;
  c.lq = {2, 1};
  c.lk = {60000, 3};
  c.hq = 16;
  c.hkv = 1;
  c.page_size = 256;  // max_pages * page_size: 236 x 256 = 60416 keys (one spare column)
  c.topk = 64;
  c.blk = 1;
  c.seed = 3000;
  Bench t(c);
  t.plan_gpu();
  t.run_gpu();
  t.expect_matches_reference();
  // A request of 65537 keys: refused; planned at 65536 keys, the same shape plans (max_pages *
  // page_size = 258 x 256 = 66048 keys, past the bitmap).
  Config big = c;
  big.lk = {65537, 3};
  big.seed = 3001;
  Bench tb(big);
  expect_error([&] { tb.plan_gpu(); },
               "decode: sparse CUDA decode with token ids (kv_block_size 1) takes up to 65536 keys "
               "per request; request 0 has 65537 keys (planned capacity 65664");
  const int64_t cap = tb.paged.page_table.t.shape[1] * big.page_size;
  expect_error([&] { tb.plan_gpu(nullptr); }, "request 0 has " + std::to_string(cap) + " keys");
  std::vector<int32_t> shorter = {65536, 3};
  tb.plan_gpu(shorter.data());  // planned, with max_pages * page_size past the bitmap
  // The run's lengths past that plan: reported, the keys past it not attended.
  tb.run_gpu();
  expect_status(tb.status_words(), StatusCode::kv_length_past_plan, 0, 65537, 65536);
  std::copy(shorter.begin(), shorter.end(), tb.paged.seqused_k.data<int32_t>());
  copy_to_device(tb.paged.seqused_k, tb.seqused.buf, tb.stream);
  set_q2k(tb, [&](int64_t, int64_t b, int64_t i) {
    std::vector<int32_t> ids;
    for (int32_t j = shorter[b] - 1; j >= 0 && ids.size() < 64; j -= 1 + int32_t(i) * 17)
      ids.push_back(j);
    return ids;
  });
  tb.run_gpu();
  tb.expect_matches_reference("65536 keys");
}

}  // namespace
}  // namespace msa::test
