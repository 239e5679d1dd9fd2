// GPU sparse attention forward (src/cuda/sm90/sparse_fwd) against the CPU reference backend:
// a sweep of random varlen configurations (G 1-16, top-K 1-32, causal both ways, empty requests,
// -1 slots, NaN in unselected KV rows), poisoned outputs with every element checked, bitwise
// run-to-run equality (with and without a GPU-built K2QIndex), and device-reported bad ids.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <algorithm>
#include <vector>

#include "cuda/sm90/sparse_fwd/plan.h"
#include "support/expect_error.h"
#include "support/sparse_case.h"

namespace msa::test {
namespace {

struct Outputs {
  HostTensor out, lse, tlse;
};

Outputs make_outputs(const SparseCase& c) {
  const int64_t tq = c.p.total_q();
  return Outputs{HostTensor(c.p.out_dtype(), {tq, c.p.hq, c.p.dim}),
                 HostTensor(DType::f32, {c.p.hq, tq}),
                 HostTensor(DType::f32, {c.p.hq, c.temperature > 0.f ? tq : 0})};
}

Outputs run_cpu(const SparseCase& c) {
  Outputs o = make_outputs(c);
  AttentionArgs a = cpu_args(c);
  a.out = o.out.t;
  a.lse = o.lse.t;
  if (c.temperature > 0.f) a.tlse = o.tlse.t;
  attention_forward(a);
  return o;
}

// The inputs on the device, plus a GPU-built K2QIndex of them.
struct DeviceCase {
  DeviceTensor q;
  std::optional<DeviceTensor> q_scale;  // FP8 q
  DeviceQTensor k, v;  // values with their FP8 scales, if any
  DeviceTensor cu_q, cu_k, q2k;
  std::optional<DeviceTensor> causal_offset, key_mask;
  DeviceBuffer row_ptr, q_idx, schedule, csr_ws, status;
  K2QIndex k2q;

  int64_t rows = 0;  // the CSR's rows: the batches' blocks, plus `extra_rows` empty ones

  // extra_rows > 0: a row_ptr sized for an upper bound of the rows (as callers size it without
  // reading the lengths), the rows past the batches' blocks left empty by the builder.
  float k_global = 1.f, v_global = 1.f;

  DeviceCase(const SparseCase& c, cudaStream_t s, int64_t extra_rows = 0)
      : q(to_device(c.p.q, s)), k(to_device(c.p.k, c.p.k_scale, s)),
        v(to_device(c.p.v, c.p.v_scale, s)), k_global(c.p.k_global), v_global(c.p.v_global),
        cu_q(to_device(c.p.cu_q, s)), cu_k(to_device(c.p.cu_k, s)), q2k(to_device(c.q2k, s)),
        status(16), rows(c.total_rows + extra_rows) {
    if (c.p.q_scale) q_scale = to_device(*c.p.q_scale, s);
    if (c.causal_offset) causal_offset = to_device(*c.causal_offset, s);
    if (c.key_mask) key_mask = to_device(*c.key_mask, s);
    const int64_t hkv = c.p.hkv, tq = c.p.total_q();
    row_ptr = DeviceBuffer(std::max<int64_t>(16, hkv * (rows + 1) * 4));
    q_idx = DeviceBuffer(std::max<int64_t>(16, hkv * tq * c.topk * 4));
    const int64_t sched = k2q_schedule_size(hkv, rows, tq, c.topk);
    schedule = DeviceBuffer(sched * 4);
    k2q.row_ptr = Tensor(row_ptr.get(), DType::i32, {hkv, rows + 1}, gpu0());
    k2q.q_idx = Tensor(q_idx.get(), DType::i32, {hkv, tq * c.topk}, gpu0());
    k2q.schedule = Tensor(schedule.get(), DType::i32, {sched}, gpu0());
    clear_status(status_t(), s);
  }
  Tensor status_t() const { return Tensor(status.get(), DType::i32, {4}, gpu0()); }
  KVCache kv() const {
    KVCache kv;
    kv.k = k.view();
    kv.v = v.view();
    kv.k.global_scale = k_global;
    kv.v.global_scale = v_global;
    kv.cu_seqlens_k = cu_k.t;
    return kv;
  }
  void build_csr(const SparseCase& c, cudaStream_t s) {
    CsrBuildArgs b;
    b.q2k = q2k.t;
    b.cu_seqlens_q = cu_q.t;
    b.kv = kv();
    b.out = k2q;
    b.kv_block_size = int(c.blk);
    const size_t need = csr_workspace_bytes(c.p.hkv, rows, c.p.total_q(), c.topk);
    csr_ws = DeviceBuffer(std::max<size_t>(need, 256));
    b.workspace = Tensor(csr_ws.get(), DType::u8, {int64_t(need)}, gpu0());
    b.status = status_t();
    build_k2q_csr(b, s);
  }
};

// Runs the GPU forward into poisoned outputs; with_k2q: pass the GPU-built index.
// The device status is checked after the call: an msa::Error, or with `status_error` its message
// there (the outputs returned all the same).
// The call's arguments over d's inputs into the device outputs out / lse / tlse.
AttentionArgs gpu_args(const SparseCase& c, const DeviceCase& d, bool with_k2q,
                       const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& tlse) {
  AttentionArgs a;
  a.params = params_of(c);
  a.q = d.q.t;
  if (d.q_scale) a.q_scale = d.q_scale->t;
  a.kv = d.kv();
  a.cu_seqlens_q = d.cu_q.t;
  if (!c.dense) a.q2k = d.q2k.t;
  if (d.causal_offset) a.causal_offset = d.causal_offset->t;
  if (d.key_mask) a.key_mask = d.key_mask->t;
  a.key_mask_rows = c.key_mask_rows;
  if (with_k2q) a.k2q = d.k2q;
  a.out = out.t;
  a.lse = lse.t;
  if (c.temperature > 0.f) a.tlse = tlse.t;
  a.status = d.status_t();
  return a;
}

Outputs run_gpu(const SparseCase& c, DeviceCase& d, bool with_k2q, cudaStream_t s,
                std::string* status_error = nullptr) {
  Outputs host = make_outputs(c);
  DeviceTensor out = device_like(host.out, s), lse = device_like(host.lse, s),
               tlse = device_like(host.tlse, s);
  AttentionArgs a = gpu_args(c, d, with_k2q, out, lse, tlse);
  run_attention_poisoned_workspace(a, s);
  copy_to_host(out, host.out, s);
  copy_to_host(lse, host.lse, s);
  copy_to_host(tlse, host.tlse, s);
  if (status_error == nullptr) {
    check_status(d.status_t(), s);
  } else {
    try {
      check_status(d.status_t(), s);
    } catch (const Error& e) {
      *status_error = e.what();
    }
  }
  return host;
}

// docs/semantics.md, Numerics, on out, lse and (with a temperature) tlse: FP8 / FP4 K/V against
// the reference of the same bits within 3e-2 (the GPU rounds each value * scale to bf16).
void expect_close(const SparseCase& c, const Outputs& gpu, const Outputs& ref) {
  const bool fp8 = c.p.k.t.dtype == DType::fp8_e4m3 || c.p.k.t.dtype == DType::fp4x2 ||
                   c.p.q.t.dtype == DType::fp8_e4m3;
  expect_out_close(gpu.out, ref.out, fp8 ? 3e-2 : 1e-2);
  expect_stat_close(gpu.lse, ref.lse, "lse", fp8 ? 3e-2 : 2e-3);
  if (c.temperature > 0.f) expect_stat_close(gpu.tlse, ref.tlse, "tlse", fp8 ? 3e-2 : 2e-3);
}

void expect_bitwise(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(std::memcmp(a.out.t.data, b.out.t.data, a.out.bytes()), 0) << "out differs";
  EXPECT_EQ(std::memcmp(a.lse.t.data, b.lse.t.data, a.lse.bytes()), 0) << "lse differs";
  EXPECT_EQ(std::memcmp(a.tlse.t.data, b.tlse.t.data, a.tlse.bytes()), 0) << "tlse differs";
}

// c on the GPU against the CPU reference; outside the sanitizer runs (small), bitwise equal on a
// second run with the caller's k2q (built on the GPU).
void expect_matches_cpu_and_repeats(const SparseCase& c, bool small, cudaStream_t s) {
  const Outputs ref = run_cpu(c);
  DeviceCase d(c, s);
  const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
  expect_close(c, g1, ref);
  if (small) return;
  d.build_csr(c, s);
  expect_bitwise(g1, run_gpu(c, d, /*with_k2q=*/true, s));
}

// Every FP8 scale layout: none, per tensor, per token, per token and head.
constexpr Fp8Scale kFp8Kinds[] = {Fp8Scale::none, Fp8Scale::per_tensor, Fp8Scale::per_token,
                                  Fp8Scale::per_token_head};

// bf16 q over FP8 e4m3 K/V (dequantized in the workspace, then the bf16 kernels): every scale
// layout, both paths (tok and blk selections), NaN in the unselected K/V rows; bitwise
// repeatable.
TEST(SparseFwdGpu, Fp8KvMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 4 : 16); ++i) {
    const SparseCase c = random_case(200 + i, small, true, kFp8Kinds[i % 4]);
    SCOPED_TRACE(c.name);
    expect_matches_cpu_and_repeats(c, small, s);
    if (HasFailure()) break;
  }
}

// bf16 q over NVFP4 and MXFP4 K/V (flat), dequantized in the workspace like FP8.
TEST(SparseFwdGpu, Fp4KvMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  int run = 0;
  for (int i = 0; run < (small ? 2 : 8); ++i) {
    SparseCase c = random_case(400 + i, small);
    if (c.p.q.t.dtype != DType::bf16) continue;  // FP4 K/V take bf16 q on CUDA
    const bool nvfp4 = run++ % 2 == 0;
    quantize_kv_fp4(c.p, nvfp4);
    SCOPED_TRACE(c.name + (nvfp4 ? " nvfp4" : " mxfp4"));
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    expect_close(c, run_gpu(c, d, /*with_k2q=*/false, s), ref);
    if (HasFailure()) break;
  }
}

