// The pipeline benchmark (gpu_benches.h; programs: bench_pipeline, `msa bench`): bench/CASES.md's
// E2E-32K, the fused indexer + top-K, then sparse attention with its CSR build, timed as one
// sparse_attention_pipeline call and stage by stage, one record (bench/SCHEMA.md) each; with
// o.m3, E2E-32K-M3 (the index branch of 4 FP8 index heads on 1 index key head: top-K per kv
// head, whose stage record is IDX-32K-M3-fp8: block_topk with a list per kv head, as the
// pipeline runs it, and block_scores + select_topk, the two-step form, in the same run). Checked
// first: sampled (token, head) rows of out / lse against an fp64 host computation over the keys
// the GPU's own selection attends. bench/peers.py times cuDNN dense causal on the same shape from
// the pipeline's record.
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "workloads/cases.h"
#include "workloads/counts.h"
#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"
#include "workloads/patterns.h"
#include "workloads/record.h"
#include "msa/msa.h"

namespace {

using msa::DType;
using msa::Tensor;
using namespace msa::bench;

}  // namespace

int msa_bench::run_pipeline_bench(const RunOptions& o) {
  const int64_t S = o.seq, D = SingleRequestInputs::kHeadDim, G = o.hq / o.hkv, blk = 128;
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const SingleRequestInputs in(S, o.hq, o.hkv, /*seed=*/2, /*with_v=*/true, s);
  const DeviceBuffer out = gpu_buffer(in.q.size() * 2), lse = gpu_buffer(size_t(o.hq * S) * 4),
                     status = gpu_buffer(16), flush = gpu_buffer(size_t(256) << 20);

  msa::PipelineArgs a;
  a.q = in.q_view();
  a.kv = in.kv();
  a.cu_seqlens_q = a.kv.cu_seqlens_k;
  a.topk = int(o.topk);
  a.params.partial_dtype = o.partial;
  a.out = gpu_view(out.get(), DType::bf16, {S, o.hq, D});
  a.lse = gpu_view(lse.get(), DType::f32, {o.hq, S});
  a.status = gpu_view(status.get(), DType::i32, {4});
  // --index m3: the index branch, 4 index heads on 1 index key head, N(0, 1) draws quantized to
  // FP8 per token on the GPU.
  constexpr int64_t kIndexHeads = 4;
  const size_t m3_rows = o.m3 ? size_t(S) : 0;  // the index branch's buffers, M3 only
  DeviceBuffer iq8 = gpu_buffer(m3_rows * kIndexHeads * D), iqs = gpu_buffer(m3_rows * 4),
               ik8 = gpu_buffer(m3_rows * D), iks = gpu_buffer(m3_rows * 4);
  if (o.m3) {
    std::vector<uint16_t> h(size_t(S * kIndexHeads * D));
    fill_normal_bf16(h.data(), int64_t(h.size()), 2, 3);
    const DeviceBuffer iq = DeviceBuffer::from_host(h, s);
    h.resize(size_t(S * D));
    fill_normal_bf16(h.data(), int64_t(h.size()), 2, 4);
    const DeviceBuffer ik = DeviceBuffer::from_host(h, s);
    a.index_q = msa::QTensor(gpu_view(iq8.get(), DType::fp8_e4m3, {S, kIndexHeads, D}),
                             gpu_view(iqs.get(), DType::f32, {S}));
    a.index_k = msa::QTensor(gpu_view(ik8.get(), DType::fp8_e4m3, {S, 1, D}),
                             gpu_view(iks.get(), DType::f32, {S}));
    msa::quantize(gpu_view(iq.get(), DType::bf16, {S, kIndexHeads, D}), msa::QuantFormat::fp8_per_token,
                  a.index_q, s);
    msa::quantize(gpu_view(ik.get(), DType::bf16, {S, 1, D}), msa::QuantFormat::fp8_per_token, a.index_k, s);
    MSA_BENCH_CUDA(cudaStreamSynchronize(s));  // the bf16 draws are freed on return
  }
  const DeviceBuffer ws = gpu_buffer(msa::pipeline_workspace_bytes(a));
  a.workspace = gpu_view(ws.get(), DType::u8, {int64_t(ws.bytes())});

  msa::clear_status(a.status, s);
  msa::sparse_attention_pipeline(a, s);
  msa::check_status(a.status, s);

  // Check: the q2k at the start of the workspace says which keys each row attends.
  const auto q2k = ws.download<int32_t>(size_t(o.hkv * S * o.topk), s);
  const auto got = out.download<uint16_t>(size_t(S * o.hq * D), s);
  const auto got_lse = lse.download<float>(size_t(o.hq * S), s);
  const double scale = 1.0 / std::sqrt(double(D));
  double worst_rel = 0, worst_lse = 0;
  std::mt19937 rng(4);
  for (int sample = 0; sample < 8; ++sample) {
    const int64_t t = sample == 0 ? S - 1 : int64_t(rng() % S), h = int64_t(rng() % o.hq), kh = h / G;
    std::vector<int64_t> keys;
    for (int64_t slot = 0; slot < o.topk; ++slot) {
      const int32_t b = q2k[(kh * S + t) * o.topk + slot];
      for (int64_t j = b * blk; b >= 0 && j < std::min(S, (b + 1) * blk) && j <= t; ++j) keys.push_back(j);
    }
    std::vector<double> logit(keys.size()), acc(D, 0.0);
    double m = -INFINITY, sum = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dot += double(bf16_to_float(in.q[(t * o.hq + h) * D + d])) * bf16_to_float(in.k[(keys[i] * o.hkv + kh) * D + d]);
      logit[i] = dot * scale;
      m = std::max(m, logit[i]);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const double w = std::exp(logit[i] - m);
      sum += w;
      for (int64_t d = 0; d < D; ++d) acc[d] += w * bf16_to_float(in.v[(keys[i] * o.hkv + kh) * D + d]);
    }
    double num = 0, den = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double r = acc[d] / sum, x = bf16_to_float(got[(t * o.hq + h) * D + d]);
      num += (x - r) * (x - r);
      den += r * r;
    }
    worst_rel = std::max(worst_rel, std::sqrt(num / den));
    worst_lse = std::max(worst_lse, std::fabs(double(got_lse[h * S + t]) - (m + std::log(sum))));
  }
  const bool ok = worst_rel <= 1e-2 && worst_lse <= 2e-3;
  std::printf("check: 8 sampled rows, out rel L2 %.2e, lse max abs %.2e: %s\n", worst_rel, worst_lse,
              ok ? "ok" : "FAILED");

  // Stage by stage, on the same buffers: the fused selection (M3: of the 4 index heads, a list per
  // kv head, as the pipeline runs it; and block scores, then top-K per kv head), then attention
  // on its q2k.
  const int64_t nblk = (S + blk - 1) / blk;
  const DeviceBuffer m3_scores = gpu_buffer(o.m3 ? size_t(kIndexHeads * nblk * S) * 4 : 0);
  msa::BlockScoresArgs m3s;
  m3s.q = a.index_q;
  m3s.kv = a.kv;
  m3s.kv.k = a.index_k;
  m3s.kv.v = msa::QTensor();
  m3s.cu_seqlens_q = a.cu_seqlens_q;
  m3s.scores = gpu_view(m3_scores.get(), DType::f32, {kIndexHeads, nblk, S});
  m3s.status = a.status;
  msa::TopKArgs m3t;
  m3t.scores = m3s.scores;
  m3t.cu_seqlens_q = a.cu_seqlens_q;
  m3t.kv = a.kv;
  m3t.num_kv_heads = int(o.hkv);
  m3t.topk = a.topk;
  m3t.q2k = gpu_view(ws.get(), DType::i32, {o.hkv, S, o.topk});
  m3t.status = a.status;
  msa::BlockTopKArgs sel;
  sel.q = a.q;
  sel.kv = a.kv;
  sel.kv.v = msa::QTensor();
  sel.cu_seqlens_q = a.cu_seqlens_q;
  sel.topk = a.topk;
  sel.q2k = gpu_view(ws.get(), DType::i32, {o.hkv, S, o.topk});
  sel.status = a.status;
  msa::BlockTopKArgs m3f = sel;  // M3: the index branch's heads, a list per kv head
  m3f.q = a.index_q;
  m3f.kv.k = a.index_k;
  msa::AttentionArgs att;
  att.q = a.q;
  att.kv = a.kv;
  att.cu_seqlens_q = a.cu_seqlens_q;
  att.q2k = sel.q2k;
  att.params = a.params;
  att.out = a.out;
  att.lse = a.lse;
  att.status = a.status;
  const DeviceBuffer att_ws = gpu_buffer(msa::attention_workspace_bytes(att));
  att.workspace = gpu_view(att_ws.get(), DType::u8, {int64_t(att_ws.bytes())});

  const Timing te = time_op([&] { msa::sparse_attention_pipeline(a, s); }, o.warmup, o.iters, s, &flush, "pipeline");
  const Timing ts = time_op([&] { msa::block_topk(o.m3 ? m3f : sel, s); }, o.warmup, o.iters, s, &flush,
                            "block_topk");
  const Timing t2 = o.m3 ? time_op([&] { msa::block_scores(m3s, s); msa::select_topk(m3t, s); }, o.warmup,
                                    o.iters, s, &flush, "block_scores + select_topk")
                         : Timing{};
  const Timing ta = time_op([&] { msa::attention_forward(att, s); }, o.warmup, o.iters, s, &flush,
                            "attention_forward");
  msa::check_status(a.status, s);
  const std::string name = o.m3 ? "E2E-32K-M3" : "E2E-32K";
  std::printf("%-26s %9s %9s %9s   (%s partials, L2 flush: %s)\n", (name + " stage").c_str(), "median_ms",
              "min_ms", "max_ms", msa::dtype_name(o.partial), flush_name());
  std::printf("%-26s %9.3f %9.3f %9.3f\n", "pipeline (one call)", te.median, te.min, te.max);
  // M3: the index branch's FLOP, 2 D Hi per visible pair.
  const double m3_flop = 2.0 * double(D) * kIndexHeads * double(S) * double(S + 1) / 2;
  if (o.m3) {
    std::printf("%-26s %9.3f %9.3f %9.3f   IDX-32K-M3-fp8: %.1f TFLOP/s\n",
                "  indexer + top-K (fused)", ts.median, ts.min, ts.max, m3_flop / (ts.median * 1e9));
    std::printf("%-26s %9.3f %9.3f %9.3f   (the two-step form: %.1f TFLOP/s)\n",
                "  block scores + top-K", t2.median, t2.min, t2.max, m3_flop / (t2.median * 1e9));
  } else
    std::printf("%-26s %9.3f %9.3f %9.3f\n", "  indexer + top-K (fused)", ts.median, ts.min, ts.max);
  std::printf("%-26s %9.3f %9.3f %9.3f\n", "  CSR + sparse attention", ta.median, ta.min, ta.max);
  if (!o.json.empty()) {
    SelectionShape shape;
    shape.cu_seqlens_q = shape.cu_seqlens_k = {0, S};
    shape.num_kv_heads = int(o.hkv);
    shape.topk = int(o.topk);
    const PairCounts pairs = count_pairs(q2k, shape, int(G));  // on the GPU's own selection
    const BenchCase bc = case_as_run(name, o);
    // M3's stage twice: fused (block_topk) and the two-step form (its own op name).
    const std::tuple<Op, Timing, const char*> timed[] = {{Op::pipeline, te, nullptr},
                                                         {Op::block_topk, ts, nullptr},
                                                         {Op::block_topk, t2, "block_scores+select_topk"},
                                                         {Op::attention_forward, ta, nullptr}};
    for (const auto& [op, x, alt] : timed) {
      if (alt != nullptr && !o.m3) continue;
      OpCount n = count_op(op, op_shape(shape, int(o.hq), int(D)), pairs);
      const bool m3_stage = o.m3 && op == Op::block_topk;
      Json r = m3_stage ? new_record("IDX-32K-M3-fp8", alt != nullptr ? alt : op_name(op)) : new_record(name, op_name(op));
      if (o.m3 && op != Op::attention_forward) {  // the index branch's FLOP instead of 64 heads'
        const double attn = count_op(Op::attention_forward, op_shape(shape, int(o.hq), int(D)), pairs).flop;
        n.flop = op == Op::pipeline ? attn + m3_flop : m3_flop;
        n.bytes = 0;  // not counted for the index branch
        r["index_heads"] = kIndexHeads;
        r["index_key_heads"] = 1;
        r["index_dtype"] = "fp8_e4m3";
      }
      add_shape(r, bc);
      add_dtypes(r, "bf16", "bf16");
      if (op != Op::block_topk) r["partial"] = msa::dtype_name(o.partial);
      add_pairs(r, pairs);
      add_timing(r, {x.median, x.min, x.max}, o.iters, o.warmup, n.flop, n.bytes, Metric::tflops);
      add_check(r, check_result(true, ok), Json{{"out_rel_l2", worst_rel}, {"lse_max_abs", worst_lse}});
      add_environment(r, true, flush_name());
      append_record(o.json, r);
    }
  }
  return ok ? 0 : 1;
}

