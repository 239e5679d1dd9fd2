// The decode benchmark (gpu_benches.h; programs: bench_decode, `msa bench`): the decode cases of
// bench/CASES.md (DEC-B32, DEC-B32-dense, DEC-MTP bf16 and fp8 KV, DEC-MTP-fp8q, DEC-SKEW,
// DEC-B2048) through DecodePlan on the GPU, in TB/s (bytes that must move: each selected K/V byte
// once per kv head, q (and its scales), out, lse, page table and q2k rows) and microseconds, one
// record (bench/SCHEMA.md) per case and dtype variant: bf16 q and KV, bf16 q over FP8 KV ("fp8"),
// FP8 q with per-token-and-head scales over FP8 KV ("fp8q"), bf16 q over NVFP4 KV ("nvfp4").
// Inputs are filled on the device (random normal, fp8: e4m3 of it; nvfp4: random codes with e4m3
// block scales in [0.25, 1.25) and global scale 0.5); pages are shuffled over the
// pool. Before timing, three requests are checked against the CPU decode of the same bits.
// Each timed run follows an L2 flush (gpu_timing.h: a 256 MB write, or a read with
// MSA_BENCH_FLUSH=read); median, min and max of CUDA-event times.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "workloads/cases.h"
#include "workloads/device_fill.cuh"
#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"
#include "workloads/patterns.h"
#include "workloads/record.h"
#include "backend.h"  // cuda::decode_plan / decode_run of a given CTA width (--warps)
#include "msa/msa.h"