// q as an engine quantizes it: c's bf16 draw through msa::quantize (scales amax / 448 per tensor,
// token, or token and head; every 7th scale then zeroed: rows of equal scores,
// sparse_fwd/params.h row_scale_log2), or cast to e4m3 without a scale (Fp8Scale::none).
void quantize_queries(SparseCase& c, Fp8Scale kind) {
  const int64_t tq = c.p.total_q();
  HostTensor q8(DType::fp8_e4m3, {tq, c.p.hq, c.p.dim});
  if (kind == Fp8Scale::none) {
    for (int64_t e = 0; e < q8.t.numel(); ++e)
      q8.data<uint8_t>()[e] = codec::float_to_e4m3(float(load(c.p.q.t, e)));
    c.p.q_scale.reset();
  } else {
    const QuantFormat fmt = kind == Fp8Scale::per_tensor ? QuantFormat::fp8_per_tensor
                            : kind == Fp8Scale::per_token ? QuantFormat::fp8_per_token
                                                          : QuantFormat::fp8_per_token_head;
    std::vector<int64_t> sshape{kind == Fp8Scale::per_tensor ? 1 : tq};
    if (kind == Fp8Scale::per_token_head) sshape.push_back(c.p.hq);
    HostTensor sc(DType::f32, sshape);
    quantize(c.p.q.t, fmt, QTensor(q8.t, sc.t));
    if (sc.t.numel() > 1)
      for (int64_t e = 0; e < sc.t.numel(); e += 7) sc.data<float>()[e] = 0.f;
    c.p.q_scale = std::move(sc);
  }
  c.p.q = std::move(q8);
}

// FP8 e4m3 q (no scale, or scales per tensor, token, token and head) over bf16 and NVFP4 K/V (q's
// values copied exactly to bf16, the scales in each row's score scale) and over FP8 K/V (QK on
// e4m3 operands): both paths, against the CPU reference.
TEST(SparseFwdGpu, Fp8QueriesMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  int run = 0;
  for (int i = 0; run < (small ? 3 : 9); ++i) {
    const int kv = run % 3;  // 0 bf16, 1 FP8 per token and head, 2 NVFP4
    SparseCase c = random_case(600 + i, small, true,
                               kv == 1 ? std::optional(Fp8Scale::per_token_head) : std::nullopt);
    if (c.p.q.t.dtype != DType::bf16) continue;  // FP8 q takes bf16 (or quantized) K/V
    if (kv == 2) quantize_kv_fp4(c.p, true);
    quantize_queries(c, kFp8Kinds[run % 4]);
    ++run;
    SCOPED_TRACE(c.name + " fp8 q, kv kind " + std::to_string(kv));
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    expect_close(c, run_gpu(c, d, /*with_k2q=*/false, s), ref);
    if (HasFailure()) break;
  }
}

// FP8 q over FP8 K/V, QK^T on e4m3 operands with the per-key K scales applied to S (the kFp8
// kernels, DESIGN.md section 15), over kv blocks of `blk` keys: `runs` random cases from `seed`
// on, every q scale kind against every K/V scale kind, tok and blk selections (KV-major and
// uniform kernels), NaN in the unselected K/V rows; the CPU reference within the FP8 tolerance,
// and (outside the sanitizer runs) bitwise equal on a second run with the caller's k2q. `edit`,
// if given, changes case number `run` before it runs.
void expect_fp8qk_sweep_matches_cpu(int seed, int runs, int64_t blk, cudaStream_t s,
                                    const std::function<void(SparseCase&, int)>& edit = nullptr) {
  const bool small = small_tests();
  int run = 0;
  for (int i = 0; run < runs; ++i) {
    SparseCase c = random_case(seed + i, small, true, kFp8Kinds[run % 4], blk);
    if (c.p.q.t.dtype != DType::bf16) continue;
    const Fp8Scale q_kind = kFp8Kinds[(run / 4 + run) % 4];
    quantize_queries(c, q_kind);
    if (edit) edit(c, run);
    ++run;
    SCOPED_TRACE(c.name + " fp8 q (scale kind " + std::to_string(int(q_kind)) + ")");
    expect_matches_cpu_and_repeats(c, small, s);
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(SparseFwdGpu, Fp8QkMatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  expect_fp8qk_sweep_matches_cpu(1500, small_tests() ? 4 : 16, 128, s);
}

// One attention_forward call of case c (the caller's k2q when with_k2q) into its own outputs and
// a workspace of the size it asks for, captured as a CUDA graph on s (not launched).
struct CapturedCall {
  Outputs host;
  DeviceTensor out, lse, tlse;
  DeviceBuffer ws;
  cudaGraph_t graph = nullptr;
  CapturedCall(const SparseCase& c, const DeviceCase& d, bool with_k2q, cudaStream_t s)
      : host(make_outputs(c)), out(device_like(host.out, s)), lse(device_like(host.lse, s)),
        tlse(device_like(host.tlse, s)) {
    AttentionArgs a = gpu_args(c, d, with_k2q, out, lse, tlse);
    const size_t need = attention_workspace_bytes(a);
    ws = DeviceBuffer(std::max<size_t>(need, 256));
    a.workspace = Tensor(ws.get(), DType::u8, {int64_t(need)}, gpu0());
    MSA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    attention_forward(a, s);
    MSA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  }
  ~CapturedCall() { cudaGraphDestroy(graph); }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
};

// The launch budget of a prefill call (issue: at most 4 launches): with the caller's k2q (with or
// without its schedule) or without one (the CSR built in the call), at most 4 kernels (the fused
// prep, the KV-major and uniform kernels, the combine) and no memset, counted on a CUDA graph
// capture of the call; the graph, replayed into poisoned outputs and a poisoned workspace, gives
// the bits of the direct call, which match the call over build_k2q_csr's CSR.
TEST(SparseFwdGpu, CallIsFourLaunchesAndReplaysFromAGraph) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const char* modes[] = {"k2q with its schedule", "k2q without a schedule", "no k2q"};
  for (int i : {3, 8, 21}) {
    for (int mode = 0; mode < 3; ++mode) {
      const SparseCase c = random_case(i, small);
      SCOPED_TRACE(c.name + ", " + modes[mode]);
      DeviceCase d(c, s);
      const Outputs built = run_gpu(c, d, /*with_k2q=*/false, s);
      if (mode == 0) expect_close(c, built, run_cpu(c));
      d.build_csr(c, s);
      if (mode == 1) d.k2q.schedule = Tensor();
      const bool with_k2q = mode < 2;
      expect_bitwise(built, run_gpu(c, d, /*with_k2q=*/true, s));

      CapturedCall call(c, d, with_k2q, s);
      Outputs& host = call.host;
      expect_launch_budget(call.graph, 4);
      cudaGraphExec_t exec;
      MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, call.graph, 0));
      for (int replay = 0; replay < 2; ++replay) {
        call.ws.poison(s);
        call.out.buf.poison(s);
        call.lse.buf.poison(s);
        call.tlse.buf.poison(s);
        MSA_CUDA_CHECK(cudaGraphLaunch(exec, s));
        MSA_CUDA_CHECK(cudaStreamSynchronize(s));
        check_status(d.status_t(), s);
        copy_to_host(call.out, host.out, s);
        copy_to_host(call.lse, host.lse, s);
        copy_to_host(call.tlse, host.tlse, s);
        expect_bitwise(built, host);
      }
      MSA_CUDA_CHECK(cudaGraphExecDestroy(exec));
      if (HasFailure()) return;
    }
  }
}

// The combine inside the KV-major kernel (merge.cuh) writes the combine kernel's bits: random
// cases run with it and without it (the calls it takes, bf16 at D = 128 with top-K <= 16 and
// G >= 2, are 3 launches; the others 4, the same kernels either way), into poisoned outputs.
TEST(SparseFwdGpu, MergeMatchesCombineBitwise) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const bool was = cuda::sparse_fwd::merge_enabled();
  int merged = 0;
  for (int i = 0; i < (small ? 10 : 40); ++i) {
    const SparseCase c = random_case(900 + i, small);
    SCOPED_TRACE(c.name);
    DeviceCase d(c, s);
    cuda::sparse_fwd::set_merge_enabled(false);
    const Outputs combined = run_gpu(c, d, /*with_k2q=*/false, s);
    cuda::sparse_fwd::set_merge_enabled(true);
    const Outputs merged_out = run_gpu(c, d, /*with_k2q=*/false, s);
    expect_bitwise(combined, merged_out);
    if (graph_nodes(CapturedCall(c, d, /*with_k2q=*/false, s).graph).kernels == 3) ++merged;
    if (HasFailure()) break;
  }
  cuda::sparse_fwd::set_merge_enabled(was);
  EXPECT_GT(merged, 0) << "no case ran the merging kernel";
}

TEST(SparseFwdGpu, RandomSweepMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  const int n = small ? 6 : 56;
  TestStream s;
  for (int i = 0; i < n; ++i) {
    const SparseCase c = random_case(i, small);
    SCOPED_TRACE(c.name);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
    expect_close(c, g1, ref);
    if (small) continue;  // the sanitizer run checks memory, not determinism
    expect_within_fa3_bar(c, g1.out, 29);  // sampled rows: the sweep stays well inside 120 s
    d.build_csr(c, s);
    const Outputs g2 = run_gpu(c, d, /*with_k2q=*/true, s);
    expect_bitwise(g1, g2);
    const Outputs g3 = run_gpu(c, d, /*with_k2q=*/true, s);
    expect_bitwise(g2, g3);
    if (HasFailure()) break;
  }
}

// A named shape: lengths per request, group, kv heads, top-K, causal, block-uniform selections
// (over query blocks of qblock tokens).
struct Edge {
  std::vector<int32_t> lq, lk;
  int64_t g, hkv, topk;
  bool causal, blk;
  int64_t qblock = 128;
};

// Each edge (indexer-like q2k over blocks of kv_block keys, NaN in unselected K/V rows) on the
// GPU against the CPU reference and the FA3 bar, then bitwise equal with a GPU-built K2QIndex and
// with one sized for extra rows. seed: of the edges' selections and inputs; dim: the head dim.
template <size_t N>
void expect_edges_match_cpu(const Edge (&edges)[N], int64_t kv_block, unsigned seed,
                            cudaStream_t s, int64_t dim = 128) {
  int idx = 0;
  for (const Edge& e : edges) {
    std::mt19937 rng(seed + unsigned(idx));
    Problem prob = make_problem(e.lq, e.lk, e.g * e.hkv, e.hkv, dim, 5 * seed + unsigned(idx));
    HostTensor ids = indexer_like_q2k(prob, e.topk, e.causal, rng, e.blk, kv_block, e.qblock);
    SparseCase c(std::move(prob), std::move(ids), e.topk, kv_block);
    c.causal = e.causal;
    poison_unselected(c.p, c.q2k, c.topk, kv_block);
    SCOPED_TRACE("edge " + std::to_string(idx++) + ", kv_block " + std::to_string(kv_block) +
                 ", D " + std::to_string(dim));
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, false, s);
    expect_close(c, g1, ref);
    expect_within_fa3_bar(c, g1.out, 1);
    d.build_csr(c, s);
    expect_bitwise(g1, run_gpu(c, d, true, s));
    DeviceCase padded(c, s, /*extra_rows=*/1 + idx % 3);
    padded.build_csr(c, s);
    expect_bitwise(g1, run_gpu(c, padded, true, s));
  }
}

