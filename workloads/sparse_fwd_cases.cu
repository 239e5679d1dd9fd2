// Implementation of the sparse prefill / CSR benchmark cases (sparse_fwd_cases.h): inputs from
// the shared case table and selection patterns, a GPU fp32 reference on sampled rows checked
// before timing, CUDA-event timing with an L2 flush before each run, median and spread, and one
// record (bench/SCHEMA.md) per case.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include "workloads/cases.h"
#include "workloads/counts.h"
#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"
#include "workloads/patterns.h"
#include "workloads/record.h"
#include "workloads/sparse_fwd_cases.h"
#include "msa/msa.h"

namespace msa_bench {
namespace {

using msa::DType;
using msa::Tensor;
using msa::bench::DeviceBuffer;
using msa::bench::gpu_buffer;
using msa::bench::time_op;
using msa::bench::Timing;

const msa::Device kGpu{msa::DeviceType::cuda, 0};

// fp32 reference for sampled (token, query head) rows: one warp per row, dim / 32 (<= 8) columns
// per lane, online softmax over the visible keys of the selected blocks (of blk keys; blk 1: token
// ids), exact expf/logf.
__global__ void reference_rows(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                               const int32_t* q2k, const int32_t* cu_q, const int32_t* cu_k,
                               int batch, int64_t total_q, int hq_count, int hkv, int topk, int blk,
                               int dim, float scale, const int32_t* samples, int n_samples,
                               float* out, float* lse) {
  const int per = dim / 32;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= int64_t(n_samples) * hq_count) return;
  const int64_t t = samples[w / hq_count];
  const int hq = int(w % hq_count), g = hq_count / hkv, h = hq / g;
  int b = 0;
  while (b + 1 < batch && cu_q[b + 1] <= t) ++b;
  const int64_t i = t - cu_q[b], lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
  const int64_t last = i + lk - lq;
  auto bf = [](uint16_t x) { return __uint_as_float(uint32_t(x) << 16); };
  float qv[8], acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int e = 0; e < per; ++e) qv[e] = bf(q[(t * hq_count + hq) * dim + lane * per + e]);
  float m = -INFINITY, sum = 0.f;
  const int64_t nblk = (lk + blk - 1) / blk;
  for (int s = 0; s < topk; ++s) {
    const int64_t kb = q2k[(int64_t(h) * total_q + t) * topk + s];
    if (kb < 0 || kb >= nblk) continue;
    for (int64_t j = kb * blk; j < std::min<int64_t>(lk, kb * blk + blk) && j <= last; ++j) {
      const int64_t row = (cu_k[b] + j) * hkv + h;
      float d = 0.f;
      for (int e = 0; e < per; ++e) d += qv[e] * bf(k[row * dim + lane * per + e]);
      for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
      const float x = d * scale, mn = fmaxf(m, x);
      const float c = expf(m - mn), p = expf(x - mn);
      sum = sum * c + p;
      for (int e = 0; e < per; ++e) acc[e] = acc[e] * c + p * bf(v[row * dim + lane * per + e]);
      m = mn;
    }
  }
  for (int e = 0; e < per; ++e) out[w * dim + lane * per + e] = sum > 0.f ? acc[e] / sum : 0.f;
  if (lane == 0) lse[w] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  // namespace

const std::vector<std::string>& sparse_case_names() {
  static const std::vector<std::string> names = {"P8K-tok",        "P32K-tok",       "P32K-blk",
                                                 "P48K-tok",       "P32K-tok64",     "P32K-blk64",
                                                 "P108K-bsr64",
                                                 "VARLEN-tok",     "CSR-32K",
                                                 "P32K-tok-fp8kv", "P32K-blk-fp8kv",
                                                 "P32K-blk-fp8qk", "P32K-blk-fp8qk-tensor",
                                                 "P32K-blk-nvfp4kv", "P16K-tok-D64",
                                                 "P16K-blk-D64",   "P16K-tok-D256",
                                                 "P16K-blk-D256",  "DENSE-8K",
                                                 "DENSE-32K",      "DENSE-VARLEN",
                                                 "DENSE-16K-D64",  "DENSE-16K-D256",
                                                 "DENSE-CHUNK",    "TOKSPARSE-8K",
                                                 "TOKSPARSE-32K",  "TOKSPARSE-32K-G16"};
  return names;
}

int run_sparse_case(const std::string& name, const SparseBenchOptions& o) {
  const msa::bench::BenchCase* bc = msa::bench::find_case(name);
  if (bc == nullptr || std::find(sparse_case_names().begin(), sparse_case_names().end(), name) ==
                           sparse_case_names().end()) {
    std::fprintf(stderr, "bench: unknown sparse case '%s'\n", name.c_str());
    return 2;
  }
  if (msa::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench: %s needs a CUDA device\n", name.c_str());
    return 2;
  }
  const int hq = bc->num_q_heads, hkv = bc->num_kv_heads, d = bc->head_dim, g = hq / hkv;
  const int topk = bc->topk;
  msa::bench::SelectionShape shape;
  shape.cu_seqlens_q = {0};
  shape.cu_seqlens_k = {0};
  for (size_t b = 0; b < bc->seqlens_q.size(); ++b) {
    shape.cu_seqlens_q.push_back(shape.cu_seqlens_q.back() + bc->seqlens_q[b]);
    shape.cu_seqlens_k.push_back(shape.cu_seqlens_k.back() + bc->seqlens_k[b]);
  }
  shape.num_kv_heads = hkv;
  shape.topk = topk;
  shape.kv_block_size = bc->kv_block_size;
  shape.blk_queries = bc->blk_queries;
  shape.causal = bc->causal;
  shape.seed = 20261130;
  const int64_t batch = int64_t(bc->seqlens_q.size());
  const int64_t tq = shape.cu_seqlens_q.back(), tk = shape.cu_seqlens_k.back();
  // Token ids (TOKSPARSE-*, kv_block_size 1): no k2q index (attention_forward takes q2k alone
  // there), and 32768 x 2048 ids per kv head to draw, whose host time is printed.
  const bool token_ids = bc->pattern == msa::bench::Pattern::ids;
  const auto sel_start = std::chrono::steady_clock::now();
  const std::vector<int32_t> sel = msa::bench::make_selection(bc->pattern, shape);
  if (token_ids)
    std::fprintf(stderr, "%s: %lld token ids drawn on the host in %.2f s\n", name.c_str(),
                 static_cast<long long>(sel.size()),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - sel_start).count());
  // attended = G x the visible ids of every (kv head, query) row: the G query heads of a kv head
  // attend its row, so 4 D attended is the FLOP count for Hkv = 1 (G = 64) and Hkv = 4 alike.
  const msa::bench::PairCounts pairs = msa::bench::count_pairs(sel, shape, g);
  if (const std::string w = msa::bench::dense_selection_warning(pairs, shape); !w.empty() && !bc->dense)
    std::fprintf(stderr, "%s: %s\n", name.c_str(), w.c_str());
  int64_t total_rows = 0;
  const int blk = bc->kv_block_size;
  for (int64_t l : bc->seqlens_k) total_rows += (l + blk - 1) / blk;

  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<int32_t> cu_q(shape.cu_seqlens_q.begin(), shape.cu_seqlens_q.end());
  std::vector<int32_t> cu_k(shape.cu_seqlens_k.begin(), shape.cu_seqlens_k.end());
  DeviceBuffer dq = gpu_buffer(size_t(tq) * hq * d * 2), dk = gpu_buffer(size_t(tk) * hkv * d * 2),
               dv = gpu_buffer(size_t(tk) * hkv * d * 2), dout = gpu_buffer(size_t(tq) * hq * d * 2),
               dlse = gpu_buffer(size_t(hq) * tq * 4), dq2k = gpu_buffer(sel.size() * 4),
               dcuq = gpu_buffer(cu_q.size() * 4), dcuk = gpu_buffer(cu_k.size() * 4),
               status = gpu_buffer(16), flush = gpu_buffer(size_t(256) << 20);
  {
    // One host vector for the three inputs: each upload is staged before it returns.
    std::vector<uint16_t> host(size_t(tq) * hq * d);
    msa::bench::fill_normal_bf16(host.data(), int64_t(host.size()), shape.seed, 0);
    dq.upload(host, s);
    host.resize(size_t(tk) * hkv * d);
    msa::bench::fill_normal_bf16(host.data(), int64_t(host.size()), shape.seed, 1);
    dk.upload(host, s);
    msa::bench::fill_normal_bf16(host.data(), int64_t(host.size()), shape.seed, 2);
    dv.upload(host, s);
  }
  dq2k.upload(sel, s);
  dcuq.upload(cu_q, s);
  dcuk.upload(cu_k, s);
  const Tensor st(status.get(), DType::i32, {4}, kGpu);
  msa::clear_status(st, s);