namespace {

using namespace msa;

using bench::DeviceBuffer;
using bench::gpu_buffer;

using Options = msa_bench::DecodeBenchOptions;

struct Result {
  std::string name, kv;
  double median_us = 0, min_us = 0, max_us = 0, bytes = 0, flop = 0, rel_l2 = 0, lse_err = 0;
  double host_us = 0, host_min_us = 0;  // host time of one run() (median, min)
  bench::PairCounts pairs;
  bool ok = true;
};

// The KV kind of a run and its bytes per K or V row (NVFP4: the packed values; their scale rows of
// D / 16 bytes are a pool of their own).
struct KVKind {
  bool fp8 = false, fp8q = false, fp4 = false;
  float global = 0.5f;  // NVFP4
  explicit KVKind(const std::string& variant)
      : fp8(variant == "fp8" || variant == "fp8q"), fp8q(variant == "fp8q"), fp4(variant == "nvfp4") {}
  DType dtype() const { return fp4 ? DType::fp4x2 : fp8 ? DType::fp8_e4m3 : DType::bf16; }
  int64_t row_bytes(int64_t d) const { return fp4 ? d / 2 : fp8 ? d : 2 * d; }
  int64_t pool_last_dim(int64_t d) const { return fp4 ? d / 2 : d; }
};

// Shape of a K or V page pool: [pages, page_size, Hkv, D] (nhd) or [pages, Hkv, page_size, D].
std::vector<int64_t> pool_shape(int64_t pages, int64_t ps, int64_t hkv, int64_t d, bool hnd) {
  return hnd ? std::vector<int64_t>{pages, hkv, ps, d} : std::vector<int64_t>{pages, ps, hkv, d};
}

// The decode shape of case c: `batch` requests of at most `max_queries` queries over at most
// `max_pages` pages, KV of `kv_dtype` in the nhd or (hnd) hnd page layout.
DecodeShape decode_shape(const bench::BenchCase& c, int batch, int max_queries, int max_pages, DType kv_dtype,
                         bool hnd, Device device) {
  DecodeShape sh;
  sh.batch = batch;
  sh.max_queries_per_request = max_queries;
  sh.num_q_heads = c.num_q_heads;
  sh.num_kv_heads = c.num_kv_heads;
  sh.head_dim = c.head_dim;
  sh.page_size = c.page_size;
  sh.max_pages = max_pages;
  sh.kv_dtype = kv_dtype;
  sh.topk = c.dense ? 0 : c.topk;
  sh.kv_block_size = c.kv_block_size;
  sh.layout = hnd ? KVLayout::paged_hnd : KVLayout::paged_nhd;
  sh.device = device;
  return sh;
}

// One request of the GPU problem rebuilt on the host (its pages, q rows and q2k rows) and run
// through the CPU decode; returns (rel L2 of out, max abs lse error) against the GPU output.
std::pair<double, double> check_request(int b, const bench::BenchCase& c, const KVKind& kind,
                                        const DeviceBuffer& q, const DeviceBuffer* q_scale,
                                        const DeviceBuffer& k, const DeviceBuffer& v, const std::vector<int32_t>& pt,
                                        int max_pages, const std::vector<int32_t>& cu,
                                        const std::vector<int32_t>& q2k, const DeviceBuffer& out,
                                        const DeviceBuffer& lse, int64_t total_q, bool hnd,
                                        const DeviceBuffer* k_scale, const DeviceBuffer* v_scale,
                                        const DeviceBuffer* k_sf, const DeviceBuffer* v_sf, cudaStream_t s) {
  const bool fp8 = kind.fp8, fp8q = kind.fp8q;
  const int hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim, ps = c.page_size;
  const int64_t lq = cu[b + 1] - cu[b], lk = c.seqlens_k[b];
  const int64_t pages = (lk + ps - 1) / ps, page_bytes = int64_t(ps) * hkv * kind.row_bytes(d);
  const int64_t sf_page = int64_t(ps) * hkv * (d / 16);  // NVFP4 scale bytes per page
  std::vector<uint8_t> hk(std::max<int64_t>(1, pages) * page_bytes), hv(hk.size());
  std::vector<uint8_t> hksf(kind.fp4 ? std::max<int64_t>(1, pages) * sf_page : 0), hvsf(hksf.size());
  std::vector<float> hks(std::max<int64_t>(1, pages) * ps), hvs(hks.size());  // per-slot scales
  for (int64_t p = 0; p < pages; ++p) {
    const int64_t page = pt[int64_t(b) * max_pages + p], src = page * page_bytes;
    MSA_BENCH_CUDA(cudaMemcpyAsync(hk.data() + p * page_bytes, static_cast<uint8_t*>(k.get()) + src, page_bytes, cudaMemcpyDeviceToHost, s));
    MSA_BENCH_CUDA(cudaMemcpyAsync(hv.data() + p * page_bytes, static_cast<uint8_t*>(v.get()) + src, page_bytes, cudaMemcpyDeviceToHost, s));
    if (kind.fp4) {
      MSA_BENCH_CUDA(cudaMemcpyAsync(hksf.data() + p * sf_page, static_cast<uint8_t*>(k_sf->get()) + page * sf_page, sf_page, cudaMemcpyDeviceToHost, s));
      MSA_BENCH_CUDA(cudaMemcpyAsync(hvsf.data() + p * sf_page, static_cast<uint8_t*>(v_sf->get()) + page * sf_page, sf_page, cudaMemcpyDeviceToHost, s));
    }
    if (k_scale) {
      MSA_BENCH_CUDA(cudaMemcpyAsync(hks.data() + p * ps, static_cast<float*>(k_scale->get()) + page * ps, ps * 4, cudaMemcpyDeviceToHost, s));
      MSA_BENCH_CUDA(cudaMemcpyAsync(hvs.data() + p * ps, static_cast<float*>(v_scale->get()) + page * ps, ps * 4, cudaMemcpyDeviceToHost, s));
    }
  }
  const int64_t row = int64_t(hq) * d, qsz = fp8q ? 1 : 2;
  std::vector<uint16_t> hq_rows(std::max<int64_t>(1, lq * row)), got(hq_rows.size());
  std::vector<float> hq_scale(std::max<int64_t>(1, lq * hq));
  MSA_BENCH_CUDA(cudaMemcpyAsync(hq_rows.data(), static_cast<uint8_t*>(q.get()) + cu[b] * row * qsz, lq * row * qsz, cudaMemcpyDeviceToHost, s));
  if (fp8q)
    MSA_BENCH_CUDA(cudaMemcpyAsync(hq_scale.data(), static_cast<float*>(q_scale->get()) + cu[b] * hq, lq * hq * 4, cudaMemcpyDeviceToHost, s));
  MSA_BENCH_CUDA(cudaMemcpyAsync(got.data(), static_cast<uint16_t*>(out.get()) + cu[b] * row, lq * row * 2, cudaMemcpyDeviceToHost, s));
  std::vector<float> got_lse(std::max<int64_t>(1, hq * lq));
  for (int h = 0; h < hq; ++h)
    MSA_BENCH_CUDA(cudaMemcpyAsync(got_lse.data() + h * lq, static_cast<float*>(lse.get()) + h * total_q + cu[b], lq * 4, cudaMemcpyDeviceToHost, s));
  MSA_BENCH_CUDA(cudaStreamSynchronize(s));

  std::vector<int32_t> page_ids(std::max<int64_t>(1, pages)), used = {int32_t(lk)}, cuq = {0, int32_t(lq)};
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::vector<int32_t> rows_q2k;
  if (!c.dense)
    for (int h = 0; h < hkv; ++h)
      for (int64_t i = 0; i < lq; ++i)
        for (int j = 0; j < c.topk; ++j) rows_q2k.push_back(q2k[(int64_t(h) * total_q + cu[b] + i) * c.topk + j]);
  float one = 1.f;
  const DType kvt = kind.dtype();
  AttentionArgs a;
  a.q = Tensor(hq_rows.data(), fp8q ? DType::fp8_e4m3 : DType::bf16, {lq, hq, d});
  if (fp8q) a.q_scale = Tensor(hq_scale.data(), DType::f32, {lq, hq});
  a.kv.layout = hnd ? KVLayout::paged_hnd : KVLayout::paged_nhd;
  const std::vector<int64_t> pool_dims = pool_shape(std::max<int64_t>(1, pages), ps, hkv, kind.pool_last_dim(d), hnd);
  const std::vector<int64_t> sf_dims = pool_shape(std::max<int64_t>(1, pages), ps, hkv, d / 16, hnd);
  const Tensor unit_scale(&one, DType::f32, {1});
  const int64_t slots = std::max<int64_t>(1, pages) * ps;
  const Tensor ksc = k_scale ? Tensor(hks.data(), DType::f32, {slots}) : unit_scale;
  const Tensor vsc = k_scale ? Tensor(hvs.data(), DType::f32, {slots}) : unit_scale;
  a.kv.k = fp8 ? QTensor(Tensor(hk.data(), kvt, pool_dims), ksc) : QTensor(Tensor(hk.data(), kvt, pool_dims));
  a.kv.v = fp8 ? QTensor(Tensor(hv.data(), kvt, pool_dims), vsc) : QTensor(Tensor(hv.data(), kvt, pool_dims));
  if (kind.fp4) {
    a.kv.k = QTensor(Tensor(hk.data(), kvt, pool_dims), Tensor(hksf.data(), DType::fp8_e4m3, sf_dims), kind.global);
    a.kv.v = QTensor(Tensor(hv.data(), kvt, pool_dims), Tensor(hvsf.data(), DType::fp8_e4m3, sf_dims), kind.global);
  }
  a.kv.page_table = Tensor(page_ids.data(), DType::i32, {1, std::max<int64_t>(1, pages)});
  a.kv.seqused_k = Tensor(used.data(), DType::i32, {1});
  a.cu_seqlens_q = Tensor(cuq.data(), DType::i32, {2});
  if (!c.dense) a.q2k = Tensor(rows_q2k.data(), DType::i32, {hkv, lq, c.topk});
  std::vector<uint16_t> ref(hq_rows.size());
  std::vector<float> ref_lse(got_lse.size());
  a.out = Tensor(ref.data(), DType::bf16, {lq, hq, d});
  a.lse = Tensor(ref_lse.data(), DType::f32, {hq, lq});
  DecodePlan cpu;
  cpu.plan(decode_shape(c, 1, int(std::max<int64_t>(1, lq)), int(std::max<int64_t>(1, pages)), kvt, hnd, Device{}),
           nullptr, Tensor());
  cpu.run(a);
  double d2 = 0, r2 = 0, lse_err = 0;
  for (int64_t i = 0; i < lq * row; ++i) {
    const double g = bench::bf16_to_float(got[i]), r = bench::bf16_to_float(ref[i]);
    d2 += (g - r) * (g - r);
    r2 += r * r;
    if (!std::isfinite(g)) d2 = INFINITY;
  }
  for (int64_t i = 0; i < hq * lq; ++i) {
    if (ref_lse[i] == -INFINITY && got_lse[i] == -INFINITY) continue;
    const double e = std::fabs(double(got_lse[i]) - ref_lse[i]);
    lse_err = std::max(lse_err, std::isfinite(e) ? e : INFINITY);
  }
  return {r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2), lse_err};
}