// Named edges: one block, lengths 1, G=16 with a 4-token tile of which 1 token is used, top-K
// far above the block count, requests without queries or keys, Lq > Lk, and block-uniform
// selections (the Q-major path); each also bitwise equal with a GPU-built K2QIndex.
TEST(SparseFwdGpu, NamedEdges) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const Edge edges[] = {
      {{1}, {1}, 16, 1, 4, true, false},
      {{1}, {129}, 16, 2, 1, true, false},
      {{0, 0, 3, 0}, {0, 5, 300, 0}, 8, 1, 64, true, false},
      {{200}, {100}, 4, 2, 8, true, false},   // Lq > Lk: the first 100 queries see nothing
      {{130, 7}, {257, 7}, 1, 1, 3, false, false},
      {{64}, {128}, 2, 3, 2, true, false},
      // uniform path: G = 16 (8-token units), G = 1 (128-token units), partial last blocks,
      // Lq > Lk, Lq < Lk, a request without keys next to ones with keys
      {{300, 129}, {300, 1000}, 16, 1, 8, true, true},
      {{257, 40, 0, 9}, {400, 0, 5, 130}, 1, 2, 4, true, true},
      {{200}, {90}, 4, 2, 16, true, true},
      {{333}, {333}, 8, 1, 32, false, true},
      // selections shared by 64-query blocks: the uniform path's 64-token query blocks (G >= 2)
      {{300, 129}, {300, 1000}, 16, 1, 8, true, true, 64},
      {{257, 40, 0, 9}, {400, 0, 5, 130}, 2, 2, 4, true, true, 64},
      {{333}, {333}, 4, 2, 8, false, true, 64},
  };
  expect_edges_match_cpu(edges, 128, 77, s);
}

// K's rows scaled by f(key / blk) in place (stored in K's dtype, the reference reading the same;
// FP8 K without scales, its codes re-encoded).
template <class F>
void scale_k_blocks(Problem& prob, int64_t blk, F f) {
  const bool fp8 = prob.k.t.dtype == DType::fp8_e4m3;
  ASSERT_FALSE(fp8 && prob.k_scale) << "scale_k_blocks: FP8 K with scales";
  for (int64_t b = 0; b < prob.batch(); ++b)
    for (int64_t i = 0; i < prob.lk[b]; ++i) {
      const int64_t row = prob.k_start(b) + i;
      const float fi = f(i / blk);
      for (int64_t h = 0; h < prob.hkv; ++h)
        for (int64_t d = 0; d < prob.dim; ++d) {
          double& val = prob.k_val[(row * prob.hkv + h) * prob.dim + d];
          if (fp8) {
            uint8_t& code = prob.k.data<uint8_t>()[prob.k.offset({row, h, d})];
            code = codec::float_to_e4m3(float(val) * fi);
            val = codec::e4m3_to_float(code);
          } else {
            val = store(prob.k.t, prob.k.offset({row, h, d}), float(val) * fi);
          }
        }
    }
}

// Scores whose block maxima differ by far more than the uniform path's rescale slack (2^8 in the
// log2 domain): K of block b is scaled by 1 + 3 b, so later blocks raise a row's running base
// mid-unit and O must be rescaled (random inputs keep every block's maximum within the slack,
// so the sweep alone never takes that branch). Block-uniform and per-token selections, G = 16
// and G = 4, with and without a temperature.
TEST(SparseFwdGpu, WideScoreRangeMatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  struct Wide { int64_t g; bool blk; float temperature; };
  const Wide cases[] = {{16, true, 0.f}, {4, true, 1.5f}, {16, false, 0.f}, {1, true, 0.f}};
  int idx = 0;
  for (const Wide& w : cases) {
    SCOPED_TRACE("wide " + std::to_string(idx));
    Problem prob = make_problem({700, 300}, {700, 900}, w.g * 2, 2, 128, 900u + unsigned(idx));
    scale_k_blocks(prob, 128, [](int64_t b) { return 1.f + 3.f * float(b); });
    std::mt19937 rng(31 + idx++);
    HostTensor ids = indexer_like_q2k(prob, 8, true, rng, w.blk);
    SparseCase c(std::move(prob), std::move(ids), 8);
    c.causal = true;
    c.temperature = w.temperature;
    poison_unselected(c.p, c.q2k, c.topk);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, false, s);
    expect_close(c, g1, ref);
    expect_within_fa3_bar(c, g1.out, 1);
  }
}

// Bad block ids are reported through the status buffer (first offence) and never dereferenced.
TEST(SparseFwdGpu, InvalidIdsReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const int32_t bad_ids[] = {INT32_MIN, -123456, -2, 3, 1003, INT32_MAX};
  for (int32_t bad : bad_ids) {
    std::mt19937 rng(5);
    Problem prob = make_problem({300, 40}, {300, 500}, 8, 2, 128, 17u);
    HostTensor ids = indexer_like_q2k(prob, 4, true, rng);
    SparseCase cc(std::move(prob), std::move(ids), 4);
    // (head 1, token 17, slot 2); batch 0 has 3 blocks, so 3 is out of range too.
    cc.q2k.data<int32_t>()[((1 * cc.p.total_q()) + 17) * cc.topk + 2] = bad;
    DeviceCase d(cc, s);
    try {
      run_gpu(cc, d, false, s);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("head 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("token 17"), std::string::npos) << msg;
      EXPECT_NE(msg.find("slot 2"), std::string::npos) << msg;
    }
  }
}

// A caller's k2q that is not build_k2q_csr's output for this q2k is an error, as on the CPU:
// an entry out of order, an entry whose token does not select the row's block, and a q2k with
// an id the CSR lacks (each head's entry count).
TEST(SparseFwdGpu, MismatchedK2QReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  enum Tamper { kSwap, kForeignToken, kExtraId };
  for (Tamper t : {kSwap, kForeignToken, kExtraId}) {
    SCOPED_TRACE("tamper " + std::to_string(int(t)));
    std::mt19937 rng(9);
    Problem prob = make_problem({300, 40}, {300, 500}, 8, 2, 128, 19u);
    HostTensor ids = indexer_like_q2k(prob, 4, true, rng);
    SparseCase cc(std::move(prob), std::move(ids), 4);
    const int64_t hkv = cc.p.hkv, rows = cc.total_rows, nnz = cc.p.total_q() * cc.topk;
    DeviceCase d(cc, s);
    d.build_csr(cc, s);
    check_status(d.status_t(), s);
    const std::vector<int32_t> rp = d.row_ptr.download<int32_t>(hkv * (rows + 1), s);
    std::vector<int32_t> qi = d.q_idx.download<int32_t>(hkv * nnz, s);
    // Head 1, a row of batch 0 (rows 0..2 are its blocks): with two entries or more for the
    // swap; for the foreign token, one that a batch-0 token's head-1 q2k row does not select.
    const int32_t* q2k1 = cc.q2k.data<int32_t>() + cc.p.total_q() * cc.topk;
    auto selects = [&](int32_t tl, int64_t kb) {
      const int32_t* row = q2k1 + tl * cc.topk;
      return std::find(row, row + cc.topk, int32_t(kb)) != row + cc.topk;
    };
    auto len = [&](int64_t r) { return rp[(rows + 1) + r + 1] - rp[(rows + 1) + r]; };
    int64_t r = -1;
    int32_t tok = -1;
    for (int64_t rr = 0; rr < 3 && r < 0; ++rr) {
      if (t == kSwap && len(rr) >= 2) r = rr;
      for (int32_t tl = 0; t == kForeignToken && r < 0 && len(rr) >= 1 && tl < 300; ++tl)
        if (!selects(tl, rr)) { r = rr; tok = tl; }
    }
    if (t != kExtraId) ASSERT_GE(r, 0) << "no row to tamper with";
    int32_t* row_q = qi.data() + nnz + (r >= 0 ? rp[(rows + 1) + r] : 0);
    if (t == kSwap) std::swap(row_q[0], row_q[1]);
    if (t == kForeignToken) {
      row_q[0] = tok;
      std::sort(row_q, row_q + len(r));
    }
    d.q_idx.upload(qi, s);
    if (t == kExtraId) {
      // Head 0, token 17 (batch 0, 3 blocks, topk 4): a -1 slot becomes a block it lacks.
      int32_t* row = cc.q2k.data<int32_t>() + 17 * cc.topk;
      int32_t* hole = std::find(row, row + cc.topk, -1);
      ASSERT_NE(hole, row + cc.topk);
      for (int32_t kb = 0; kb < 3; ++kb)
        if (std::find(row, row + cc.topk, kb) == row + cc.topk) { *hole = kb; break; }
      ASSERT_NE(*hole, -1);
      d.q2k = to_device(cc.q2k, s);
    }
    try {
      run_gpu(cc, d, /*with_k2q=*/true, s);
      ADD_FAILURE() << "no error for a mismatched k2q";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("k2q: does not match q2k"), std::string::npos) << msg;
      EXPECT_NE(msg.find(t == kExtraId ? "kv head 0" : "head 1, row " + std::to_string(r)),
                std::string::npos) << msg;
    }
  }
}

// A caller's k2q with fewer rows than the batches' blocks is reported (csr_rows_short) and not
// read past; one with more rows (an upper bound, the extra rows empty) is taken, bitwise equal.
TEST(SparseFwdGpu, K2QRowCountChecked) {
  MSA_REQUIRE_GPU();
  TestStream s;
  std::mt19937 rng(12);
  Problem prob = make_problem({300, 40}, {300, 500}, 8, 2, 128, 21u);
  HostTensor ids = indexer_like_q2k(prob, 4, true, rng);
  SparseCase cc(std::move(prob), std::move(ids), 4);
  DeviceCase exact(cc, s);
  const Outputs want = run_gpu(cc, exact, /*with_k2q=*/false, s);
  DeviceCase padded(cc, s, /*extra_rows=*/5);
  padded.build_csr(cc, s);
  expect_bitwise(want, run_gpu(cc, padded, /*with_k2q=*/true, s));
  DeviceCase short_rows(cc, s, /*extra_rows=*/-1);
  short_rows.build_csr(cc, s);  // the builder reports it too; the attention must on its own
  clear_status(short_rows.status_t(), s);
  const std::string need = "row_ptr: has " + std::to_string(cc.total_rows - 1) +
                           " rows, fewer than the " + std::to_string(cc.total_rows) + " kv blocks";
  try {
    run_gpu(cc, short_rows, /*with_k2q=*/true, s);
    ADD_FAILURE() << "no error for a k2q with too few rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(need), std::string::npos) << e.what();
  }
}

