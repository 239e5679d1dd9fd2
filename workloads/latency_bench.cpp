// The latency cases LAT-256, LAT-2K, LAT-8K and LAT-CHUNK (bench/CASES.md), run by bench_latency
// and `msa bench --case LAT-*`: per call, the host time of the C++ call (each call started on an
// idle stream, so the figure is the host's cost to validate and enqueue, never a wait on the
// GPU), the GPU time of the same calls back to back, and the work the call enqueues, counted on a
// CUDA graph capture of it. Ops: sparse_attention_pipeline with the index geometry of E2E-32K-M3
// (4 FP8 index heads on 1 index key head), attention_forward with the pipeline's selection and
// its k2q index given, and dense attention_forward on the same inputs; the outputs are checked
// first. A paged case (LAT-CHUNK) also times DecodePlan::run, the serving step after that
// prefill: one query per request over the same cache, sparse (top-K blocks) and dense. FA4 and
// cuDNN dense on the same shapes: bench/python_bench.py --latency-cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"
#include "workloads/record.h"
#include "msa/msa.h"

namespace msa_bench {
namespace {

using msa::DType;
using msa::Tensor;
using namespace msa::bench;

constexpr int64_t kD = 128, kIndexHeads = 4, kBlock = 128;

struct HostTimes {
  double median_us = 0, min_us = 0, max_us = 0, gpu_us = 0;
};

// Host microseconds of `call`, each run alone after the stream drained; then the GPU time per
// call of `calls` calls back to back (CUDA events around the whole loop).
HostTimes time_calls(const std::function<void()>& call, int calls, int warmup, bool gpu_loop,
                     cudaStream_t s) {
  for (int i = 0; i < warmup; ++i) call();  // module loads, first-launch setup
  const HostTiming h = time_host(call, calls, s);
  if (!gpu_loop) return {h.median_us, h.min_us, h.max_us, 0.0};
  cudaEvent_t e0, e1;
  MSA_BENCH_CUDA(cudaEventCreate(&e0));
  MSA_BENCH_CUDA(cudaEventCreate(&e1));
  MSA_BENCH_CUDA(cudaEventRecord(e0, s));
  for (int i = 0; i < calls; ++i) call();
  MSA_BENCH_CUDA(cudaEventRecord(e1, s));
  MSA_BENCH_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  MSA_BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  MSA_BENCH_CUDA(cudaEventDestroy(e0));
  MSA_BENCH_CUDA(cudaEventDestroy(e1));
  return {h.median_us, h.min_us, h.max_us, 1e3 * ms / calls};
}

// Work one call enqueues, counted on a CUDA graph capture of it.
GraphNodes count_launches(const std::function<void()>& call, cudaStream_t s) {
  cudaGraph_t g;
  MSA_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  call();
  MSA_BENCH_CUDA(cudaStreamEndCapture(s, &g));
  const GraphNodes l = graph_nodes(g);
  MSA_BENCH_CUDA(cudaGraphDestroy(g));
  return l;
}

// A bf16 N(0, 1) tensor of `shape` on the GPU (stream `stream` of `seed`).
DeviceBuffer normal_bf16(const std::vector<int64_t>& shape, uint64_t seed, uint64_t stream, cudaStream_t s) {
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
  std::vector<uint16_t> h(static_cast<size_t>(n));
  fill_normal_bf16(h.data(), n, seed, stream);
  DeviceBuffer d = gpu_buffer(h.size() * 2);
  d.upload(h, s);
  return d;
}

// The inputs of one latency case on the GPU: attention q, k, v (flat, or page pools of
// `page_size` slots in the nhd layout with a shuffled page table), and the index branch (q [T, 4,
// 128] and k [keys, 1, 128] in FP8 e4m3 with per-token scales, quantized on the GPU from N(0, 1)
// draws; a pool's keys are its slots).
struct LatencyInputs {
  LatencyInputs(const BenchCase& c, cudaStream_t s) : c(c) {
    const int64_t B = int64_t(c.seqlens_q.size());
    tq = std::accumulate(c.seqlens_q.begin(), c.seqlens_q.end(), int64_t(0));
    hq = c.num_q_heads;
    hkv = c.num_kv_heads;
    for (int64_t l : c.seqlens_k) rows += (l + kBlock - 1) / kBlock;
    std::vector<int32_t> cq{0};
    for (int64_t l : c.seqlens_q) cq.push_back(cq.back() + int32_t(l));
    dcu_q = DeviceBuffer::from_host(cq, s);
    if (c.page_size == 0) {
      keys = std::accumulate(c.seqlens_k.begin(), c.seqlens_k.end(), int64_t(0));
      std::vector<int32_t> ck{0};
      for (int64_t l : c.seqlens_k) ck.push_back(ck.back() + int32_t(l));
      dcu_k = DeviceBuffer::from_host(ck, s);
      kv_shape = {keys, hkv, kD};
    } else {
      const int64_t page = c.page_size;
      for (int64_t l : c.seqlens_k) max_pages = std::max(max_pages, (l + page - 1) / page);
      pages = B * max_pages;
      keys = pages * page;
      std::vector<int32_t> table(static_cast<size_t>(pages));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(uint32_t(c.seed)));
      dtable = DeviceBuffer::from_host(table, s);
      std::vector<int32_t> used(c.seqlens_k.begin(), c.seqlens_k.end());
      dused = DeviceBuffer::from_host(used, s);
      kv_shape = {pages, page, hkv, kD};
    }
    dq = normal_bf16({tq, hq, kD}, c.seed, 0, s);
    dk = normal_bf16(kv_shape, c.seed, 1, s);
    dv = normal_bf16(kv_shape, c.seed, 2, s);
    // Index branch: quantized per token (a pool's slots are its tokens).
    const DeviceBuffer iq = normal_bf16({tq, kIndexHeads, kD}, c.seed, 3, s);
    const DeviceBuffer ik = normal_bf16({keys, 1, kD}, c.seed, 4, s);
    diq = gpu_buffer(size_t(tq * kIndexHeads * kD));
    diqs = gpu_buffer(size_t(tq) * 4);
    dik = gpu_buffer(size_t(keys * kD));
    diks = gpu_buffer(size_t(keys) * 4);
    const msa::QTensor qi(gpu_view(diq.get(), DType::fp8_e4m3, {tq, kIndexHeads, kD}),
                          gpu_view(diqs.get(), DType::f32, {tq}));
    const msa::QTensor ki(gpu_view(dik.get(), DType::fp8_e4m3, {keys, 1, kD}),
                          gpu_view(diks.get(), DType::f32, {keys}));
    msa::quantize(gpu_view(iq.get(), DType::bf16, {tq, kIndexHeads, kD}), msa::QuantFormat::fp8_per_token, qi, s);
    msa::quantize(gpu_view(ik.get(), DType::bf16, {keys, 1, kD}), msa::QuantFormat::fp8_per_token, ki, s);
    MSA_BENCH_CUDA(cudaStreamSynchronize(s));  // the bf16 index draws are freed on return
  }

