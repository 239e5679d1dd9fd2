// The indexer benchmark (gpu_benches.h; programs: bench_indexer, `msa bench`): bench/CASES.md's
// IDX-32K-bf16, and IDX-32K-fp8 with o.fp8 (q and k quantized per token by msa::quantize; with
// o.fp8_per_tensor one scale per tensor instead, printed as IDX-32K-fp8-tensor: the kernel then
// has no per-key scale multiply, which shows that multiply's cost). Block scores materialized,
// the top-K on them, and the fused indexer + top-K, in TFLOP/s with FLOP = 2 D Hq (visible
// pairs), one record (bench/SCHEMA.md) each. A correctness check runs first: sampled score rows
// against an fp64 host dot product of the (dequantized) inputs, and the fused ids against
// select_topk on the materialized scores.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "workloads/cases.h"
#include "workloads/counts.h"
#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"
#include "workloads/record.h"
#include "msa/msa.h"

namespace {

using msa::DType;
using msa::Tensor;
using namespace msa::bench;

}  // namespace

int msa_bench::run_indexer_bench(const RunOptions& o) {
  const int64_t S = o.seq, D = SingleRequestInputs::kHeadDim, G = o.hq / o.hkv, nblk = (S + 127) / 128;
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const SingleRequestInputs in(S, o.hq, o.hkv, /*seed=*/1, /*with_v=*/false, s);
  const DeviceBuffer scores = gpu_buffer(size_t(o.hq * nblk * S) * 4),
                     ids = gpu_buffer(size_t(o.hkv * S * o.topk) * 4), ids2 = gpu_buffer(ids.bytes()),
                     status = gpu_buffer(16), flush = gpu_buffer(size_t(256) << 20);

  msa::BlockScoresArgs a;
  a.q = in.q_view();
  a.kv = in.kv();
  a.cu_seqlens_q = a.kv.cu_seqlens_k;
  a.scores = gpu_view(scores.get(), DType::f32, {o.hq, nblk, S});
  a.status = gpu_view(status.get(), DType::i32, {4});
  // --fp8: the same inputs quantized on the GPU (per token, or per tensor); the check
  // dequantizes the same bits.
  const int64_t nsc = o.fp8_per_tensor ? 1 : S;
  const auto fmt = o.fp8_per_tensor ? msa::QuantFormat::fp8_per_tensor : msa::QuantFormat::fp8_per_token;
  const DeviceBuffer q8 = gpu_buffer(in.q.size()), k8 = gpu_buffer(in.k.size()),
                     qs = gpu_buffer(size_t(nsc) * 4), ks = gpu_buffer(size_t(nsc) * 4);
  if (o.fp8) {
    const msa::QTensor q_fp8(gpu_view(q8.get(), DType::fp8_e4m3, {S, o.hq, D}), gpu_view(qs.get(), DType::f32, {nsc}));
    const msa::QTensor k_fp8(gpu_view(k8.get(), DType::fp8_e4m3, {S, o.hkv, D}), gpu_view(ks.get(), DType::f32, {nsc}));
    msa::quantize(a.q.values, fmt, q_fp8, s);
    msa::quantize(a.kv.k.values, fmt, k_fp8, s);
    a.q = q_fp8;
    a.kv.k = k_fp8;
  }
  msa::TopKArgs t;
  t.scores = a.scores;
  t.cu_seqlens_q = a.cu_seqlens_q;
  t.kv = a.kv;
  t.num_kv_heads = int(o.hkv);
  t.topk = int(o.topk);
  t.q2k = gpu_view(ids.get(), DType::i32, {o.hkv, S, o.topk});
  t.status = a.status;
  msa::BlockTopKArgs f;
  f.q = a.q;
  f.kv = a.kv;
  f.cu_seqlens_q = a.cu_seqlens_q;
  f.topk = int(o.topk);
  f.q2k = gpu_view(ids2.get(), DType::i32, {o.hkv, S, o.topk});
  f.status = a.status;

  // Correctness: sampled (token, head) rows of scores against fp64, fused ids == top-K(scores).
  msa::clear_status(a.status, s);
  msa::block_scores(a, s);
  msa::select_topk(t, s);
  msa::block_topk(f, s);
  msa::check_status(a.status, s);
  // Host values the scores are defined on: the bf16 inputs, or the FP8 bits dequantized (f32).
  std::vector<float> qv(in.q.size()), kv(in.k.size());
  if (o.fp8) {
    const DeviceBuffer qf = gpu_buffer(qv.size() * 4), kf = gpu_buffer(kv.size() * 4);
    msa::dequantize(a.q, gpu_view(qf.get(), DType::f32, {S, o.hq, D}), s);
    msa::dequantize(a.kv.k, gpu_view(kf.get(), DType::f32, {S, o.hkv, D}), s);
    qv = qf.download<float>(qv.size(), s);
    kv = kf.download<float>(kv.size(), s);
  } else {
    for (size_t i = 0; i < qv.size(); ++i) qv[i] = bf16_to_float(in.q[i]);
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = bf16_to_float(in.k[i]);
  }
  double worst = 0;
  std::mt19937 rng(3);
  for (int sample = 0; sample < 6; ++sample) {
    const int64_t tok = sample == 0 ? S - 1 : int64_t(rng() % S), h = int64_t(rng() % o.hq);
    std::vector<float> row(nblk);
    for (int64_t kb = 0; kb < nblk; ++kb) scores.download(&row[kb], 4, s, size_t((h * nblk + kb) * S + tok) * 4);
    for (int64_t kb = 0; kb < nblk; ++kb) {
      double best = -INFINITY;
      for (int64_t j = kb * 128; j < std::min(S, (kb + 1) * 128) && j <= tok; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(qv[(tok * o.hq + h) * D + d]) * kv[(j * o.hkv + h / G) * D + d];
        best = std::max(best, dot);
      }
      const double err = std::isinf(best) ? (row[kb] == best ? 0 : 1e9) : std::fabs(row[kb] - best) / (1 + std::fabs(best));
      worst = std::max(worst, err);
    }
  }
  const bool same_ids = ids.download<int32_t>(ids.bytes() / 4, s) == ids2.download<int32_t>(ids.bytes() / 4, s);
  std::printf("check: sampled score rows max rel err %.2e, fused ids %s unfused\n", worst,
              same_ids ? "==" : "!=");

  const std::string name = !o.fp8 ? "IDX-32K-bf16" : o.fp8_per_tensor ? "IDX-32K-fp8-tensor" : "IDX-32K-fp8";
  SelectionShape sel;
  sel.cu_seqlens_q = sel.cu_seqlens_k = {0, S};
  sel.num_kv_heads = int(o.hkv);
  sel.topk = int(o.topk);
  OpShape shape = op_shape(sel, int(o.hq), int(D));
  shape.q_elem = shape.kv_elem = o.fp8 ? 1 : 2;
  PairCounts pairs;  // causal visible (query head, key) pairs
  pairs.visible = o.hq * S * (S + 1) / 2;
  const Timing ts = time_op([&] { msa::block_scores(a, s); }, o.warmup, o.iters, s, &flush, "block_scores");
  const Timing tk = time_op([&] { msa::select_topk(t, s); }, o.warmup, o.iters, s, &flush, "select_topk");
  const Timing tf = time_op([&] { msa::block_topk(f, s); }, o.warmup, o.iters, s, &flush, "block_topk");
  msa::check_status(a.status, s);
  std::printf("%-22s %9s %9s %9s %9s   (L2 flush: %s)\n", "case", "median_ms", "min_ms", "max_ms", "TFLOP/s",
              flush_name());
  const bool ok = worst < 1e-3 && same_ids;
  const BenchCase bc = case_as_run(o.fp8 ? "IDX-32K-fp8" : "IDX-32K-bf16", o);
  auto report = [&](const char* stage, Op op, const Timing& x) {
    const OpCount n = count_op(op, shape, pairs);
    std::printf("%-22s %9.3f %9.3f %9.3f %9.1f\n", (name + " " + stage).c_str(), x.median, x.min, x.max,
                n.flop / (x.median * 1e9));
    if (o.json.empty()) return;
    Json r = new_record(name, op_name(op));
    add_shape(r, bc);
    const char* dt = o.fp8 ? "fp8_e4m3" : "bf16";
    add_dtypes(r, dt, dt, o.fp8 ? (o.fp8_per_tensor ? "tensor" : "token") : "");
    add_timing(r, {x.median, x.min, x.max}, o.iters, o.warmup, n.flop, n.bytes,
               n.flop > 0 ? Metric::tflops : Metric::tbps);
    add_check(r, check_result(true, ok), Json{{"scores_max_rel", worst}, {"fused_equals_unfused", same_ids}});
    add_environment(r, true, flush_name());
    append_record(o.json, r);
  };
  report("scores", Op::block_scores, ts);
  report("topk", Op::select_topk, tk);
  report("fused", Op::block_topk, tf);
  return ok ? 0 : 1;
}