// A dense case (no q2k) against the CPU reference; full runs add the FlashAttention-3 bar on
// every fa3_stride-th row (0: none, for FP8 inputs) and a bitwise repeat.
void expect_dense_matches_cpu(const SparseCase& c, TestStream& s, bool small, int64_t fa3_stride) {
  const Outputs ref = run_cpu(c);
  DeviceCase d(c, s);
  const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
  expect_close(c, g1, ref);
  if (small) return;
  if (fa3_stride > 0) expect_within_fa3_bar(c, g1.out, fa3_stride);
  expect_bitwise(g1, run_gpu(c, d, /*with_k2q=*/false, s));
}

// Dense attention (no q2k; the uniform kernel over every visible block, units from one prep
// kernel) against the CPU's dense reference: random varlen shapes (G 1-16, empty requests, no
// keys, Lq > Lk, causal both ways, temperature, scale, f16 / bf16, FP8 K/V, FP8 q), the
// FlashAttention-3 bar on sampled rows and bitwise equal on a second run.
TEST(SparseFwdGpu, DenseMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 6 : 40); ++i) {
    const SparseCase like = random_case(700 + i, small, /*fill_inputs=*/false);
    std::vector<int32_t> lq = like.p.lq, lk = like.p.lk;
    // Query budget as random_case's at 40 blocks a row: the fp64 reference attends every key.
    const int64_t hq = like.p.hq, max_q = std::max<int64_t>(1, int64_t((small ? 2e6 : 1.5e7) /
                                                                   double(hq * 40 * 128)));
    int64_t total = 0;
    for (int32_t l : lq) total += l;
    if (total > max_q)
      for (int32_t& l : lq)
        if (l > 0) l = std::max<int32_t>(1, int32_t(int64_t(l) * max_q / total));
    const int kind = i % 5;  // 0-2: q's dtype, 3: FP8 K/V per token and head, 4: FP8 q
    // FP8 K/V and FP8 q take (or stand for) bf16 q on CUDA.
    const DType qt = kind == 4 ? DType::fp8_e4m3 : kind == 3 ? DType::bf16 : like.p.q.t.dtype;
    Problem prob = make_problem(lq, lk, hq, like.p.hkv, 128, 7000u + unsigned(i), qt,
                                kind == 3 ? DType::fp8_e4m3 : qt,
                                kind == 3 ? Fp8Scale::per_token_head : Fp8Scale::none);
    SparseCase c = dense_case(std::move(prob), like.causal);
    c.temperature = like.temperature;
    c.scale = like.scale;
    c.name = like.name + " dense kind " + std::to_string(kind);
    SCOPED_TRACE(c.name);
    expect_dense_matches_cpu(c, s, small, kind < 3 ? 29 : 0);
    if (HasFailure()) break;
  }
}

// The uniform path's lazy row max (uniform_mma.cuh, kLazySumMax): after a unit's first block a
// row keeps its base and computes no block max while each p stays <= 2^16, and a block past that
// is recomputed with the max. K of block b scaled by 1 + 2 b (rising maxima: the way back in
// most blocks), by 4 / (1 + 3 b) (falling: p far below the base), or 1 except a x8 block in the
// middle (one way back, then lazy again); dense (head dims 64, 128, 256; a key mask; a
// temperature; FP8 Q K^T, whose way back is warp_qk_e4m3) and block-sparse (128- and
// 64-key blocks).
TEST(SparseFwdGpu, LazyMaxMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const std::function<float(int64_t)> ramps[] = {
      [](int64_t b) { return 1.f + 2.f * float(b); },
      [](int64_t b) { return 4.f / (1.f + 3.f * float(b)); },
      [](int64_t b) { return b == 3 ? 8.f : 1.f; },
  };
  unsigned seed = 4100;
  for (int r = 0; r < 3; ++r)
    for (int64_t dim : {64, 128, 256}) {
      SparseCase c = dense_case(make_problem({300, 5, 129}, {1000, 600, 129}, 16, 2, dim, seed++,
                                             dim == 128 ? DType::bf16 : DType::f16),
                                r != 1);
      scale_k_blocks(c.p, 128, ramps[r]);
      if (dim == 128 && r == 0) c.temperature = 1.5f;
      if (dim == 128 && r == 2) {
        HostTensor mask(DType::boolean, {c.p.batch(), 1000});
        std::mt19937 rng(seed++);
        for (int64_t i = 0; i < mask.t.numel(); ++i) mask.data<uint8_t>()[i] = rng() % 3 != 0;
        c.key_mask = std::move(mask);
      }
      c.name = "dense ramp " + std::to_string(r) + " D " + std::to_string(dim);
      SCOPED_TRACE(c.name);
      expect_dense_matches_cpu(c, s, small, c.key_mask ? 0 : 1);
      if (HasFailure()) return;
    }
  // FP8 Q K^T (e4m3 q and K, D = 128): its way back is the warp's (warp_qk_e4m3). Gentler ramps:
  // the random e4m3 codes already give scores up to ~20, and the e4m3 wgmma's accumulation error
  // grows with |S| (1 + 2 b put scores near 270 and the lse 0.083 off on the H100, against 3e-2);
  // these still take the way back (simulated on 64 rows: ~80 and ~35 (row, block) way backs)
  // with scores below ~60.
  const std::function<float(int64_t)> fp8_ramps[] = {
      [](int64_t b) { return 1.f + 0.25f * float(b); },
      [](int64_t b) { return 1.5f / (1.f + 0.5f * float(b)); },
      [](int64_t b) { return b == 3 ? 2.f : 1.f; },
  };
  for (int r = 0; r < 3; ++r) {
    SparseCase c = dense_case(make_problem({300, 129}, {1000, 129}, 16, 2, 128, seed++,
                                           DType::fp8_e4m3, DType::fp8_e4m3, Fp8Scale::none),
                              r != 1);
    scale_k_blocks(c.p, 128, fp8_ramps[r]);
    c.name = "fp8 qk ramp " + std::to_string(r);
    SCOPED_TRACE(c.name);
    expect_dense_matches_cpu(c, s, small, 0);
    if (HasFailure()) return;
  }
  for (int r = 0; r < 3; ++r)
    for (int64_t blk : {128, 64}) {
      Problem prob = make_problem({700, 300}, {700, 900}, 8, 2, 128, seed++);
      scale_k_blocks(prob, blk, ramps[r]);
      std::mt19937 rng(seed++);
      HostTensor ids = indexer_like_q2k(prob, 8, true, rng, /*uniform_blocks=*/true, blk);
      SparseCase c(std::move(prob), std::move(ids), 8, blk);
      c.causal = true;
      c.name = "blk ramp " + std::to_string(r) + " kv block " + std::to_string(blk);
      SCOPED_TRACE(c.name);
      poison_unselected(c.p, c.q2k, c.topk, blk);
      const Outputs ref = run_cpu(c);
      DeviceCase d(c, s);
      const Outputs g1 = run_gpu(c, d, false, s);
      expect_close(c, g1, ref);
      expect_within_fa3_bar(c, g1.out, 1);
      if (HasFailure()) return;
    }
}

// Dense attention takes any GQA group up to 128 on CUDA (floor(64 / G) whole tokens per 64-row
// tile, the rows past them idle; G > 64 as virtual kv heads of G / kv_split): groups that do not
// divide 16 (a token's rows straddle two warps), groups of 24 to 128 on one or two kv heads, and
// a prime 127 (127 virtual heads of one), against the CPU, with empty requests, lengths past a
// tile, f16, FP8 K/V and FP8 q; larger groups and a sparse call's group outside {1, 2, 4, 8,
// 16} are refused.
TEST(SparseFwdGpu, DenseAnyGroupMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  struct Shape {
    int64_t g, hkv;
    std::vector<int32_t> lq, lk;
    bool causal;
    int kind;  // 0 bf16, 1 f16, 2 bf16 with temperature, 3 FP8 K/V (per token and head), 4 FP8 q
  };
  const Shape shapes[] = {
      {3, 2, {37, 0, 130}, {300, 5, 130}, true, 0}, {5, 2, {1, 64, 200}, {1, 700, 260}, true, 1},
      {6, 1, {13}, {13}, false, 2},                 {7, 2, {100, 3}, {129, 400}, true, 3},
      {12, 1, {61, 9}, {200, 9}, true, 4},          {13, 2, {25}, {256}, false, 0},
      {24, 1, {11, 40}, {300, 41}, true, 1},        {48, 1, {7}, {257}, true, 3},
      {64, 1, {5, 3}, {130, 1000}, true, 2},        {96, 1, {9, 1}, {300, 130}, true, 0},
      {128, 1, {4}, {257}, false, 3},               {80, 2, {6, 0}, {140, 3}, true, 4},
      {127, 1, {3}, {200}, true, 1},
      // no keys anywhere: the combine writes the zero rows of G > 16 heads in rounds
      {48, 1, {7, 3}, {0, 0}, true, 0},             {128, 1, {4}, {0}, false, 1},
  };
  unsigned seed = 900;
  for (const Shape& sh : shapes) {
    const DType qt = sh.kind == 1 ? DType::f16 : sh.kind == 4 ? DType::fp8_e4m3 : DType::bf16;
    Problem prob = make_problem(sh.lq, sh.lk, sh.g * sh.hkv, sh.hkv, 128, seed++, qt,
                                sh.kind == 3 ? DType::fp8_e4m3 : qt,
                                sh.kind == 3 ? Fp8Scale::per_token_head : Fp8Scale::none);
    SparseCase c = dense_case(std::move(prob), sh.causal);
    if (sh.kind == 2) c.temperature = 0.7f;
    c.name = "G " + std::to_string(sh.g) + ", Hkv " + std::to_string(sh.hkv) + ", kind " +
             std::to_string(sh.kind);
    SCOPED_TRACE(c.name);
    expect_dense_matches_cpu(c, s, small, sh.kind < 3 ? 1 : 0);
    if (HasFailure()) break;
  }
  {
    SparseCase c = dense_case(make_problem({3}, {40}, 129, 1, 128, 950u), true);
    DeviceCase d(c, s);
    expect_error([&] { run_gpu(c, d, false, s); },
                 "q: GQA group Hq/Hkv must be at most 128, got 129");
  }
  {
    SparseCase c = dense_case(make_problem({3}, {40}, 10, 2, 128, 951u), true);
    c.dense = false;  // the same shape with its every-block q2k: a sparse call
    DeviceCase d(c, s);
    expect_error([&] { run_gpu(c, d, false, s); }, "q2k: a sparse call's GQA group Hq/Hkv must be");
  }
}