  msa::KVCache kv() const {
    msa::KVCache r;
    r.k = gpu_view(dk.get(), DType::bf16, kv_shape);
    r.v = gpu_view(dv.get(), DType::bf16, kv_shape);
    if (c.page_size == 0) {
      r.cu_seqlens_k = gpu_view(dcu_k.get(), DType::i32, {int64_t(c.seqlens_k.size()) + 1});
    } else {
      r.layout = msa::KVLayout::paged_nhd;
      r.page_table = gpu_view(dtable.get(), DType::i32, {int64_t(c.seqlens_k.size()), max_pages});
      r.seqused_k = gpu_view(dused.get(), DType::i32, {int64_t(c.seqlens_k.size())});
    }
    return r;
  }
  msa::QTensor index_q() const {
    return {gpu_view(diq.get(), DType::fp8_e4m3, {tq, kIndexHeads, kD}), gpu_view(diqs.get(), DType::f32, {tq})};
  }
  msa::QTensor index_k() const {
    std::vector<int64_t> shape = {keys, 1, kD};
    if (c.page_size > 0) shape = {pages, c.page_size, 1, kD};
    return {gpu_view(dik.get(), DType::fp8_e4m3, shape), gpu_view(diks.get(), DType::f32, {keys})};
  }
  Tensor q() const { return gpu_view(dq.get(), DType::bf16, {tq, hq, kD}); }
  Tensor cu_seqlens_q() const { return gpu_view(dcu_q.get(), DType::i32, {int64_t(c.seqlens_q.size()) + 1}); }