// variant: "bf16", "fp8" (bf16 q, FP8 KV), "fp8q" (FP8 q and KV) or "nvfp4" (bf16 q, NVFP4 KV).
Result run_case(const bench::BenchCase& c, const std::string& variant, const Options& o) {
  Result res;
  res.name = c.name;
  res.kv = variant;
  const KVKind kind(variant);
  const bool fp8q = kind.fp8q, fp8 = kind.fp8, fp4 = kind.fp4;
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int B = int(c.seqlens_q.size()), hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int ps = c.page_size;
  const int64_t row_bytes = kind.row_bytes(c.head_dim);
  std::vector<int32_t> cu(B + 1, 0), used(B);
  std::vector<int64_t> cu64(B + 1, 0), cuk64(B + 1, 0);
  int max_pages = 1;
  int64_t total_pages = 0;
  for (int b = 0; b < B; ++b) {
    cu[b + 1] = cu[b] + int32_t(c.seqlens_q[b]);
    cu64[b + 1] = cu[b + 1];
    cuk64[b + 1] = cuk64[b] + c.seqlens_k[b];
    used[b] = int32_t(c.seqlens_k[b]);
    const int n = int((c.seqlens_k[b] + ps - 1) / ps);
    max_pages = std::max(max_pages, n);
    total_pages += n;
  }
  const int64_t total_q = cu[B];
  // Pages of every request scattered over the pool in a fixed random order.
  std::vector<int32_t> order(total_pages), pt(int64_t(B) * max_pages, 0);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(c.seed));
  for (int b = 0, next = 0; b < B; ++b)
    for (int p = 0; p < int((c.seqlens_k[b] + ps - 1) / ps); ++p) pt[int64_t(b) * max_pages + p] = order[next++];
  bench::SelectionShape sel;
  sel.cu_seqlens_q = cu64;
  sel.cu_seqlens_k = cuk64;
  sel.num_kv_heads = hkv;
  sel.topk = c.dense ? 0 : c.topk;
  sel.kv_block_size = c.kv_block_size;
  sel.causal = c.causal;
  sel.seed = c.seed;
  std::vector<int32_t> q2k;
  if (!c.dense) q2k = bench::make_selection(c.pattern, sel);
  // Bytes that must move: every selected K/V row once per kv head (all of them when dense).
  res.pairs = bench::count_pairs(q2k, sel, hq / hkv);
  if (c.dense) {
    res.pairs.attended = res.pairs.visible;
    res.pairs.selected_keys = cuk64[B] * hkv;
  }
  const double kv_keys = double(res.pairs.selected_keys);
  res.flop = 4.0 * d * double(res.pairs.attended);
  const bool slot_scales = fp8 && o.slot_scales;
  const int qsz = fp8q ? 1 : 2;  // q bytes per element; q scales (fp8q) and lse 4 per row
  res.bytes = kv_keys * (row_bytes + (fp4 ? d / 16 : 0)) * 2 + double(total_q) * hq * d * (qsz + 2) +
              double(hq) * total_q * (fp8q ? 8 : 4) +
              double(total_pages) * 4 + double(q2k.size()) * 4 + double(B) * 8 +
              (slot_scales ? kv_keys * 2 * 4 : 0.0);  // per-slot scales: K's and V's per key and head

  const int64_t pool = total_pages * ps * hkv * row_bytes;  // bytes
  const int64_t sf_pool = fp4 ? total_pages * ps * hkv * (d / 16) : 0;
  const size_t slot_bytes = slot_scales ? size_t(total_pages) * ps * 4 : 0;
  DeviceBuffer q = gpu_buffer(size_t(total_q) * hq * d * qsz), k = gpu_buffer(size_t(pool)),
               v = gpu_buffer(size_t(pool)), out = gpu_buffer(size_t(total_q) * hq * d * 2),
               k_sf = gpu_buffer(size_t(sf_pool)), v_sf = gpu_buffer(size_t(sf_pool)),
               lse = gpu_buffer(size_t(hq) * total_q * 4), status = gpu_buffer(16),
               pt_d = gpu_buffer(pt.size() * 4), used_d = gpu_buffer(used.size() * 4),
               cu_d = gpu_buffer(cu.size() * 4), q2k_d = gpu_buffer(q2k.size() * 4), scale = gpu_buffer(8),
               k_slot = gpu_buffer(slot_bytes), v_slot = gpu_buffer(slot_bytes),
               q_scale = gpu_buffer(fp8q ? size_t(total_q) * hq * 4 : 0),
               flush = gpu_buffer(size_t(256) << 20);
  if (slot_scales) {
    fill_uniform<<<256, 256, 0, s>>>(static_cast<float*>(k_slot.get()), total_pages * ps, c.seed * 3 + 4, 0.25f, 1.f);
    fill_uniform<<<256, 256, 0, s>>>(static_cast<float*>(v_slot.get()), total_pages * ps, c.seed * 3 + 5, 0.25f, 1.f);
  }
  if (fp8q) {
    fill_fp8<<<2048, 256, 0, s>>>(static_cast<uint8_t*>(q.get()), total_q * hq * d, c.seed * 3 + 1);
    fill_uniform<<<256, 256, 0, s>>>(static_cast<float*>(q_scale.get()), total_q * hq, c.seed * 3 + 6, 0.25f, 1.f);
  } else {
    fill_bf16<<<2048, 256, 0, s>>>(static_cast<__nv_bfloat16*>(q.get()), total_q * hq * d, c.seed * 3 + 1);
  }
  if (fp4) {
    fill_bytes<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(k.get()), pool, c.seed * 3 + 2);
    fill_bytes<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(v.get()), pool, c.seed * 3 + 3);
    fill_e4m3_uniform<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(k_sf.get()), sf_pool, c.seed * 3 + 7, 0.25f, 1.f);
    fill_e4m3_uniform<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(v_sf.get()), sf_pool, c.seed * 3 + 8, 0.25f, 1.f);
  } else if (fp8) {
    fill_fp8<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(k.get()), pool, c.seed * 3 + 2);
    fill_fp8<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(v.get()), pool, c.seed * 3 + 3);
  } else {
    fill_bf16<<<4096, 256, 0, s>>>(static_cast<__nv_bfloat16*>(k.get()), pool / 2, c.seed * 3 + 2);
    fill_bf16<<<4096, 256, 0, s>>>(static_cast<__nv_bfloat16*>(v.get()), pool / 2, c.seed * 3 + 3);
  }
  MSA_BENCH_CUDA(cudaGetLastError());
  scale.upload(std::vector<float>{1.f}, s);
  pt_d.upload(pt, s);
  used_d.upload(used, s);
  cu_d.upload(cu, s);
  q2k_d.upload(q2k, s);

  const Device gpu{DeviceType::cuda, 0};
  const DType kvt = kind.dtype();
  const DecodeShape sh =
      decode_shape(c, B, int(*std::max_element(c.seqlens_q.begin(), c.seqlens_q.end())), max_pages, kvt, o.hnd, gpu);
  const size_t ws_bytes = DecodePlan::workspace_bytes(sh);
  const DeviceBuffer ws = gpu_buffer(ws_bytes);
  const Tensor ws_t(ws.get(), DType::u8, {int64_t(ws_bytes)}, gpu);
  // --warps: a plan of that CTA width, made and run by the backend (DecodePlan has no width
  // argument); 0: DecodePlan with the planner's choice.
  DecodePlan plan;
  cuda::DecodeWork forced;
  if (o.warps) forced = cuda::decode_plan(sh, used.data(), ws_t, s, o.warps);
  else plan.plan(sh, used.data(), ws_t, s);
  AttentionArgs a;
  a.q = Tensor(q.get(), fp8q ? DType::fp8_e4m3 : DType::bf16, {total_q, hq, d}, gpu);
  if (fp8q) a.q_scale = Tensor(q_scale.get(), DType::f32, {total_q, hq}, gpu);
  const std::vector<int64_t> pool_dims = pool_shape(total_pages, ps, hkv, kind.pool_last_dim(d), o.hnd);
  const Tensor kt(k.get(), kvt, pool_dims, gpu), vt(v.get(), kvt, pool_dims, gpu);
  const Tensor sc(scale.get(), DType::f32, {1}, gpu);
  const Tensor ksc = slot_scales ? Tensor(k_slot.get(), DType::f32, {total_pages * ps}, gpu) : sc;
  const Tensor vsc = slot_scales ? Tensor(v_slot.get(), DType::f32, {total_pages * ps}, gpu) : sc;
  a.kv.k = fp8 ? QTensor(kt, ksc) : QTensor(kt);
  a.kv.v = fp8 ? QTensor(vt, vsc) : QTensor(vt);
  if (fp4) {
    const std::vector<int64_t> sf_dims = pool_shape(total_pages, ps, hkv, d / 16, o.hnd);
    a.kv.k = QTensor(kt, Tensor(k_sf.get(), DType::fp8_e4m3, sf_dims, gpu), kind.global);
    a.kv.v = QTensor(vt, Tensor(v_sf.get(), DType::fp8_e4m3, sf_dims, gpu), kind.global);
  }
  a.kv.layout = o.hnd ? KVLayout::paged_hnd : KVLayout::paged_nhd;
  a.kv.page_table = Tensor(pt_d.get(), DType::i32, {B, max_pages}, gpu);
  a.kv.seqused_k = Tensor(used_d.get(), DType::i32, {B}, gpu);
  a.cu_seqlens_q = Tensor(cu_d.get(), DType::i32, {B + 1}, gpu);
  if (!c.dense) a.q2k = Tensor(q2k_d.get(), DType::i32, {hkv, total_q, c.topk}, gpu);
  a.out = Tensor(out.get(), DType::bf16, {total_q, hq, d}, gpu);
  a.lse = Tensor(lse.get(), DType::f32, {hq, total_q}, gpu);
  a.params.kv_block_size = c.kv_block_size;
  a.params.causal = c.causal;
  a.status = Tensor(status.get(), DType::i32, {4}, gpu);
  // One decode: DecodePlan::run, or with --warps the backend's decode_run, the same launch without
  // DecodePlan's host-side argument checks.
  const auto run = [&] {
    if (o.warps) cuda::decode_run(a, sh, forced, ws_t, s);
    else plan.run(a, s);
  };
  clear_status(a.status, s);
  out.poison(s);
  run();
  check_status(a.status, s);
  if (o.check) {
    std::set<int> sample = {0, B / 2, B - 1};
    for (int b : sample) {
      const auto [rel, le] = check_request(b, c, kind, q, &q_scale, k, v, pt, max_pages, cu, q2k, out, lse, total_q, o.hnd,
                                           slot_scales ? &k_slot : nullptr,
                                           slot_scales ? &v_slot : nullptr, &k_sf, &v_sf, s);
      res.rel_l2 = std::max(res.rel_l2, rel);
      res.lse_err = std::max(res.lse_err, le);
    }
    const double tol = fp8 || fp4 ? 3e-2 : 1e-2, tol_lse = fp8 || fp4 ? 3e-2 : 2e-3;
    res.ok = res.rel_l2 <= tol && res.lse_err <= tol_lse;
  }
  const bench::Timing t = bench::time_op(run, o.warmup, o.iters, s, &flush,
                                         (c.name + " " + res.kv).c_str());
  // The host time of one run() (issue budget: 30 us), each on a drained stream.
  const bench::HostTiming h = bench::time_host(run, std::max(o.iters, 50), s);
  check_status(a.status, s);
  res.host_us = h.median_us;
  res.host_min_us = h.min_us;
  res.median_us = t.median * 1e3;
  res.min_us = t.min * 1e3;
  res.max_us = t.max * 1e3;
  cudaStreamDestroy(s);
  return res;
}

}  // namespace