// Dense named edges: one key, G = 16 with one token, requests without queries or keys, no keys
// at all (the combine writes the zero rows), Lq > Lk (early queries see nothing), non-causal,
// lengths one past a block, the CPU's dense reference and its every-block sparse form agree.
TEST(SparseFwdGpu, DenseNamedEdges) {
  MSA_REQUIRE_GPU();
  TestStream s;
  struct Edge { std::vector<int32_t> lq, lk; int64_t g, hkv; bool causal; };
  const Edge edges[] = {
      {{1}, {1}, 16, 1, true},
      {{0, 0, 3, 0}, {0, 5, 300, 0}, 8, 1, true},
      {{4, 0}, {0, 0}, 4, 2, true},  // no keys anywhere
      {{200}, {100}, 4, 2, true},
      {{130, 7}, {257, 7}, 1, 1, false},
      {{129, 1}, {129, 129}, 2, 3, true},
      {{300, 129}, {300, 1000}, 16, 1, true},
  };
  int idx = 0;
  for (const Edge& e : edges) {
    SparseCase c = dense_case(make_problem(e.lq, e.lk, e.g * e.hkv, e.hkv, 128, 800u + unsigned(idx)),
                              e.causal);
    SCOPED_TRACE("dense edge " + std::to_string(idx++));
    const Outputs ref = run_cpu(c);
    c.dense = false;  // the same attention as a sparse call selecting every block, on the CPU
    const Outputs ref_sparse = run_cpu(c);
    c.dense = true;
    expect_bitwise(ref, ref_sparse);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, false, s);
    expect_close(c, g1, ref);
    expect_within_fa3_bar(c, g1.out, 1);
  }
}

// A broken cu_seqlens_q on the device (dense and sparse calls): reported as bad_cu_seqlens, and
// no row outside [0, total_q) is written (the sanitizer runs check the bounds).
TEST(SparseFwdGpu, BrokenCuSeqlensReportedWithoutOutOfBoundsWrites) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (const bool dense : {true, false}) {
    for (const bool keys : {true, false}) {
      SCOPED_TRACE(std::string(dense ? "dense" : "sparse") + (keys ? "" : " no keys"));
      Problem prob = make_problem({5, 5}, keys ? std::vector<int32_t>{130, 7}
                                               : std::vector<int32_t>{0, 0}, 8, 2, 128, 91u);
      SparseCase c = dense_case(std::move(prob), true);
      c.dense = dense;
      DeviceCase d(c, s);
      // total_q is 10; the second request claims 300 queries from token 5.
      const std::vector<int32_t> broken{0, 5, 305};
      MSA_CUDA_CHECK(cudaMemcpyAsync(d.cu_q.t.data, broken.data(), 12, cudaMemcpyHostToDevice, s));
      EXPECT_THROW(run_gpu(c, d, false, s), Error);
      const auto st = d.status.download<int32_t>(4, s);
      EXPECT_EQ(st[0], int32_t(StatusCode::bad_cu_seqlens));
      EXPECT_EQ(st[1], 0);  // cu_seqlens_q
    }
  }
}

// Soft-capped scores (params.soft_cap: s -> cap tanh(s / cap) after the softmax scale, before the
// max) on both sparse paths and dense, with and without a temperature, caps that bend most
// scores (2.5) and few (30), FP8 q among them; against the CPU reference, bitwise on a second run.
TEST(SparseFwdGpu, SoftCapMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 4 : 18); ++i) {
    SparseCase c = random_case(1300 + i, small);
    const std::string name = c.name;
    if (i % 3 == 2) {  // dense: the reference attends every key, so fewer queries
      std::vector<int32_t> lq = c.p.lq;
      for (int32_t& l : lq) l = std::min(l, 300);
      Problem prob = make_problem(lq, c.p.lk, c.p.hq, c.p.hkv, 128, 9300u + unsigned(i),
                                  c.p.q.t.dtype);
      const bool causal = c.causal;
      const float temperature = c.temperature;
      c = dense_case(std::move(prob), causal);
      c.temperature = temperature;
    }
    c.soft_cap = i % 2 ? 30.f : 2.5f;
    c.name = name + (i % 3 == 2 ? " dense" : "") + ", soft_cap " + std::to_string(c.soft_cap);
    SCOPED_TRACE(c.name);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const bool with_k2q = i % 2 == 0 && i % 3 != 2;  // a dense call has no selection to index
    if (with_k2q) d.build_csr(c, s);                   // the caller's k2q, built on the GPU
    const Outputs g1 = run_gpu(c, d, with_k2q, s);
    expect_close(c, g1, ref);
    if (small) continue;
    expect_bitwise(g1, run_gpu(c, d, with_k2q, s));
    if (HasFailure()) break;
  }
}

// Per-batch causal offsets (query i of batch b sees keys j <= i + causal_offset[b]) on both
// paths and dense: offsets that hide every key, cut inside a block, sit on the default diagonal,
// pass the last key, and the int32 extremes; against the CPU reference, bitwise on a second run.
TEST(SparseFwdGpu, CausalOffsetsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 4 : 24); ++i) {
    SparseCase c = random_case(900 + i, small);
    if (!c.causal) continue;  // offsets come with the causal rule
    std::mt19937 rng(4242u + unsigned(i));
    const int64_t batch = c.p.batch();
    HostTensor off(DType::i32, {batch});
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t lq = c.p.lq[b], lk = c.p.lk[b];
      const int32_t picks[] = {lk - lq, -1 - int32_t(rng() % 200), int32_t(rng() % (lk + 1)),
                               lk + int32_t(rng() % 300), INT32_MIN, INT32_MAX,
                               lk - lq + int32_t(rng() % 257) - 128};
      off.data<int32_t>()[b] = picks[rng() % 7];
    }
    const std::string name = c.name;
    if (i % 3 == 2) {  // dense: every block, no poisoned rows
      std::vector<int32_t> lq = c.p.lq;  // the reference attends every key: fewer queries
      for (int32_t& l : lq) l = std::min(l, 300);
      Problem prob = make_problem(lq, c.p.lk, c.p.hq, c.p.hkv, 128, 9100u + unsigned(i),
                                  c.p.q.t.dtype);
      c = dense_case(std::move(prob), true);
    }
    c.causal_offset = std::move(off);
    c.name = name + (i % 3 == 2 ? " dense, causal offsets" : " causal offsets");
    SCOPED_TRACE(c.name);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
    expect_close(c, g1, ref);
    if (small) continue;
    expect_bitwise(g1, run_gpu(c, d, /*with_k2q=*/false, s));
    if (HasFailure()) break;
  }
}

// Dense attention at head dim `dim` on CUDA against the CPU, bitwise on a second run: bf16 and
// f16, causal or not, GQA groups inside and outside {1, 2, 4, 8, 16} and past 64, empty requests,
// a request without keys and a call without any, lengths past a block and past a 64-key stage,
// temperature, soft-cap and a key mask.
void expect_dense_head_dim_matches_cpu(int64_t dim, unsigned seed, TestStream& s) {
  const bool small = small_tests();
  struct Shape {
    std::vector<int32_t> lq, lk;
    int64_t hq, hkv;
    bool causal;
    DType dtype;
    float temperature, soft_cap;
    bool mask;
  };
  const Shape shapes[] = {
      {{37, 0, 130}, {300, 5, 130}, 8, 2, true, DType::bf16, 0.f, 0.f, false},
      {{1, 64, 200}, {1, 700, 260}, 16, 1, true, DType::f16, 0.f, 0.f, false},
      {{129}, {129}, 4, 4, false, DType::bf16, 0.7f, 0.f, false},
      {{13, 5}, {13, 600}, 10, 2, true, DType::bf16, 0.f, 20.f, false},
      {{70, 9}, {300, 200}, 8, 2, false, DType::f16, 0.f, 0.f, true},
      {{300}, {1000}, 64, 4, true, DType::bf16, 0.f, 0.f, false},
      {{9, 3}, {300, 0}, 96, 1, true, DType::bf16, 0.f, 0.f, false},
      {{4, 2}, {0, 0}, 8, 2, true, DType::bf16, 0.f, 0.f, false},
  };
  for (const Shape& sh : shapes) {
    SparseCase c = dense_case(make_problem(sh.lq, sh.lk, sh.hq, sh.hkv, dim, seed++, sh.dtype),
                              sh.causal);
    c.temperature = sh.temperature;
    c.soft_cap = sh.soft_cap;
    if (sh.mask) {
      const int64_t lk_max = *std::max_element(sh.lk.begin(), sh.lk.end()) + 9;
      HostTensor mask(DType::boolean, {c.p.batch(), lk_max});
      std::mt19937 rng(seed++);
      for (int64_t i = 0; i < mask.t.numel(); ++i) mask.data<uint8_t>()[i] = rng() % 3 != 0;
      c.key_mask = std::move(mask);
    }
    c.name = "D " + std::to_string(dim) + ", Hq " + std::to_string(sh.hq) + ", Hkv " + std::to_string(sh.hkv) +
             (sh.causal ? ", causal" : "") + (sh.mask ? ", key mask" : "");
    SCOPED_TRACE(c.name);
    expect_dense_matches_cpu(c, s, small, sh.mask || sh.soft_cap > 0.f ? 0 : 7);
    if (::testing::Test::HasFailure()) break;
  }
}

// Head dims 64 and 256 (the uniform kernel's tiles of that head dim: D = 64 one half per tile and
// O m64n64; D = 256 stages of 64 keys, S m64n64 and O m64n256); quantized inputs at these head
// dims: QuantizedHeadDimsMatchCpu.
TEST(SparseFwdGpu, DenseHeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  expect_dense_head_dim_matches_cpu(64, 1300, s);
  if (!HasFailure()) expect_dense_head_dim_matches_cpu(256, 1320, s);
  SparseCase e = dense_case(make_problem({3}, {40}, 8, 2, 96, 1392u), true);
  DeviceCase de(e, s);
  expect_error([&] { run_gpu(e, de, false, s); },
               "q: head dim must be 32, 64, 128 or 256 on CUDA, got 96");
}