  const BenchCase& c;
  int64_t tq = 0, hq = 0, hkv = 0, keys = 0, rows = 0, max_pages = 0, pages = 0;
  std::vector<int64_t> kv_shape;
  DeviceBuffer dq, dk, dv, dcu_q, dcu_k, dtable, dused, diq, diqs, dik, diks;
};

// The pipeline's output against attention_forward with its selection, and dense attention's,
// each free of NaN (outputs poisoned before), the first two within 1e-2 relative; 1 (and a line
// saying so) when not.
int check_outputs(const BenchCase& c, const LatencyInputs& in, const msa::PipelineArgs& p,
                  const msa::AttentionArgs& a, const msa::AttentionArgs& dense, DeviceBuffer& out,
                  const Tensor& st, cudaStream_t s) {
  std::vector<std::vector<uint16_t>> got;
  for (auto* run : {+[](const msa::PipelineArgs& p, const msa::AttentionArgs&, cudaStream_t s) { msa::sparse_attention_pipeline(p, s); },
                    +[](const msa::PipelineArgs&, const msa::AttentionArgs& a, cudaStream_t s) { msa::attention_forward(a, s); }}) {
    out.poison(s);
    run(p, a, s);
    msa::check_status(st, s);
    got.push_back(out.download<uint16_t>(size_t(in.tq * in.hq * kD), s));
  }
  out.poison(s);
  msa::attention_forward(dense, s);
  msa::check_status(st, s);
  got.push_back(out.download<uint16_t>(size_t(in.tq * in.hq * kD), s));
  double num = 0, den = 0;
  int64_t nan = 0;
  for (size_t i = 0; i < got[0].size(); ++i) {
    const double x = bf16_to_float(got[0][i]), y = bf16_to_float(got[1][i]);
    nan += std::isnan(x) + std::isnan(y) + std::isnan(bf16_to_float(got[2][i]));
    num += (x - y) * (x - y);
    den += y * y;
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  if (nan != 0 || !(rel <= 1e-2)) {
    std::printf("%s: check FAILED: %lld NaN outputs, pipeline vs attention_forward rel L2 %.3g\n",
                c.name.c_str(), (long long)nan, rel);
    return 1;
  }

  return 0;
}

// Decode over a latency case's paged cache: one query per request (its own N(0, 1) rows), the
// request's sink block and its last top-K - 1 blocks selected (a fixed selection: run() reads q2k
// as given, so which blocks does not change the launch or the host work), planned once for the
// cache's lengths. Outputs poisoned, then checked free of NaN.
struct DecodeCalls {
  DecodeCalls(const BenchCase& c, const LatencyInputs& in, const Tensor& st, cudaStream_t s)
      : B(int64_t(c.seqlens_q.size())) {
    std::vector<int32_t> cq(size_t(B) + 1), ids;
    std::iota(cq.begin(), cq.end(), 0);
    dcu = DeviceBuffer::from_host(cq, s);
    dq = normal_bf16({B, in.hq, kD}, c.seed, 5, s);
    out = gpu_buffer(size_t(B * in.hq * kD) * 2);
    for (int64_t h = 0; h < in.hkv; ++h)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t nblk = (c.seqlens_k[size_t(b)] + kBlock - 1) / kBlock;
        ids.push_back(0);
        for (int64_t j = 1; j < c.topk; ++j) {
          const int64_t id = nblk - c.topk + j;  // the last top-K - 1 blocks
          ids.push_back(id > 0 ? int32_t(id) : -1);  // -1: none (block 0 is the sink's)
        }
      }
    dq2k = DeviceBuffer::from_host(ids, s);
    std::vector<int32_t> used(c.seqlens_k.begin(), c.seqlens_k.end());
    for (int sparse = 0; sparse < 2; ++sparse) {
      msa::DecodeShape sh;
      sh.batch = int(B);
      sh.num_q_heads = int(in.hq);
      sh.num_kv_heads = int(in.hkv);
      sh.head_dim = int(kD);
      sh.page_size = c.page_size;
      sh.max_pages = int(in.max_pages);
      sh.topk = sparse ? int(c.topk) : 0;
      sh.device = msa::Device{msa::DeviceType::cuda, 0};
      DeviceBuffer& ws = sparse ? ws_sparse : ws_dense;
      ws = gpu_buffer(std::max<size_t>(msa::DecodePlan::workspace_bytes(sh), 1));
      (sparse ? plan_sparse : plan_dense).plan(sh, used.data(), gpu_view(ws.get(), DType::u8, {int64_t(ws.bytes())}), s);
      msa::AttentionArgs& a = sparse ? args_sparse : args_dense;
      a.q = gpu_view(dq.get(), DType::bf16, {B, in.hq, kD});
      a.kv = in.kv();
      a.cu_seqlens_q = gpu_view(dcu.get(), DType::i32, {B + 1});
      if (sparse) a.q2k = gpu_view(dq2k.get(), DType::i32, {in.hkv, B, c.topk});
      a.out = gpu_view(out.get(), DType::bf16, {B, in.hq, kD});
      a.status = st;
    }
  }

  // 1 (and a line saying so) when either run leaves a NaN in its poisoned output.
  int check(const std::string& name, const Tensor& st, cudaStream_t s) {
    for (int sparse = 0; sparse < 2; ++sparse) {
      out.poison(s);
      (sparse ? plan_sparse : plan_dense).run(sparse ? args_sparse : args_dense, s);
      msa::check_status(st, s);
      int64_t nan = 0;
      for (uint16_t x : out.download<uint16_t>(out.bytes() / 2, s)) nan += std::isnan(bf16_to_float(x));
      if (nan != 0) {
        std::printf("%s: check FAILED: %lld NaN outputs of %s decode\n", name.c_str(), (long long)nan,
                    sparse ? "sparse" : "dense");
        return 1;
      }
    }
    return 0;
  }

  int64_t B;
  DeviceBuffer dcu, dq, dq2k, out, ws_sparse, ws_dense;
  msa::DecodePlan plan_sparse, plan_dense;
  msa::AttentionArgs args_sparse, args_dense;
};

int run_case(const BenchCase& c, const LatencyBenchOptions& o, cudaStream_t s) {
  const LatencyInputs in(c, s);
  DeviceBuffer out = gpu_buffer(size_t(in.tq * in.hq * kD) * 2), status = gpu_buffer(16);
  status.fill(0, s);
  const Tensor st = gpu_view(status.get(), DType::i32, {4});

  msa::PipelineArgs p;  // as msa.sparse_attention(q, k, v, ..., index_q=, index_k=, topk=16)
  p.q = in.q();
  p.kv = in.kv();
  p.cu_seqlens_q = in.cu_seqlens_q();
  p.index_q = in.index_q();
  p.index_k = in.index_k();
  p.topk = c.topk;
  p.out = gpu_view(out.get(), DType::bf16, {in.tq, in.hq, kD});
  p.status = st;
  const DeviceBuffer pipe_ws = gpu_buffer(msa::pipeline_workspace_bytes(p));
  p.workspace = gpu_view(pipe_ws.get(), DType::u8, {int64_t(pipe_ws.bytes())});
  msa::sparse_attention_pipeline(p, s);
  msa::check_status(st, s);

  // The pipeline's selection (q2k at the start of its workspace) and its CSR, built once
  // (untimed), as a caller of attention_forward has them.
  const int64_t sel = in.hkv * in.tq * c.topk;
  DeviceBuffer q2k = gpu_buffer(size_t(sel) * 4), row_ptr = gpu_buffer(size_t(in.hkv * (in.rows + 1)) * 4),
               q_idx = gpu_buffer(size_t(sel) * 4),
               schedule = gpu_buffer(size_t(msa::k2q_schedule_size(in.hkv, in.rows, in.tq, c.topk)) * 4);
  MSA_BENCH_CUDA(cudaMemcpyAsync(q2k.get(), pipe_ws.get(), size_t(sel) * 4, cudaMemcpyDeviceToDevice, s));
  msa::CsrBuildArgs csr;
  csr.q2k = gpu_view(q2k.get(), DType::i32, {in.hkv, in.tq, c.topk});
  csr.cu_seqlens_q = p.cu_seqlens_q;
  csr.kv = p.kv;
  csr.out.row_ptr = gpu_view(row_ptr.get(), DType::i32, {in.hkv, in.rows + 1});
  csr.out.q_idx = gpu_view(q_idx.get(), DType::i32, {in.hkv, sel / in.hkv});
  csr.out.schedule = gpu_view(schedule.get(), DType::i32, {int64_t(schedule.bytes() / 4)});
  const DeviceBuffer csr_ws = gpu_buffer(msa::csr_workspace_bytes(in.hkv, in.rows, in.tq, c.topk));
  csr.workspace = gpu_view(csr_ws.get(), DType::u8, {int64_t(csr_ws.bytes())});
  csr.status = st;
  msa::build_k2q_csr(csr, s);
  msa::check_status(st, s);

  msa::AttentionArgs a;  // as msa.attention_forward(q, k, v, ..., q2k=q2k, k2q=k2q)
  a.q = p.q;
  a.kv = p.kv;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.q2k = csr.q2k;
  a.k2q = csr.out;
  a.out = p.out;
  a.status = st;
  const DeviceBuffer attn_ws = gpu_buffer(msa::attention_workspace_bytes(a));
  a.workspace = gpu_view(attn_ws.get(), DType::u8, {int64_t(attn_ws.bytes())});

  msa::AttentionArgs dense = a;  // the same call without a selection: dense attention
  dense.q2k = Tensor();
  dense.k2q = msa::K2QIndex{};
  const DeviceBuffer dense_ws = gpu_buffer(msa::attention_workspace_bytes(dense));
  dense.workspace = gpu_view(dense_ws.get(), DType::u8, {int64_t(dense_ws.bytes())});

  if (o.check && check_outputs(c, in, p, a, dense, out, st, s) != 0) return 1;
  std::unique_ptr<DecodeCalls> dec;
  if (c.page_size > 0) {
    dec = std::make_unique<DecodeCalls>(c, in, st, s);
    if (o.check && dec->check(c.name, st, s) != 0) return 1;
  }

  std::vector<std::pair<const char*, std::function<void()>>> ops = {
      {"pipeline", [&] { msa::sparse_attention_pipeline(p, s); }},
      {"attention_forward", [&] { msa::attention_forward(a, s); }},
      {"attention_forward_dense", [&] { msa::attention_forward(dense, s); }},
      // Host work alone (the checks and plans a call repeats, no launch): what of a call's host
      // time is not its launches.
      {"pipeline_workspace_bytes", [&] { (void)msa::pipeline_workspace_bytes(p); }},
      {"attention_workspace_bytes", [&] { (void)msa::attention_workspace_bytes(a); }},
  };
  if (dec) {
    ops.emplace_back("decode", [&] { dec->plan_sparse.run(dec->args_sparse, s); });
    ops.emplace_back("decode_dense", [&] { dec->plan_dense.run(dec->args_dense, s); });
  }
  for (const auto& [op, call] : ops) {
    if (!o.ops.empty() && std::find(o.ops.begin(), o.ops.end(), std::string(op)) == o.ops.end())
      continue;
    const HostTimes t = time_calls(call, o.calls, o.warmup, o.gpu_loop, s);
    msa::check_status(st, s);
    const GraphNodes l = count_launches(call, s);
    std::printf("%-10s %-24s GPU %8.1f us per call, host %6.1f us (min %.1f, max %.1f), "
                "%2d launches, %d memsets, %d other nodes\n",
                c.name.c_str(), op, t.gpu_us, t.median_us, t.min_us, t.max_us, l.kernels,
                l.memsets, l.others);
    if (o.json.empty()) continue;
    Json r = new_record(c.name, op);
    add_shape(r, c);
    if (dec && std::string(op).rfind("decode", 0) == 0) {
      r["seq_q"] = 1;  // one query a request over the case's cache
      if (std::string(op) == "decode_dense") r["topk"] = 0;
    }
    add_dtypes(r, "bf16", "bf16");
    r["index_heads"] = kIndexHeads;
    r["index_key_heads"] = 1;
    r["index_dtype"] = "fp8_e4m3";
    r["host_us_median"] = t.median_us;
    r["host_us_min"] = t.min_us;
    r["host_us_max"] = t.max_us;
    r["gpu_us"] = t.gpu_us;
    r["launches"] = l.kernels;
    r["memsets"] = l.memsets;
    r["other_nodes"] = l.others;
    r["calls"] = o.calls;
    add_environment(r, /*on_gpu=*/true, "none");
    append_record(o.json, r);
  }
  return 0;
}

}  // namespace

std::vector<std::string> latency_case_names() {
  std::vector<std::string> v;
  for (const BenchCase& c : bench_cases())
    if (c.kind == CaseKind::latency) v.push_back(c.name);
  return v;
}

int run_latency_bench(std::vector<std::string> names, const LatencyBenchOptions& o) {
  if (names.empty()) names = latency_case_names();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_latency: no CUDA device\n");
    return 2;
  }
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc = 0;
  for (const std::string& n : names) {
    const BenchCase* c = find_case(n);
    if (c == nullptr || c->kind != CaseKind::latency) {
      std::fprintf(stderr, "bench_latency: unknown case %s\n", n.c_str());
      rc = 2;
      break;
    }
    std::printf("%s: %s (index branch: 4 FP8 index heads on 1 index key head, per-token scales)\n",
                c->name.c_str(), describe_shape(*c).c_str());
    rc = std::max(rc, run_case(*c, o, s));
  }
  MSA_BENCH_CUDA(cudaStreamDestroy(s));
  return rc;
}

}  // namespace msa_bench