  // K2Q index, built once on the GPU (timed on its own as CSR-32K); token ids have none.
  const int64_t sched = token_ids ? 0 : msa::k2q_schedule_size(hkv, total_rows, tq, topk);
  const DeviceBuffer drp = gpu_buffer(token_ids ? 0 : size_t(hkv) * (total_rows + 1) * 4),
                     dqi = gpu_buffer(token_ids ? 0 : size_t(hkv) * tq * topk * 4),
                     dsc = gpu_buffer(sched * 4);
  msa::CsrBuildArgs cb;
  cb.q2k = Tensor(dq2k.get(), DType::i32, {hkv, tq, topk}, kGpu);
  cb.cu_seqlens_q = Tensor(dcuq.get(), DType::i32, {batch + 1}, kGpu);
  cb.kv.k = Tensor(dk.get(), DType::bf16, {tk, hkv, d}, kGpu);
  cb.kv.v = Tensor(dv.get(), DType::bf16, {tk, hkv, d}, kGpu);
  cb.kv.cu_seqlens_k = Tensor(dcuk.get(), DType::i32, {batch + 1}, kGpu);
  cb.out.row_ptr = Tensor(drp.get(), DType::i32, {hkv, total_rows + 1}, kGpu);
  cb.out.q_idx = Tensor(dqi.get(), DType::i32, {hkv, tq * topk}, kGpu);
  cb.out.schedule = Tensor(dsc.get(), DType::i32, {sched}, kGpu);
  const size_t csr_ws_bytes = token_ids ? 0 : msa::csr_workspace_bytes(hkv, total_rows, tq, topk);
  const DeviceBuffer csr_ws = gpu_buffer(csr_ws_bytes);
  cb.workspace = Tensor(csr_ws.get(), DType::u8, {int64_t(csr_ws_bytes)}, kGpu);
  cb.kv_block_size = blk;
  cb.status = st;
  if (!token_ids) {
    msa::build_k2q_csr(cb, s);
    msa::check_status(st, s);
  }