// Head dim 32: D = 64's tiles over zero-filled columns 32-63 (tensor-map boxes wider than the
// tensor), two k-steps and 32 columns stored; a test of its own, so a failure of that load scheme
// shows alone. D = 32 is dense attention over 16-bit q / k / v only: the rest is refused.
TEST(SparseFwdGpu, DenseHeadDim32MatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  expect_dense_head_dim_matches_cpu(32, 1340, s);
  SparseCase sp = random_case(1394u, true, true, std::nullopt, 128, 32);
  DeviceCase dsp(sp, s);
  expect_error([&] { run_gpu(sp, dsp, false, s); },
               "q2k: head dim 32 runs dense attention only on CUDA (no q2k)");
  SparseCase q8 = dense_case(make_problem({5, 2}, {300, 50}, 8, 2, 32, 1395u, DType::bf16,
                                          DType::fp8_e4m3, Fp8Scale::per_token),
                             true);
  DeviceCase dq(q8, s);
  expect_error([&] { run_gpu(q8, dq, false, s); },
               "q, k: head dim 32 takes bf16 or f16 q, k and v on CUDA, got q bf16 and k fp8_e4m3");
}

// Quantized inputs at head dims 64 and 256 (through their bf16 copies, dequant_kv.cuh): bf16 q
// over FP8 K/V (each scale kind), NVFP4 and MXFP4 K/V, FP8 q over bf16 K/V; dense and sparse
// (random sweeps, both block sizes); against the CPU at the quantized tolerance. FP8 q over FP8
// K/V (Q K^T on e4m3 operands) stays D = 128 and is refused by name.
TEST(SparseFwdGpu, QuantizedHeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  unsigned seed = 1500;
  for (const int64_t dim : {64, 256}) {
    for (int kind = 0; kind < 4; ++kind) {  // FP8 K/V, NVFP4 K/V, MXFP4 K/V, FP8 q
      const Fp8Scale scale = kFp8Kinds[seed % 4];
      Problem prob = make_problem({37, 0, 130}, {300, 5, 200}, 8, 2, dim, seed++,
                                  kind == 3 ? DType::fp8_e4m3 : DType::bf16,
                                  kind == 0 ? DType::fp8_e4m3 : DType::bf16,
                                  kind == 0 ? scale : Fp8Scale::none);
      SparseCase c = dense_case(std::move(prob), true);
      if (kind == 1 || kind == 2) quantize_kv_fp4(c.p, /*nvfp4=*/kind == 1);
      c.name = "dense D " + std::to_string(dim) + ", kind " + std::to_string(kind);
      SCOPED_TRACE(c.name);
      expect_dense_matches_cpu(c, s, small, 0);
      if (HasFailure()) return;
    }
    for (int i = 0; i < (small ? 4 : 12); ++i) {
      const int64_t blk = i % 2 ? 64 : 128;
      const bool fp4 = i % 3 == 2;
      SparseCase c = random_case(5600 + i + int(dim), small, true,
                                 fp4 ? std::nullopt : std::optional<Fp8Scale>(kFp8Kinds[i % 4]),
                                 blk, dim);
      if (fp4 && c.p.q.t.dtype == DType::bf16) quantize_kv_fp4(c.p, /*nvfp4=*/i % 2 == 0);
      c.name += fp4 ? " fp4" : "";
      SCOPED_TRACE(c.name);
      const Outputs ref = run_cpu(c);
      DeviceCase d(c, s);
      expect_close(c, run_gpu(c, d, /*with_k2q=*/false, s), ref);
      if (HasFailure()) return;
    }
    SparseCase q8 = dense_case(make_problem({5, 2}, {300, 50}, 8, 2, dim, 1393u, DType::fp8_e4m3,
                                            DType::fp8_e4m3, Fp8Scale::per_token),
                               true);
    DeviceCase dq(q8, s);
    expect_error([&] { run_gpu(q8, dq, false, s); },
                 "q, k: head dim " + std::to_string(dim) + " takes fp8_e4m3 q over bf16 or FP4 "
                 "K/V on CUDA, not over fp8_e4m3 K/V");
  }
}

// Dense key masks on CUDA (bool or u8, per batch [B, Lk_max] or per query [total_q, Lk_max],
// Lk_max past the longest request): random densities, rows and whole masks with every key masked
// (out 0, lse -inf), causal or not, soft-cap, GQA groups that do not divide 16, f16, FP8 QK;
// against the CPU, bitwise on a second run. A mask narrower than a request's keys is reported
// (key_mask_short).
TEST(SparseFwdGpu, DenseKeyMaskMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  struct Shape {
    std::vector<int32_t> lq, lk;
    int64_t hq, hkv;
    bool per_query, causal;
    double density;
    DType mask_dtype, q_dtype;
    float soft_cap;
  };
  const Shape shapes[] = {
      {{37, 0, 130}, {300, 5, 130}, 8, 2, false, true, 0.7, DType::boolean, DType::bf16, 0.f},
      {{1, 64, 200}, {1, 700, 260}, 16, 1, true, true, 0.3, DType::u8, DType::bf16, 0.f},
      {{13, 5}, {13, 600}, 10, 2, true, false, 0.9, DType::boolean, DType::f16, 20.f},
      {{100, 3}, {129, 400}, 4, 4, false, true, 0.0, DType::u8, DType::bf16, 0.f},
      {{150}, {1000}, 64, 4, false, true, 0.5, DType::boolean, DType::bf16, 0.f},
      {{129, 7}, {257, 7}, 12, 1, true, true, 0.05, DType::u8, DType::f16, 0.f},
      {{70, 9}, {300, 200}, 8, 2, false, true, 0.6, DType::boolean, DType::fp8_e4m3, 0.f},
  };
  unsigned seed = 960;
  for (const Shape& sh : shapes) {
    // FP8 q runs over FP8 K/V (Q K^T in FP8: the kernel's other mask instantiation).
    SparseCase c = dense_case(make_problem(sh.lq, sh.lk, sh.hq, sh.hkv, 128, seed++, sh.q_dtype,
                                           sh.q_dtype, Fp8Scale::per_token_head),
                              sh.causal);
    c.soft_cap = sh.soft_cap;
    const int64_t rows = sh.per_query ? c.p.total_q() : c.p.batch();
    const int64_t lk_max = *std::max_element(sh.lk.begin(), sh.lk.end()) + 37;
    HostTensor mask(sh.mask_dtype, {rows, lk_max});
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (int64_t i = 0; i < rows * lk_max; ++i) {
      const bool visible = u01(rng) < sh.density;
      mask.data<uint8_t>()[i] =
          visible ? (sh.mask_dtype == DType::u8 ? uint8_t(1 + rng() % 255) : uint8_t(1)) : 0;
    }
    if (rows > 1) std::memset(mask.data<uint8_t>() + lk_max, 0, size_t(lk_max));  // row 1: none
    c.key_mask = std::move(mask);
    c.key_mask_rows = sh.per_query ? KeyMaskRows::per_query : KeyMaskRows::per_batch;
    c.name = std::string(sh.per_query ? "per query" : "per batch") + ", Hq " +
             std::to_string(sh.hq) + ", density " + std::to_string(sh.density);
    SCOPED_TRACE(c.name);
    expect_dense_matches_cpu(c, s, small, 0);
    if (HasFailure()) break;
  }
  {  // Lk_max 100 under a request of 300 keys: reported after the call, the keys past it masked
    SparseCase c = dense_case(make_problem({5, 2}, {300, 50}, 8, 2, 128, 990u), true);
    HostTensor mask(DType::boolean, {2, 100}), wide(DType::boolean, {2, 300});
    std::memset(mask.data<uint8_t>(), 1, 200);
    std::memset(wide.data<uint8_t>(), 0, 600);
    for (int64_t b = 0; b < 2; ++b) std::memset(wide.data<uint8_t>() + b * 300, 1, 100);
    c.key_mask = std::move(mask);
    DeviceCase d(c, s);
    std::string err;
    const Outputs got = run_gpu(c, d, false, s, &err);
    EXPECT_NE(err.find("key_mask: Lk_max = 100 (its last dim) is less than the 300 keys of batch 0"),
              std::string::npos) << err;
    HostTensor narrow = std::move(*c.key_mask);  // the CPU's reference: keys past 100 masked
    c.key_mask = std::move(wide);
    expect_close(c, got, run_cpu(c));
  }
}

// Sparse calls with a key mask on CUDA (the KV-major kernel's and the uniform kernel's kMask
// instantiations): random selections of both paths (tok and blk rows), GQA 1-16, masks per batch
// or per query, bool or u8, densities from none visible to all but a few masked, a row with every
// key masked; against the CPU and bitwise with a caller's k2q. FP8 K/V and FP8 QK too.
TEST(SparseFwdGpu, SparseKeyMaskMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const double densities[] = {0.0, 0.3, 0.7, 0.95};
  for (int i = 0; i < (small ? 4 : 16); ++i) {
    const std::optional<Fp8Scale> fp8 =
        i % 8 == 5 ? std::optional<Fp8Scale>(Fp8Scale::per_token_head) : std::nullopt;
    SparseCase c = random_case(1500 + i, small, true, fp8);
    const bool per_query = i % 2 == 1;
    const int64_t rows = per_query ? c.p.total_q() : c.p.batch();
    const int64_t lk_max = (c.p.lk.empty() ? 0 : *std::max_element(c.p.lk.begin(), c.p.lk.end())) +
                           int64_t(i % 3) * 50;
    const DType mt = i % 3 == 0 ? DType::u8 : DType::boolean;
    HostTensor mask(mt, {rows, lk_max});
    std::mt19937 rng(1600u + unsigned(i));
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    const double density = densities[i % 4];
    for (int64_t j = 0; j < rows * lk_max; ++j)
      mask.data<uint8_t>()[j] =
          u01(rng) < density ? (mt == DType::u8 ? uint8_t(1 + rng() % 255) : uint8_t(1)) : 0;
    if (rows > 1) std::memset(mask.data<uint8_t>(), 0, size_t(lk_max));  // row 0: none visible
    c.key_mask = std::move(mask);
    c.key_mask_rows = per_query ? KeyMaskRows::per_query : KeyMaskRows::per_batch;
    c.name += std::string(per_query ? ", mask per query" : ", mask per batch") + ", density " +
              std::to_string(density);
    SCOPED_TRACE(c.name);
    expect_matches_cpu_and_repeats(c, small, s);
    if (HasFailure()) break;
  }
}