int msa_bench::run_decode_bench(std::vector<std::string> names, const DecodeBenchOptions& o) {
  using namespace msa;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_decode: no CUDA device\n");
    return 2;
  }
  if (names.empty())
    for (const auto& c : bench::bench_cases())
      if (c.kind == bench::CaseKind::decode) names.push_back(c.name);
  int rc = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    std::fprintf(stderr, "[case %zu/%zu] %s\n", i + 1, names.size(), n.c_str());
    const bench::BenchCase* found = bench::find_case(n);
    if (!found || found->kind != bench::CaseKind::decode) {
      std::fprintf(stderr, "unknown decode case %s\n", n.c_str());
      rc = 2;
      continue;
    }
    bench::BenchCase custom = *found;  // --topk: the same case with another selection size
    if (o.topk > 0 && !custom.dense) custom.topk = o.topk;
    const bench::BenchCase* c = &custom;
    for (const char* kv : {"bf16", "fp8", "fp8q", "nvfp4"}) {
      if (!bench::has_dtype(c->kv_dtypes, kv)) continue;
      try {
        const Result r = run_case(*c, kv, o);
        const double tbs = r.bytes / (r.median_us * 1e-6) / 1e12;
        std::printf("%-14s %-4s %-70s median %9.1f us [%9.1f, %9.1f]  %6.3f TB/s  (%.3f GB)  host %.1f us (min %.1f)  check rel_l2 %.2e lse %.2e %s\n",
                    r.name.c_str(), kv, (bench::describe_shape(*c) + (o.hnd ? " hnd" : "") + (o.warps ? " w" + std::to_string(o.warps) : "") + (o.slot_scales && std::string(kv) != "bf16" ? " slot-scales" : "") + (bench::flush_reads() ? " read-flush" : "")).c_str(), r.median_us, r.min_us,
                    r.max_us, tbs, r.bytes / 1e9, r.host_us, r.host_min_us, r.rel_l2, r.lse_err, r.ok ? "ok" : "FAILED");
        std::fflush(stdout);
        if (!r.ok) rc = std::max(rc, 1);
        if (!o.json.empty()) {
          bench::Json rec = bench::new_record(r.name, "decode");
          bench::add_shape(rec, *c);
          rec["layout"] = o.hnd ? "hnd" : "nhd";
          if (o.warps) rec["cta_warps"] = o.warps;
          const KVKind kind(kv);
          bench::add_dtypes(rec, kind.fp8q ? "fp8_e4m3" : "bf16",
                            kind.fp4 ? "fp4x2" : kind.fp8 ? "fp8_e4m3" : "bf16",
                            kind.fp4 ? "nvfp4" : kind.fp8 ? (o.slot_scales ? "slot" : "tensor") : "");
          const bool fp8q = kind.fp8q;
          if (fp8q) rec["q_scales"] = "token_head";
          bench::add_pairs(rec, r.pairs);
          rec["host_us_median"] = r.host_us;
          rec["host_us_min"] = r.host_min_us;
          bench::add_timing(rec, {r.median_us * 1e-3, r.min_us * 1e-3, r.max_us * 1e-3}, o.iters, o.warmup, r.flop,
                            r.bytes, bench::Metric::tbps);
          bench::add_check(rec, bench::check_result(o.check, r.ok),
                           o.check ? bench::Json{{"out_rel_l2", r.rel_l2}, {"lse_max_abs", r.lse_err}} : bench::Json());
          bench::add_environment(rec, true, bench::flush_name());
          bench::append_record(o.json, rec);
        }
      } catch (const Error& e) {
        std::fprintf(stderr, "%s %s: %s\n", n.c_str(), kv, e.what());
        rc = std::max(rc, 1);
      }
    }
  }
  return rc;
}