  msa::AttentionArgs a;
  a.q = Tensor(dq.get(), DType::bf16, {tq, hq, d}, kGpu);
  a.kv = cb.kv;
  // Quantized K/V cases: FP8 e4m3 with per-token-and-head scales, or NVFP4; dk / dv then hold
  // their exact dequantization (rounded once to bf16), which the sampled reference reads.
  // fp8qk: q too (per token and head), dq then holding its dequantization.
  const bool fp8qk_tensor = bc->kv_dtypes == "fp8qk-tensor";
  const bool fp8qk = bc->kv_dtypes == "fp8qk" || fp8qk_tensor;
  const bool fp8 = bc->kv_dtypes == "fp8" || fp8qk, fp4 = bc->kv_dtypes == "nvfp4";
  DeviceBuffer k8, v8, ks, vs, q8, qs;
  const msa::QuantFormat fp8_format = fp8qk_tensor ? msa::QuantFormat::fp8_per_tensor
                                                   : msa::QuantFormat::fp8_per_token_head;
  if (fp8 || fp4) {
    const int64_t vd = fp4 ? d / 2 : d, sd = fp4 ? d / 16 : 1;  // bytes of values, scales per row
    const DType vt = fp4 ? DType::fp4x2 : DType::fp8_e4m3, st_t = fp4 ? DType::fp8_e4m3 : DType::f32;
    k8 = gpu_buffer(size_t(tk) * hkv * vd);
    v8 = gpu_buffer(size_t(tk) * hkv * vd);
    ks = gpu_buffer(size_t(tk) * hkv * sd * (fp4 ? 1 : 4));
    vs = gpu_buffer(size_t(tk) * hkv * sd * (fp4 ? 1 : 4));
    auto scale_view = [&](const DeviceBuffer& b) {
      if (fp8qk_tensor) return Tensor(b.get(), st_t, {1}, kGpu);
      return fp4 ? Tensor(b.get(), st_t, {tk, hkv, sd}, kGpu) : Tensor(b.get(), st_t, {tk, hkv}, kGpu);
    };
    const msa::QTensor k_q(Tensor(k8.get(), vt, {tk, hkv, vd}, kGpu), scale_view(ks));
    const msa::QTensor v_q(Tensor(v8.get(), vt, {tk, hkv, vd}, kGpu), scale_view(vs));
    const msa::QuantFormat f = fp4 ? msa::QuantFormat::nvfp4 : fp8_format;
    msa::quantize(cb.kv.k.values, f, k_q, s);
    msa::quantize(cb.kv.v.values, f, v_q, s);
    msa::dequantize(k_q, cb.kv.k.values, s);
    msa::dequantize(v_q, cb.kv.v.values, s);
    a.kv.k = k_q;
    a.kv.v = v_q;
  }
  if (fp8qk) {
    q8 = gpu_buffer(size_t(tq) * hq * d);
    qs = gpu_buffer(size_t(tq) * hq * 4);
    const msa::QTensor q_q(Tensor(q8.get(), DType::fp8_e4m3, {tq, hq, d}, kGpu),
                           fp8qk_tensor ? Tensor(qs.get(), DType::f32, {1}, kGpu)
                                        : Tensor(qs.get(), DType::f32, {tq, hq}, kGpu));
    msa::quantize(a.q, fp8_format, q_q, s);
    msa::dequantize(q_q, a.q, s);
    a.q = q_q.values;
    a.q_scale = q_q.scale;
  }
  a.cu_seqlens_q = cb.cu_seqlens_q;
  // Paged cases (DENSE-CHUNK): the flat K / V (which the sampled reference keeps reading) copied
  // into a pool of page_size-slot pages, nhd, handed out in a shuffled order.
  DeviceBuffer pool_k, pool_v, dtable, dused;
  if (bc->page_size > 0) {
    const int64_t page = bc->page_size;
    int64_t max_pages = 0;
    for (int64_t l : bc->seqlens_k) max_pages = std::max(max_pages, (l + page - 1) / page);
    const int64_t pages = batch * max_pages;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::vector<int32_t> used;
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(uint32_t(bc->seed)));
    const size_t row = size_t(hkv) * d * 2;
    pool_k = gpu_buffer(size_t(pages * page) * row);
    pool_v = gpu_buffer(size_t(pages * page) * row);
    for (int64_t b = 0; b < batch; ++b) {
      used.push_back(int32_t(bc->seqlens_k[b]));
      for (int64_t pg = 0; pg * page < bc->seqlens_k[b]; ++pg) {
        const size_t n = size_t(std::min(page, bc->seqlens_k[b] - pg * page)) * row;
        const size_t src = size_t(cu_k[b] + pg * page) * row;
        const size_t dst = size_t(table[size_t(b * max_pages + pg)]) * size_t(page) * row;
        for (auto [to, from] : {std::pair{&pool_k, &dk}, std::pair{&pool_v, &dv}})
          MSA_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(to->get()) + dst,
                                         static_cast<const char*>(from->get()) + src, n,
                                         cudaMemcpyDeviceToDevice, s));
      }
    }
    dtable = gpu_buffer(table.size() * 4);
    dtable.upload(table, s);
    dused = gpu_buffer(used.size() * 4);
    dused.upload(used, s);
    a.kv = msa::KVCache();
    a.kv.k = Tensor(pool_k.get(), DType::bf16, {pages, page, hkv, d}, kGpu);
    a.kv.v = Tensor(pool_v.get(), DType::bf16, {pages, page, hkv, d}, kGpu);
    a.kv.layout = msa::KVLayout::paged_nhd;
    a.kv.page_table = Tensor(dtable.get(), DType::i32, {batch, max_pages}, kGpu);
    a.kv.seqused_k = Tensor(dused.get(), DType::i32, {batch}, kGpu);
  }
  if (!bc->dense) {  // dense: no selection (the full one above feeds the reference only)
    a.q2k = cb.q2k;
    if (!token_ids) a.k2q = cb.out;
  }
  a.out = Tensor(dout.get(), DType::bf16, {tq, hq, d}, kGpu);
  a.lse = Tensor(dlse.get(), DType::f32, {hq, tq}, kGpu);
  a.params.causal = bc->causal;
  a.params.kv_block_size = bc->kv_block_size;
  a.params.partial_dtype = o.partial == "f32" ? DType::f32 : DType::bf16;
  a.status = st;
  const bool is_csr = bc->kind == msa::bench::CaseKind::csr_build;
  size_t ws_bytes = is_csr ? 0 : msa::attention_workspace_bytes(a);
  const DeviceBuffer ws = gpu_buffer(ws_bytes);
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws_bytes)}, kGpu);

  double rel_l2 = -1, lse_err = -1;
  int rc = 0;
  if (!is_csr && o.check) {
    dout.poison(s);
    msa::attention_forward(a, s);
    msa::check_status(st, s);
    std::mt19937 rng(7);
    std::vector<int32_t> samples;
    for (int i = 0; i < 255; ++i) samples.push_back(int32_t(rng() % tq));
    samples.push_back(int32_t(tq - 1));
    const int ns = int(samples.size());
    DeviceBuffer dsm = gpu_buffer(ns * 4), dref = gpu_buffer(size_t(ns) * hq * d * 4),
                 dref_lse = gpu_buffer(size_t(ns) * hq * 4);
    dsm.upload(samples, s);
    const int64_t threads = int64_t(ns) * hq * 32;
    reference_rows<<<unsigned((threads + 255) / 256), 256, 0, s>>>(
        static_cast<uint16_t*>(dq.get()), static_cast<uint16_t*>(dk.get()),
        static_cast<uint16_t*>(dv.get()), static_cast<int32_t*>(dq2k.get()),
        static_cast<int32_t*>(dcuq.get()), static_cast<int32_t*>(dcuk.get()), int(batch), tq, hq,
        hkv, topk, blk, d, 1.f / std::sqrt(float(d)), static_cast<int32_t*>(dsm.get()), ns,
        static_cast<float*>(dref.get()), static_cast<float*>(dref_lse.get()));
    MSA_BENCH_CUDA(cudaGetLastError());
    const auto ref = dref.download<float>(size_t(ns) * hq * d, s);
    const auto ref_lse = dref_lse.download<float>(size_t(ns) * hq, s);
    const auto lse = dlse.download<float>(size_t(hq) * tq, s);
    const auto out = dout.download<uint16_t>(size_t(tq) * hq * d, s);
    double num = 0, den = 0, worst = 0;
    bool nan = false;
    for (int si = 0; si < ns; ++si)
      for (int h = 0; h < hq; ++h) {
        for (int e = 0; e < d; ++e) {
          const double gv = msa::bench::bf16_to_float(out[(size_t(samples[si]) * hq + h) * d + e]);
          const double rv = ref[(size_t(si) * hq + h) * d + e];
          nan |= std::isnan(gv);
          num += (gv - rv) * (gv - rv);
          den += rv * rv;
        }
        const double gl = lse[size_t(h) * tq + samples[si]], rl = ref_lse[size_t(si) * hq + h];
        if (std::isinf(rl) || std::isinf(gl)) { if (gl != rl) worst = INFINITY; }
        else worst = std::max(worst, std::fabs(gl - rl));
      }
    rel_l2 = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
    lse_err = worst;
    // FP8 q: the reference reads q * scale rounded to bf16, the kernel the e4m3 values and scales
    // (DESIGN.md section 10's FP8 tolerance); K / V are dequantized identically on both sides.
    const double tol_out = fp8qk ? 3e-2 : 1e-2, tol_lse = fp8qk ? 3e-2 : 2e-3;
    if (nan || !(rel_l2 <= tol_out) || !(lse_err <= tol_lse)) rc = 1;
  }

  Timing t;
  if (is_csr) {
    t = time_op([&] { msa::build_k2q_csr(cb, s); }, o.warmup, o.iters, s, o.flush_l2 ? &flush : nullptr,
                name.c_str());
  } else {
    t = time_op([&] { msa::attention_forward(a, s); }, o.warmup, o.iters, s, o.flush_l2 ? &flush : nullptr,
                name.c_str());
  }
  msa::check_status(st, s);
  const msa::bench::Op op = is_csr ? msa::bench::Op::build_k2q_csr : msa::bench::Op::attention_forward;
  msa::bench::OpShape op_sh = msa::bench::op_shape(shape, hq, d);
  if (fp8) op_sh.kv_elem = 1;
  if (fp4) op_sh.kv_elem = 0.5 + 1.0 / 16;  // packed values and one e4m3 scale per 16
  const msa::bench::OpCount count = msa::bench::count_op(op, op_sh, pairs);
  const double tflops = is_csr ? 0 : count.flop / (t.median * 1e-3) / 1e12;
  std::printf("%-11s %-44s median %8.3f ms  [%7.3f, %7.3f]  %7.1f TFLOP/s  check rel_l2 %.2e "
              "lse %.2e%s\n",
              name.c_str(), msa::bench::describe_shape(*bc).c_str(), t.median, t.min, t.max,
              tflops, rel_l2, lse_err, rc ? "  CHECK FAILED" : "");
  if (!o.json_path.empty()) {
    namespace mb = msa::bench;
    mb::Json r = mb::new_record(name, mb::op_name(op));
    mb::add_shape(r, *bc);
    mb::add_dtypes(r, fp8qk ? "fp8_e4m3" : "bf16", fp8 ? "fp8_e4m3" : fp4 ? "fp4x2" : "bf16",
                   fp8qk_tensor ? "tensor" : fp8 ? "token_head" : fp4 ? "nvfp4" : "");
    if (!is_csr) r["partial"] = o.partial;
    mb::add_pairs(r, pairs);
    mb::add_timing(r, {t.median, t.min, t.max}, o.iters, o.warmup, count.flop, count.bytes,
                   is_csr ? mb::Metric::tbps : mb::Metric::tflops);
    const bool checked = !is_csr && o.check;
    mb::add_check(r, mb::check_result(checked, rc == 0),
                  checked ? mb::Json{{"out_rel_l2", rel_l2}, {"lse_max_abs", lse_err}} : mb::Json());
    mb::add_environment(r, true, o.flush_l2 ? mb::flush_name() : "none");
    mb::append_record(o.json_path, r);
  }
  // The selection for bench/peers.py, which takes the shape from the JSON record.
  if (!o.dump_dir.empty() && !is_csr) {
    std::ofstream(o.dump_dir + "/" + name + ".q2k.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(sel.data()), std::streamsize(sel.size() * 4));
  }
  cudaStreamDestroy(s);
  return rc;
}

}  // namespace msa_bench