// A key mask per query over the longest request's keys (density 0.6), row 0 without a visible key.
void add_query_key_mask(SparseCase& c, unsigned seed) {
  const int64_t rows = c.p.total_q();
  const int64_t lk_max = c.p.lk.empty() ? 0 : *std::max_element(c.p.lk.begin(), c.p.lk.end());
  HostTensor mask(DType::boolean, {rows, lk_max});
  std::mt19937 rng(seed);
  for (int64_t j = 0; j < rows * lk_max; ++j) mask.data<uint8_t>()[j] = rng() % 5 < 3;
  if (rows > 1) std::memset(mask.data<uint8_t>(), 0, size_t(lk_max));
  c.key_mask = std::move(mask);
  c.key_mask_rows = KeyMaskRows::per_query;
  c.name += " key mask";
}

// The sweeps' variations of case i: a soft-cap of 10 on every fifth, a key mask per query on every
// fourth (its rng seeded mask_seed + i).
void vary_sweep_case(SparseCase& c, int i, unsigned mask_seed) {
  if (i % 5 == 2) {
    c.soft_cap = 10.f;
    c.name += " soft-cap 10";
  }
  if (i % 4 == 1) add_query_key_mask(c, mask_seed + unsigned(i));
}

// One sweep case on the GPU against the CPU reference; unless small (the sanitizer runs), also
// against the FA3 bar on sampled rows (fa3: inputs that bar applies to) and bitwise equal with a
// GPU-built K2QIndex.
void expect_sweep_case(const SparseCase& c, cudaStream_t s, bool small, bool fa3) {
  const Outputs ref = run_cpu(c);
  DeviceCase d(c, s);
  const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
  expect_close(c, g1, ref);
  if (small) return;
  if (fa3) expect_within_fa3_bar(c, g1.out, 37);
  d.build_csr(c, s);
  expect_bitwise(g1, run_gpu(c, d, /*with_k2q=*/true, s));
}

// 64-key kv blocks (kv_block_size 64: the kernels' kBlk = 64 instantiations): random configurations
// on both paths (tok selections on the KV-major kernel, blk ones on the uniform kernel), 16-bit
// and FP8 / FP4 K/V, key masks, soft-cap, NaN in the unselected K/V rows, lengths that are not
// multiples of 64; each also bitwise repeatable with a GPU-built K2QIndex.
TEST(SparseFwdGpu, Blocks64MatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 6 : 32); ++i) {
    const std::optional<Fp8Scale> fp8 =
        i % 8 == 3 ? std::optional<Fp8Scale>(kFp8Kinds[(i / 8) % 4]) : std::nullopt;
    SparseCase c = random_case(3000 + i, small, true, fp8, /*blk=*/64);
    if (i % 8 == 7 && c.p.q.t.dtype == DType::bf16) {
      quantize_kv_fp4(c.p, /*nvfp4=*/true);
      c.name += " nvfp4";
    }
    vary_sweep_case(c, i, 3100u);
    SCOPED_TRACE(c.name);
    expect_sweep_case(c, s, small,
                      !c.key_mask && c.soft_cap == 0.f && !fp8 && c.p.k.t.dtype != DType::fp4x2);
    if (HasFailure()) break;
  }
}

// Named edges at 64-key blocks: one key, lengths 63 / 64 / 65, a request without keys beside
// ones with keys, top-K above the block count, Lq > Lk, G = 16 and G = 1, both paths.
TEST(SparseFwdGpu, Blocks64NamedEdges) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const Edge edges[] = {
      {{1}, {1}, 16, 1, 4, true, false},
      {{63, 64, 65}, {63, 64, 65}, 4, 2, 2, true, false},
      {{0, 0, 3, 0}, {0, 5, 300, 0}, 8, 1, 64, true, false},
      {{200}, {100}, 4, 2, 8, true, false},
      {{130, 7}, {257, 7}, 1, 1, 5, false, false},
      {{300, 129}, {300, 1000}, 16, 1, 16, true, true},
      {{257, 40, 0, 9}, {400, 0, 5, 130}, 1, 2, 4, true, true},
      {{65}, {65}, 2, 1, 1, true, true},
      // selections shared by 64-query blocks (BSR rows of R = 64): Q-major at G >= 2, KV-major
      // at G = 1 (query blocks of 128 there)
      {{300, 129}, {300, 1000}, 4, 2, 16, true, true, 64},
      {{257, 40, 0, 9}, {400, 0, 5, 130}, 16, 1, 8, true, true, 64},
      {{200, 64}, {700, 64}, 2, 2, 4, false, true, 64},
      {{190}, {190}, 1, 2, 4, true, true, 64},
  };
  expect_edges_match_cpu(edges, 64, 177, s);
}

// Sparse attention at head dims 64 and 256 (the KV-major kernel, its partials and the combine at
// that D, KVMajorTraits; the uniform kernel's sparse units, at 256 over 128-key blocks two 64-key
// stages a block): random configurations over 128- and 64-key blocks, both paths (tok
// selections: KV-major; blk: uniform), bf16 and f16, f32 / bf16 partials (at 256 stored from
// registers), key masks, soft-cap, temperature, NaN in the unselected K/V rows; against the CPU
// reference and the FA3 bar, and bitwise repeatable with a GPU-built K2QIndex.
TEST(SparseFwdGpu, SparseHeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 8 : 48); ++i) {
    const int64_t blk = i % 2 ? 64 : 128, dim = i % 4 < 2 ? 64 : 256;
    SparseCase c = random_case(5000 + i, small, true, std::nullopt, blk, dim);
    vary_sweep_case(c, i, 5100u);
    SCOPED_TRACE(c.name);
    expect_sweep_case(c, s, small, !c.key_mask && c.soft_cap == 0.f);
    if (HasFailure()) break;
  }
}

// Named edges at head dims 64 and 256 (NamedEdges' shapes, both block sizes): one key, lengths 1,
// top-K far above the block count, requests without queries or keys, Lq > Lk, both paths.
TEST(SparseFwdGpu, SparseHeadDimsNamedEdges) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const Edge edges[] = {
      {{1}, {1}, 16, 1, 4, true, false},
      {{0, 0, 3, 0}, {0, 5, 300, 0}, 8, 1, 64, true, false},
      {{200}, {100}, 4, 2, 8, true, false},
      {{130, 7}, {257, 7}, 1, 1, 3, false, false},
      {{300, 129}, {300, 1000}, 16, 1, 8, true, true},
      {{257, 40, 0, 9}, {400, 0, 5, 130}, 1, 2, 4, true, true},
      {{333}, {333}, 4, 2, 8, false, true, 64},
  };
  for (const int64_t dim : {64, 256}) {
    expect_edges_match_cpu(edges, 128, 5200, s, dim);
    expect_edges_match_cpu(edges, 64, 5300, s, dim);
  }
}

// FP8 Q K^T over 64-key kv blocks (instantiate_fp8qk_b64.cu: the KV-major kernel's m64n64k32 S,
// the uniform kernel's pairs of blocks, each with its own key scales and mask words): the FP8-QK
// sweep at kv_block_size 64, with lengths that are not multiples of 64, a key mask per query on
// every other case and a soft-cap on every fifth. Seed 3580: the four cases of MSA_TEST_SMALL (the
// sanitizer runs) are blk and tok selections, each with and without a mask.
TEST(SparseFwdGpu, Blocks64Fp8QkMatchesCpu) {
  MSA_REQUIRE_GPU();
  TestStream s;
  expect_fp8qk_sweep_matches_cpu(3580, small_tests() ? 4 : 16, 64, s, [](SparseCase& c, int run) {
    if (run % 2 == 1) add_query_key_mask(c, 3600u + unsigned(run));
    if (run % 5 == 2) {
      c.soft_cap = 10.f;
      c.name += " soft-cap 10";
    }
  });
}


// ---- token ids (kv_block_size 1: token_kernel.cuh) ----------------------------------------------

// A random token-sparse configuration: G 1-128 (past 16 on one kv head, including groups that do
// not divide 64), top-K 1-2048, varlen batches with empty requests, causal both ways, q2k rows as
// an indexer gives them (the first key, the last visible one, random visible ones, sometimes
// invisible ones, -1 padding, sometimes unsorted or -1 in the middle), NaN in every K/V row no
// query selects, sometimes a temperature, a soft-cap or a softmax scale. The reference costs
// ~ tokens * Hq * min(topk, keys) * D: the query count is cut to a budget.
SparseCase token_case(int index, bool small, std::optional<Fp8Scale> fp8 = std::nullopt,
                      int64_t dim = 128) {
  std::mt19937 rng(777u + 131u * unsigned(index));
  const int64_t groups[] = {1, 4, 16, 64, 128, 48, 5, 2, 8, 100};
  const int topks[] = {1, 37, 64, 200, 2048};
  const int64_t g = groups[index % 10];
  const int64_t hkv = 16 % g == 0 ? 1 + int64_t(rng() % 2) : 1;  // other groups: one kv head
  const int64_t topk = topks[rng() % 5];
  const bool causal = rng() % 4 != 0;
  const int batch = 1 + int(rng() % 3);
  const int64_t max_k = small ? 400 : 3000;
  std::vector<int32_t> lq(batch), lk(batch);
  for (int b = 0; b < batch; ++b) {
    const int kind = int(rng() % 8);
    if (kind == 0) { lq[b] = 0; lk[b] = int32_t(rng() % max_k); }
    else if (kind == 1) { lk[b] = 0; lq[b] = int32_t(1 + rng() % 20); }
    else {
      lk[b] = int32_t(1 + rng() % max_k);
      lq[b] = rng() % 3 == 0 ? int32_t(1 + rng() % lk[b]) : lk[b];
    }
  }
  const double budget = small ? 3e5 : 4e6;
  const int64_t max_q = std::max<int64_t>(1, int64_t(budget / double(g * hkv * std::min<int64_t>(topk, max_k))));
  int64_t total = 0;
  for (int32_t l : lq) total += l;
  if (total > max_q)
    for (int32_t& l : lq)
      if (l > 0) l = std::max<int32_t>(1, int32_t(int64_t(l) * max_q / total));
  const bool f16 = rng() % 3 == 0;
  const DType dt = f16 && !fp8 ? DType::f16 : DType::bf16;  // FP8 K/V take bf16 q on CUDA
  Problem prob = make_problem(lq, lk, g * hkv, hkv, dim, 4242u + unsigned(index), dt,
                              fp8 ? DType::fp8_e4m3 : dt, fp8.value_or(Fp8Scale::none));
  HostTensor ids = indexer_like_q2k(prob, topk, causal, rng, false, /*blk=*/1);
  SparseCase c(std::move(prob), std::move(ids), topk, /*block=*/1);
  c.causal = causal;
  poison_unselected(c.p, c.q2k, c.topk, 1);
  c.temperature = rng() % 3 == 0 ? 0.5f + float(rng() % 100) / 50.f : 0.f;
  c.scale = rng() % 4 == 0 ? 0.05f : 0.f;
  c.soft_cap = rng() % 5 == 0 ? 20.f : 0.f;
  std::ostringstream os;
  os << "token case " << index << ": D=" << dim << " G=" << g << " Hkv=" << hkv << " topk=" << topk
     << (causal ? " causal " : " non-causal ") << dtype_name(dt)
     << (fp8 ? " fp8 kv scales " + std::to_string(int(*fp8)) : "") << " T=" << c.temperature
     << " cap=" << c.soft_cap << lengths_text(lq, lk);
  c.name = os.str();
  return c;
}

// A token case on the GPU against the CPU reference; unless small, the FA3 bar on sampled rows
// (fa3: inputs its model takes: no soft-cap, 16-bit K/V) and bitwise equal on a second run.
void expect_token_case(const SparseCase& c, cudaStream_t s, bool small, bool fa3) {
  const Outputs ref = run_cpu(c);
  DeviceCase d(c, s);
  const Outputs g1 = run_gpu(c, d, /*with_k2q=*/false, s);
  expect_close(c, g1, ref);
  if (small) return;
  if (fa3) expect_within_fa3_bar(c, g1.out, 7);
  expect_bitwise(g1, run_gpu(c, d, /*with_k2q=*/false, s));
}

// The token sweep on the GPU against the CPU reference, the FA3 bar on sampled rows, and bitwise
// equal on a second run.
TEST(SparseFwdGpu, TokenIdsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 5 : 30); ++i) {
    const SparseCase c = token_case(i, small);
    SCOPED_TRACE(c.name);
    expect_token_case(c, s, small, c.soft_cap == 0.f);  // the bar's model has no cap
    if (HasFailure()) break;
  }
}

// Token ids over FP8 e4m3 K/V (every scale layout) and NVFP4 / MXFP4 K/V: the flat bf16 copy
// of the sparse path (launch_dequant), then the token kernel; NaN in the unselected rows (FP4:
// NaN block scales).
TEST(SparseFwdGpu, TokenIdsQuantizedKvMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  int run = 0;
  for (int i = 0; run < (small ? 4 : 12); ++i) {
    SparseCase c = run % 3 == 2 ? token_case(300 + i, small) : token_case(300 + i, small, kFp8Kinds[i % 4]);
    if (c.p.q.t.dtype != DType::bf16) continue;  // quantized K/V take bf16 q on CUDA
    if (run % 3 == 2) {
      quantize_kv_fp4(c.p, run % 2 == 0);
      c.name += run % 2 == 0 ? " nvfp4" : " mxfp4";
    }
    ++run;
    SCOPED_TRACE(c.name);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    expect_close(c, run_gpu(c, d, /*with_k2q=*/false, s), ref);
    if (HasFailure()) break;
  }
}

// Named token edges: one key, top-K far above the keys, Lq > Lk (the first queries see nothing),
// G = 64 over K = 2048 ids in order, a G of 128 (two row tiles), scores whose stage maxima
// differ by far more than the rescale slack (K of key j scaled by 1 + j / 64), and per-batch
// causal offsets.
TEST(SparseFwdGpu, TokenIdsNamedEdges) {
  MSA_REQUIRE_GPU();
  TestStream s;
  struct TokEdge {
    std::vector<int32_t> lq, lk;
    int64_t g, hkv, topk;
    bool causal, wide, offsets;
  };
  const TokEdge edges[] = {
      {{1}, {1}, 64, 1, 1, true, false, false},
      {{3, 2}, {5, 1}, 16, 2, 2048, true, false, false},
      {{200}, {100}, 4, 2, 64, true, false, false},
      {{40}, {2600}, 64, 1, 2048, true, false, false},
      {{33}, {900}, 128, 1, 500, false, false, false},
      {{50, 20}, {1500, 300}, 16, 1, 700, true, true, false},
      {{60, 10}, {800, 100}, 64, 1, 256, true, false, true},
  };
  int idx = 0;
  for (const TokEdge& e : edges) {
    SCOPED_TRACE("token edge " + std::to_string(idx));
    std::mt19937 rng(600u + unsigned(idx));
    Problem prob = make_problem(e.lq, e.lk, e.g * e.hkv, e.hkv, 128, 700u + unsigned(idx));
    if (e.wide) scale_k_blocks(prob, 64, [](int64_t b) { return 1.f + float(b); });
    HostTensor ids = indexer_like_q2k(prob, e.topk, e.causal, rng, false, 1);
    SparseCase c(std::move(prob), std::move(ids), e.topk, 1);
    c.causal = e.causal;
    c.temperature = idx % 2 ? 1.5f : 0.f;
    poison_unselected(c.p, c.q2k, c.topk, 1);
    if (e.offsets) {
      HostTensor off(DType::i32, {c.p.batch()});
      off.data<int32_t>()[0] = 700;
      off.data<int32_t>()[1] = -3;
      c.causal_offset = std::move(off);
    }
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    const Outputs g1 = run_gpu(c, d, false, s);
    expect_close(c, g1, ref);
    if (!e.offsets) expect_within_fa3_bar(c, g1.out, 1);  // the bar's model has no offsets
    ++idx;
  }
}

// Bad token ids are reported (first offence: head, token, slot) and never dereferenced: out of
// range, repeated (in order and out of order), at K = 40 and K = 2048.
TEST(SparseFwdGpu, TokenIdsInvalidReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (const int64_t topk : {int64_t(40), int64_t(2048)}) {
    for (const int kind : {0, 1, 2, 3}) {
      SCOPED_TRACE("topk " + std::to_string(topk) + " kind " + std::to_string(kind));
      std::mt19937 rng(5);
      Problem prob = make_problem({30, 40}, {2500, 3000}, 8, 2, 128, 17u);
      HostTensor ids = indexer_like_q2k(prob, topk, false, rng, false, 1);
      SparseCase cc(std::move(prob), std::move(ids), topk, 1);
      int32_t* row = cc.q2k.data<int32_t>() + ((1 * cc.p.total_q()) + 17) * cc.topk;
      std::sort(row, row + topk, [](int32_t a, int32_t b) { return (a < 0) != (b < 0) ? b < 0 : a < b; });
      row[0] = 11;  // a valid first entry (any order: the sort above may have left -1 there)
      // kind 0: past the batch's 2500 keys; 1: below -1; 2: a repeat of slot 0 at slot 2; 3: the
      // same after unsorting the row's tail (the repeat stays the first offence at slot 2).
      row[2] = kind == 0 ? 2500 : kind == 1 ? -2 : 11;
      if (kind == 3) std::reverse(row + 3, row + topk);
      DeviceCase d(cc, s);
      try {
        run_gpu(cc, d, false, s);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("head 1"), std::string::npos) << msg;
        EXPECT_NE(msg.find("token 17"), std::string::npos) << msg;
        EXPECT_NE(msg.find("slot 2"), std::string::npos) << msg;
        EXPECT_NE(msg.find(kind >= 2 ? "repeat" : "range"), std::string::npos) << msg;
      }
    }
  }
}

// Token ids at head dims 64 and 256 (the token kernel per head dim: D / 8 lanes a row, at 256 two
// stages and one CTA an SM): the token sweep's configurations, FP8 K/V among them, against the
// CPU reference and the FA3 bar, bitwise equal on a second run.
TEST(SparseFwdGpu, TokenIdsHeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 6 : 24); ++i) {
    const int64_t dim = i % 2 ? 256 : 64;
    const SparseCase c = token_case(700 + i, small,
                                    i % 4 == 3 ? std::optional<Fp8Scale>(kFp8Kinds[i % 4])
                                               : std::nullopt,
                                    dim);
    SCOPED_TRACE(c.name);
    expect_token_case(c, s, small, c.soft_cap == 0.f && i % 4 != 3);
    if (HasFailure()) break;
  }
}

// What the token kernel does not run is an msa::Error naming it (f16 q over FP8 K/V).
TEST(SparseFwdGpu, TokenIdsRefusedFeatures) {
  MSA_REQUIRE_GPU();
  TestStream s;
  std::mt19937 rng(3);
  Problem prob = make_problem({20}, {200}, 8, 2, 128, 3u, DType::bf16, DType::fp8_e4m3,
                              Fp8Scale::per_tensor);
  HostTensor ids = indexer_like_q2k(prob, 16, true, rng, false, 1);
  SparseCase c(std::move(prob), std::move(ids), 16, 1);
  c.p.q = HostTensor(DType::f16, {20, 8, 128});  // f16 q over FP8 K/V
  DeviceCase d(c, s);
  expect_error([&] { run_gpu(c, d, false, s); }, "K/V take bf16 q on CUDA");
}

// Key masks with token ids (the producer leaves a selected key out when its mask bit is 0): per
// query and per batch masks over random token cases, flat K/V, against the CPU.
TEST(SparseFwdGpu, TokenIdsKeyMaskMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  for (int i = 0; i < (small ? 3 : 10); ++i) {
    SparseCase c = token_case(500 + i, small);
    if (i % 2 == 0) {
      add_query_key_mask(c, 510u + unsigned(i));
    } else {  // per batch: [B, Lk_max]
      const int64_t lk_max = std::max<int64_t>(1, *std::max_element(c.p.lk.begin(), c.p.lk.end()));
      HostTensor mask(DType::u8, {c.p.batch(), lk_max});
      std::mt19937 rng(520u + unsigned(i));
      for (int64_t j = 0; j < c.p.batch() * lk_max; ++j) mask.data<uint8_t>()[j] = rng() % 4 != 0;
      c.key_mask = std::move(mask);
      c.key_mask_rows = KeyMaskRows::per_batch;
      c.name += " batch key mask";
    }
    SCOPED_TRACE(c.name);
    const Outputs ref = run_cpu(c);
    DeviceCase d(c, s);
    expect_close(c, run_gpu(c, d, /*with_k2q=*/false, s), ref);
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace msa::test
